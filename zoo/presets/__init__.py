"""Presets: JSON files in this folder, named after what they reproduce.

A preset has four parts: `description`, `corpus` (name, or a synthetic-language spec),
`model` (keyword arguments of `zoo.AWDLSTM`, `head` included; with `"kind": "zaremba"`
those of `zoo.ZarembaLSTM`) and `training` (batch sizes,
bptt, optimizer and schedule), plus `published` numbers where the preset reproduces a paper.
"""

import copy
import json
import pathlib

from zoo.errors import ConfigError

_DIR = pathlib.Path(__file__).resolve().parent


def list_presets():
    """Names of the bundled presets."""
    return sorted(p.stem for p in _DIR.glob("*.json"))


def load_preset(name):
    """The preset `name` (or a path to a JSON file) as a dict (a fresh copy)."""
    path = pathlib.Path(name)
    if path.suffix != ".json" or not path.exists():
        path = _DIR / f"{name}.json"
    if not path.exists():
        raise ConfigError(f"Unknown preset {name!r}; available: "
                          f"{', '.join(list_presets())} (or pass a path to a preset JSON "
                          "file).")
    try:
        with open(path, encoding="utf-8") as f:
            preset = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ConfigError(f"preset file {path} is not valid JSON ({err}); fix the file or "
                          "pass another preset.") from err
    except OSError as err:
        raise ConfigError(f"preset file {path} cannot be read ({err.strerror or err}).") from err
    if not isinstance(preset, dict):
        raise ConfigError(f"preset file {path} holds a JSON {type(preset).__name__}, not an "
                          "object with corpus, model and training parts.")
    return copy.deepcopy(preset)
