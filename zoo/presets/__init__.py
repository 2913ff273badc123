"""Presets: JSON files in this folder, named after what they reproduce.

A preset has four parts: `description`, `corpus` (name, or a synthetic-language spec),
`model` (keyword arguments of `zoo.AWDLSTM`, `head` included; with `"kind": "zaremba"`
those of `zoo.ZarembaLSTM`) and `training` (batch sizes,
bptt, optimizer and schedule), plus `published` numbers where the preset reproduces a paper.
"""

import pathlib

from zoo.bundled_json import bundled_names, read_bundled_json

_DIR = pathlib.Path(__file__).resolve().parent


def list_presets():
    """Names of the bundled presets."""
    return bundled_names(_DIR)


def load_preset(name):
    """The preset `name` (or a path to a JSON file) as a dict (a fresh copy)."""
    _, preset = read_bundled_json(name, _DIR, "preset", "fix the file or pass another preset.",
                                  "with corpus, model and training parts")
    return preset  # read from its file: a fresh dict each call
