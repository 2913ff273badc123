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
    with open(path) as f:
        return copy.deepcopy(json.load(f))


def from_preset(name, vocab_size=None, **overrides):
    """Build the model of preset `name` (`zoo.AWDLSTM`, or the class its `model.kind`
    names); keyword overrides replace model fields.

    `vocab_size` defaults to the preset's corpus vocabulary size (`corpus.vocab_size`).
    Training fields the model owns (`bptt`, `clip_norm`, `weight_decay`, `seed`,
    `flooding_level`) come from the preset's `training` part unless overridden (as
    `python -m zoo.train` builds it: `zoo.runs.builders.build_model`).
    """
    from zoo.runs.builders import build_model

    preset = load_preset(name)
    if vocab_size is None:
        vocab_size = preset.get("corpus", {}).get("vocab_size")
    if vocab_size is None:
        raise ConfigError(f"Preset {name!r} does not fix the vocabulary size; pass "
                          "vocab_size=.")
    return build_model(preset, vocab_size, **overrides)
