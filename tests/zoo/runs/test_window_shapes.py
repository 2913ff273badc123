"""`zoo.runs.builders.set_window_shapes`: the window-shape settings `python -m zoo.train` and
`tools/compare_frameworks.py` put on a model, on every backend."""

import json

import pytest

from tests.backends import run_in_backend

_CODE = """
import json
from types import SimpleNamespace
from zoo.runs.builders import set_window_shapes
from zoo.runs.settings import TrainingSettings
out = []
for training, pad in [({"bptt": 35}, 4), ({"bptt": 35}, 1), ({"bptt": 70, "max_seq_len": 60}, 4),
                      ({"bptt": 35, "fixed_windows": True}, 4),
                      ({"bptt": 35, "pad_to_compiled_lengths": False}, 1)]:
    model = SimpleNamespace(shortest_compiled_length=None)
    returned = set_window_shapes(model, TrainingSettings.from_dict(training), pad)
    out.append([returned, model.pad_to_compiled_lengths, model.padded_windows,
                model.shortest_compiled_length])
print("RESULT" + json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_window_shapes_per_backend(backend):
    rows = json.loads(run_in_backend(backend, _CODE).split("RESULT", 1)[1])
    jax = backend == "jax"
    assert rows == [
        # random windows of bptt 35 padded to multiples of 4: nearly all fit 53 -> 56
        [True, True, True, 56],
        # unpadded: only JAX's compiled lengths pad a window
        [True, True, jax, 53],
        # the covering length is capped at max_seq_len (70 + 17.5 -> 60)
        [True, True, True, 60],
        # fixed windows: every window is bptt long, no shortest length
        [True, True, True, None],
        # compiled lengths off and no padding: windows are never padded
        [False, False, False, None],
    ]
