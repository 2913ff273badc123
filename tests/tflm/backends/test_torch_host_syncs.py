"""Keras on PyTorch: what a train step of the AWD-LSTM preset asks of the host. On a GPU
each read of a value back to the host (`aten::_local_scalar_dense`) and each tensor made of
host data (`aten::lift_fresh`, then a copy to the device) waits for the kernels queued
before it. Counted on the CPU, where the same ops run; the step trains as before, bit for
bit."""

import pytest

from tests.tflm.backends.test_torch_seeds import run_counted

pytest.importorskip("torch")


def test_an_awd_lstm_train_step_draws_its_masks_without_syncing_and_trains_as_keras():
    """A train step of the preset's model (embedding, input, hidden and output dropouts,
    three DropConnect masks), once through `TorchBackend.uniform` and once through
    `keras.random.uniform` (the base `Backend.uniform`): the same weights after two steps,
    bit for bit; Keras' draws read 8 scalars back and make 8 tensors of host data a step,
    ours none of either. Of the step's tensors of host data, two are left, both Keras' own:
    the optimizer's iteration count (`assign_add(1)`) and its `Mean` metric's count; tflm's
    numbers (rates, 1.0 floors, the padding id) are made once (`Backend.constant`)."""
    out = run_counted("""
import json
import numpy as np, keras
from tflm.backends.base import Backend
from tflm.backends.torch_backend import TorchBackend
from zoo.runs.builders import build_model, make_optimizer
from zoo.runs.config import load_preset
from zoo.runs.settings import RunSettings

def two_steps():
    cfg = load_preset("awd_lstm_ptb")
    cfg["model"].update(embed_dim=6, hidden_dim=8)
    settings = RunSettings.from_config(cfg)
    keras.utils.set_random_seed(3)
    model = build_model(settings, 30)
    model.compile(optimizer=make_optimizer(settings.training))
    model.build((None, None))
    x = np.random.default_rng(0).integers(0, 30, (4, 9))
    batch = (keras.ops.convert_to_tensor(x[:, :-1]), keras.ops.convert_to_tensor(x[:, 1:]))
    model.train_step(batch)
    counter = Count()
    with counter:
        model.train_step(batch)
    return counter.ops, [w.tolist() for w in model.get_weights()]

ours, ours_weights = two_steps()
TorchBackend.uniform = Backend.uniform
keras_ops, keras_weights = two_steps()
print("RESULT" + json.dumps({"same": ours_weights == keras_weights,
                             "ours": dict(ours), "keras": dict(keras_ops)}))
""")
    ours, theirs = out["ours"], out["keras"]
    assert out["same"]
    assert ours["rand"] == theirs["rand"] == 8  # the eight masks, drawn in the counted step
    assert theirs["_local_scalar_dense"] == 8 and ours.get("_local_scalar_dense", 0) == 0
    assert ours["lift_fresh"] == theirs["lift_fresh"] - 8
    assert ours["lift_fresh"] <= 2


def test_a_constant_is_made_once_and_is_what_keras_ops_make():
    out = run_counted("""
import json
import keras, torch
from tflm import backends

backend = backends.current()
x16 = torch.zeros(3, dtype=torch.bfloat16)
ints = keras.ops.convert_to_tensor([1, 2], "int32")
variable = keras.Variable(0.0, dtype="float64")
cases = [(0.6, x16), (1.0, variable), (-1, ints), (0.6, torch.zeros(2))]
made = [backend.constant(value, like) for value, like in cases]
counter = Count()
with counter:
    again = [backend.constant(value, like) for value, like in cases]
keras_made = [keras.ops.cast(value, keras.backend.standardize_dtype(like.dtype))
              for value, like in cases]
print("RESULT" + json.dumps({
    "reused": [a is b for a, b in zip(made, again)],
    "ops": sum(counter.ops.values()),
    "equal": [bool(m.dtype == k.dtype and m.shape == k.shape and bool((m == k).all()))
              for m, k in zip(made, keras_made)],
    "dtypes": [str(m.dtype) for m in made],
    "tensor": backend.constant(keras.ops.convert_to_tensor(2.0), ints).tolist()}))
""")
    assert out["reused"] == [True] * 4 and out["ops"] == 0
    assert out["equal"] == [True] * 4
    assert out["dtypes"] == ["torch.bfloat16", "torch.float64", "torch.int32",
                             "torch.float32"]
    assert out["tensor"] == 2  # a tensor value: cast, not cached


def test_averaged_sgd_steps_read_no_count_back_and_see_an_outside_rewind():
    """AveragedSGD decides on the host whether a step is averaged (`Backend.host_scalar`):
    no read a step, before or after averaging starts; an outside write of its iteration
    count (a rewind) is read, and the rewound step leaves the averages alone."""
    out = run_counted("""
import json
import numpy as np, keras
from tflm.optimizers import AveragedSGD
from zoo.runs.builders import build_model
from zoo.runs.config import load_preset
from zoo.runs.settings import RunSettings

cfg = load_preset("awd_lstm_ptb")
cfg["model"].update(embed_dim=6, hidden_dim=8)
keras.utils.set_random_seed(3)
model = build_model(RunSettings.from_config(cfg), 30)
optimizer = AveragedSGD(2.0, start_averaging=2)
model.compile(optimizer=optimizer)
model.build((None, None))
x = np.random.default_rng(0).integers(0, 30, (4, 9))
batch = (keras.ops.convert_to_tensor(x[:, :-1]), keras.ops.convert_to_tensor(x[:, 1:]))
model.train_step(batch)  # iteration 0: the host reads both counts once
reads = []
for _ in range(4):  # iterations 1 (SGD), 2, 3, 4 (averaged)
    counter = Count()
    with counter:
        model.train_step(batch)
    reads.append(counter.ops["_local_scalar_dense"])
count = optimizer.average_count
averages = [keras.ops.convert_to_numpy(a).copy() for a in optimizer.average_variables
            if a is not None]
optimizer.iterations.assign(0)  # rewound: this step is not averaged
model.train_step(batch)
after = [keras.ops.convert_to_numpy(a) for a in optimizer.average_variables if a is not None]
print("RESULT" + json.dumps({
    "reads": reads, "count": count, "count_after": optimizer.average_count,
    "averages_kept": all(bool((a == b).all()) for a, b in zip(averages, after))}))
""")
    assert out["reads"] == [0, 0, 0, 0]
    assert out["count"] == 3 and out["count_after"] == 3
    assert out["averages_kept"]
