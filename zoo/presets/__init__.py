"""Presets: JSON files in this folder, named after what they reproduce.

A preset has four parts: `description`, `corpus` (name, or a synthetic-language spec),
`model` (keyword arguments of `zoo.AWDLSTM`, `head` included) and `training` (batch sizes,
bptt, optimizer and schedule), plus `published` numbers where the preset reproduces a paper.
"""

import copy
import json
import pathlib

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
        raise ValueError(f"Unknown preset {name!r}; available: {', '.join(list_presets())} "
                         "(or pass a path to a preset JSON file).")
    with open(path) as f:
        return copy.deepcopy(json.load(f))


def from_preset(name, vocab_size=None, **overrides):
    """Build the `zoo.AWDLSTM` of preset `name`; keyword overrides replace model fields.

    `vocab_size` defaults to the preset's corpus vocabulary size (`corpus.vocab_size`).
    Training fields the model owns (`bptt`, `clip_norm`, `weight_decay`) come from the
    preset's `training` part unless overridden.
    """
    from zoo.awd_lstm import AWDLSTM

    preset = load_preset(name)
    model_kwargs = dict(preset["model"])
    training = preset.get("training", {})
    for key in ("bptt", "clip_norm", "weight_decay"):
        if key in training:
            model_kwargs.setdefault(key, training[key])
    if "seed" in training:
        model_kwargs.setdefault("seed", training["seed"])
    model_kwargs.update(overrides)
    if vocab_size is None:
        vocab_size = preset.get("corpus", {}).get("vocab_size")
    if vocab_size is None:
        raise ValueError(f"Preset {name!r} does not fix the vocabulary size; pass vocab_size=.")
    return AWDLSTM(vocab_size=int(vocab_size), **model_kwargs)
