"""Resolving a run's configuration: preset, then command-line flags, then `--set` overrides.

The result is the dict `config.json` holds; `zoo.runs.settings.RunSettings.from_config`
checks it and reads it into the typed settings a run uses."""

import json

from zoo.errors import ConfigError
from zoo.presets import load_preset
from zoo.runs.settings import SECTIONS


def parse_value(text):
    """`--set` values are JSON when they parse as JSON (numbers, true, null, lists, dicts),
    else plain strings."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_override(config, assignment):
    """Apply one `key=value`: `model.dropout=0.3`, `training.lr=20`, or a bare key found in
    exactly one section (`lr=20`). Nested keys use dots (`model.head.num_experts=15`)."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects key=value; got {assignment!r}.")
    key, text = assignment.split("=", 1)
    path = key.strip().split(".")
    if path[0] not in SECTIONS:
        owners = [s for s in SECTIONS if isinstance(config.get(s), dict) and path[0] in config[s]]
        if len(owners) != 1:
            where = "several sections" if owners else "no section"
            raise ConfigError(
                f"--set {key}: the key is in {where} of the preset; prefix it with one of "
                f"{', '.join(SECTIONS)} (e.g. training.{key}).")
        path = [owners[0]] + path
    node = config
    for part in path[:-1]:
        if not isinstance(node.setdefault(part, {}), dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section.")
        node = node[part]
    node[path[-1]] = parse_value(text)
    return config


def resolve_config(preset="synthetic", overrides=(), **flags):
    """Preset dict with flags (None = keep) and `--set` overrides applied, in that order."""
    config = load_preset(preset)
    config["preset"] = preset
    for section in SECTIONS:
        config.setdefault(section, {})
    corpus = flags.pop("corpus", None)
    if corpus is not None and corpus != config["corpus"].get("name"):
        config["corpus"] = {"name": corpus}
    head = flags.pop("head", None)
    if head is not None:
        current = config["model"].get("head") or {}
        current = {"type": current} if isinstance(current, str) else dict(current)
        config["model"]["head"] = current if current.get("type") == head else {"type": head}
    for key, value in flags.items():
        if value is not None:
            config["training"][key] = value
    for assignment in overrides:
        apply_override(config, assignment)
    return config
