"""PyTorch's dropout draws (`TorchBackend.uniform`, `tflm.backends.torch_host_copies`): Keras'
numbers and seed states bit for bit, the device state read only when something else wrote
it (weights loaded, `assign`, a stateless scope). The train step they are part of:
tests/tflm/backends/test_torch_host_syncs.py."""

import json

import pytest

from tests.backends import run_in_backend

pytest.importorskip("torch")

# Counts the aten ops of a block that read a tensor back to the host (`item`, `int()`,
# `tolist` of one value: aten::_local_scalar_dense) and that make a tensor of host data
# (aten::lift_fresh: on a GPU, a copy to the device and a wait for it).
_COUNT = """
import collections
from torch.utils._python_dispatch import TorchDispatchMode

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))
"""


def run_counted(code):
    """`code` under PyTorch with `Count` defined; the JSON it prints after RESULT."""
    out = run_in_backend("torch", _COUNT + code)
    return json.loads(out.split("RESULT", 1)[1])


def test_draws_equal_keras_and_read_the_device_only_after_an_outside_write():
    out = run_counted("""
import json
import keras, numpy as np
from tflm import backends

ours, theirs = keras.random.SeedGenerator(11), keras.random.SeedGenerator(11)
draw = backends.current().uniform
shapes = [(3, 5), (7,), (2, 3, 4), (3, 5)]
same, reads, made = [], [], []
for shape in shapes:
    counter = Count()
    with counter:
        a = draw(shape, ours)
    reads.append(counter.ops["_local_scalar_dense"])
    made.append(counter.ops["lift_fresh"])
    b = keras.random.uniform(shape, seed=theirs)
    same.append(bool((a.numpy() == b.numpy()).all()) and a.dtype == b.dtype
                and tuple(a.shape) == shape)
states = [ours.state.numpy().tolist(), theirs.state.numpy().tolist()]

# written from outside: assign, then a state at the int32 edge (b + 1 wraps)
after = []
for value in ([7, 3], [2**31 - 1, 2**31 - 1]):
    ours.state.assign(np.array(value, "int32"))
    theirs.state.assign(np.array(value, "int32"))
    for _ in range(2):
        a, b = draw((4, 4), ours), keras.random.uniform((4, 4), seed=theirs)
        after.append(bool((a.numpy() == b.numpy()).all()))
    after.append(ours.state.numpy().tolist() == theirs.state.numpy().tolist())
edge = ours.state.numpy().tolist()

# a stateless scope's state, then the variable's own again
scoped = {}
with keras.StatelessScope(state_mapping=[(ours.state, np.array([5, 0], "int32"))]) as scope:
    scoped["ours"] = draw((6,), ours).numpy()
    scoped["state"] = keras.ops.convert_to_numpy(scope.get_current_value(ours.state)).tolist()
with keras.StatelessScope(state_mapping=[(theirs.state, np.array([5, 0], "int32"))]):
    scoped["theirs"] = keras.random.uniform((6,), seed=theirs).numpy()
unchanged = ours.state.numpy().tolist() == edge
a, b = draw((6,), ours), keras.random.uniform((6,), seed=theirs)
print("RESULT" + json.dumps({
    "same": same, "reads": reads, "made": made, "states": states, "after": after,
    "edge": edge, "scoped_same": bool((scoped["ours"] == scoped["theirs"]).all()),
    "scoped_state": scoped["state"], "unchanged": unchanged,
    "after_scope": bool((a.numpy() == b.numpy()).all())}))
""")
    assert out["same"] == [True] * 4
    assert out["reads"][1:] == [0, 0, 0] and out["made"][1:] == [0, 0, 0]
    assert out["states"][0] == out["states"][1] == [11, 4]
    assert out["after"] == [True] * 6
    assert out["edge"] == [2**31 - 1, -2**31 + 1]  # b wrapped as int32 addition does
    assert out["scoped_same"] and out["scoped_state"] == [5, 1]
    assert out["unchanged"] and out["after_scope"]


def test_normal_draws_equal_keras_without_reading_the_device():
    """`TorchBackend.normal` (the embedding noise's draws): `keras.random.normal`'s numbers
    and seed state, in float32 and bfloat16, the seed from the host copy."""
    out = run_counted("""
import json
import keras
from tflm import backends

ours, theirs = keras.random.SeedGenerator(5), keras.random.SeedGenerator(5)
same, reads, made = [], [], []
for shape, dtype in [((3, 5), "float32"), ((2, 3, 4), "bfloat16"), ((7,), "float32")]:
    counter = Count()
    with counter:
        a = backends.current().normal(shape, ours, dtype)
    reads.append(counter.ops["_local_scalar_dense"])
    made.append(counter.ops["lift_fresh"])
    b = keras.random.normal(shape, dtype=dtype, seed=theirs)
    same.append(bool((a == b).all()) and a.dtype == b.dtype and tuple(a.shape) == shape)
print("RESULT" + json.dumps({"same": same, "reads": reads, "made": made,
                             "states": [ours.state.numpy().tolist(),
                                        theirs.state.numpy().tolist()]}))
""")
    assert out["same"] == [True] * 3
    assert out["reads"][1:] == [0, 0] and out["made"][1:] == [0, 0]
    assert out["states"][0] == out["states"][1] == [5, 3]
