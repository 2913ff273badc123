"""A bundled JSON file by name, or any JSON file by path: what `zoo.presets` and
`zoo.studies` read (a folder of `<name>.json` objects shipped with the package)."""

import json
import pathlib

from zoo.errors import ConfigError


def bundled_names(folder):
    """Names of the `*.json` files in `folder`."""
    return sorted(p.stem for p in pathlib.Path(folder).glob("*.json"))


def read_bundled_json(name, folder, kind, fix, holds):
    """(path, the JSON object) of `name`: a path to a `.json` file, else `folder/<name>.json`.
    A `ConfigError` names what is wrong: an unknown name (listing the bundled ones), a file
    that is not JSON (`fix` says what to do), cannot be read, or is not an object (`holds`
    says what it should hold); `kind` ("preset", "study") names the file in each."""
    path = pathlib.Path(name)
    if path.suffix != ".json" or not path.exists():
        path = pathlib.Path(folder) / f"{name}.json"
    if not path.exists():
        raise ConfigError(f"Unknown {kind} {name!r}; available: "
                          f"{', '.join(bundled_names(folder))} (or pass a path to a {kind} "
                          "JSON file).")
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{kind} file {path} is not valid JSON ({err}); {fix}") from err
    except OSError as err:
        raise ConfigError(f"{kind} file {path} cannot be read ({err.strerror or err}).") from err
    if not isinstance(value, dict):
        raise ConfigError(f"{kind} file {path} holds a JSON {type(value).__name__}, not an "
                          f"object {holds}.")
    return path, value
