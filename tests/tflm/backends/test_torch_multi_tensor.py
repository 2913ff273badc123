"""PyTorch's train step updates all variables at once (`torch._foreach_*` through
`tflm.compat`): the clip norm, the scaled and decayed gradients and the SGD / averaged-SGD
updates are those of the per-variable path, and the multi-tensor path is the one taken."""

import json

import pytest

from tests.backends import run_in_backend

pytest.importorskip("torch")

# A small AWD-LSTM (weight drop, every dropout, AR / TAR, weight decay, clipping) trained
# for a few steps; `PER_VARIABLE` switches the multi-tensor path off, `COUNT` counts the
# multi-tensor kernels used.
_TRAIN = """
import json, os
import numpy as np, keras
from tflm import backends, compat
from tflm.backends.base import Backend
from tflm.backends.torch_backend import TorchBackend
from tflm.optimizers import SGD, AveragedSGD
from zoo.runs.builders import build_model
from zoo.runs.config import load_preset
from zoo.runs.settings import RunSettings

calls = {"norm": 0, "mul": 0, "add_": 0, "sub_": 0}
for key in calls:
    name = "torch_foreach_" + key
    original = getattr(compat, name)
    def counted(*args, _f=original, _k=key):
        calls[_k] += 1
        return _f(*args)
    setattr(compat, name, counted)
if PER_VARIABLE:
    TorchBackend.updates_together = lambda self, variables, gradients: False
    TorchBackend.scale_and_decay = Backend.scale_and_decay
    TorchBackend.global_norm = Backend.global_norm

cfg = load_preset("awd_lstm_ptb")
cfg["model"].update(embed_dim=6, hidden_dim=8)
cfg["training"]["weight_decay"] = WEIGHT_DECAY
keras.utils.set_random_seed(3)
model = build_model(RunSettings.from_config(cfg), 30)
model.build()
if OPTIMIZER == "sgd":
    optimizer = SGD(2.0, learning_rate_multipliers={"embedding": 0.5})
else:
    optimizer = AveragedSGD(2.0, start_averaging=2)
model.compile(optimizer=optimizer)
rng = np.random.default_rng(0)
x = rng.integers(0, 30, (4, 9))
logs = [model.train_on_batch(x[:, :-1], x[:, 1:], return_dict=True) for _ in range(4)]
out = {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
       "grad_norm": [float(l["grad_norm"]) for l in logs if "grad_norm" in l],
       "calls": calls}
if OPTIMIZER == "asgd":
    out["averages"] = [np.asarray(keras.ops.convert_to_numpy(a)).tolist()
                       for a in optimizer.average_variables if a is not None]
print("RESULT" + json.dumps(out))
"""


def _train(optimizer, per_variable, weight_decay=1.2e-6):
    code = (f"PER_VARIABLE = {per_variable}\nOPTIMIZER = {optimizer!r}\n"
            f"WEIGHT_DECAY = {weight_decay!r}\n" + _TRAIN)
    out = run_in_backend("torch", code)
    return json.loads(out.split("RESULT", 1)[1])


@pytest.mark.parametrize("optimizer", [pytest.param("sgd", marks=pytest.mark.slow), "asgd"])
def test_multi_tensor_step_equals_the_per_variable_step(optimizer):
    """Four training steps (dropout on, same seed) give the same weights, averages and
    gradient norms either way, to float32 rounding: the total norm is summed in another
    order (per-tensor norms, as torch.nn.utils.clip_grad_norm_), so clipping factors may
    differ in the last bit."""
    import numpy as np
    fused, loop = _train(optimizer, False), _train(optimizer, True)
    assert fused["calls"]["norm"] == 4 and fused["calls"]["sub_"] >= 2, fused["calls"]
    assert loop["calls"] == {"norm": 0, "mul": 0, "add_": 0, "sub_": 0}
    np.testing.assert_allclose(fused["grad_norm"], loop["grad_norm"], rtol=1e-5)
    for a, b in zip(fused["weights"], loop["weights"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    if optimizer == "asgd":
        # steps 1-2 before averaging: together; steps 3-4 average: per variable
        assert fused["calls"]["sub_"] == 2, fused["calls"]
        for a, b in zip(fused["averages"], loop["averages"]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    else:  # two multiplier groups (embedding 0.5, the rest 1.0) per step
        assert fused["calls"]["sub_"] == 8, fused["calls"]


_PARTS = """
import json
import numpy as np, keras, torch
from tflm import backends
from tflm.backends.base import Backend
from tflm.optimizers import SGD
rng = np.random.default_rng(5)
grads = [rng.normal(size=s).astype("float32") for s in ((3, 4), (5,), (2, 2, 2))]
values = [rng.normal(size=g.shape).astype("float32") for g in grads]
backend = backends.current()
t = [torch.tensor(g) for g in grads]
norm = float(backend.global_norm(t))
factor, decay = torch.tensor(0.37), torch.tensor(1e-3)
variables = [keras.Variable(v) for v in values]
with torch.no_grad():  # as in the train step
    scaled = [g.numpy() for g in backend.scale_and_decay(t, factor, decay, variables)]
    plain = [g.numpy() for g in Backend.scale_and_decay(backend, t, factor, decay, variables)]
with_none = backend.scale_and_decay([t[0], None, t[2]], factor, None, None)
sgd = SGD(0.5, learning_rate_multipliers={"b": 0.1})
named = [keras.Variable(v, name=n) for v, n in zip(values, "abc")]
sgd.apply([torch.tensor(g) for g in grads], named)
print("RESULT" + json.dumps({
    "norm": norm, "scaled": [s.tolist() for s in scaled], "plain": [p.tolist() for p in plain],
    "none_kept": with_none[1] is None, "after_sgd": [np.asarray(v).tolist() for v in named]}))
"""


def test_multi_tensor_parts_equal_numpy():
    """The global norm, `g * factor + decay * v` and the SGD update with a multiplier against
    NumPy on random inputs; a None gradient stays None."""
    import numpy as np
    out = json.loads(run_in_backend("torch", _PARTS).split("RESULT", 1)[1])
    rng = np.random.default_rng(5)
    grads = [rng.normal(size=s).astype("float32") for s in ((3, 4), (5,), (2, 2, 2))]
    values = [rng.normal(size=g.shape).astype("float32") for g in grads]
    want_norm = np.sqrt(sum(float((g.astype("float64") ** 2).sum()) for g in grads))
    assert out["norm"] == pytest.approx(want_norm, rel=1e-6)
    f, d = np.float32(0.37), np.float32(1e-3)
    for got, plain, g, v in zip(out["scaled"], out["plain"], grads, values):
        want = g * f + d * v
        np.testing.assert_array_equal(np.asarray(got, "float32"), want)  # same arithmetic
        np.testing.assert_array_equal(np.asarray(plain, "float32"), want)
    assert out["none_kept"]
    for got, g, v, m in zip(out["after_sgd"], grads, values, (1.0, 0.1, 1.0)):
        rate = np.float32(0.5) * np.float32(m) if m != 1.0 else np.float32(0.5)
        np.testing.assert_array_equal(np.asarray(got, "float32"), v - g * rate)
