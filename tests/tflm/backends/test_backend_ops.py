"""The small tensor operations behind the backend seam (`tflm.backends.base.Backend`):
each backend's against NumPy, values and gradients, on TensorFlow, JAX and PyTorch."""

import json

import pytest

from tests.backends import run_in_backend

CHECK = r"""
import json
import numpy as np
from keras import ops
from tflm import backends
from tflm.backends.autodiff import value_and_vjp
rng = np.random.default_rng(3)
errors = {}

# pick_targets: log_probs[..., targets] and its scattered gradient
log_probs = rng.normal(size=(3, 5, 11)).astype("float32")
targets = rng.integers(0, 11, (3, 5)).astype("int32")
cotangent = rng.normal(size=(3, 5)).astype("float32")
pick = lambda p: [backends.current().pick_targets(p[0], ops.convert_to_tensor(targets))]
values, grads = value_and_vjp(pick, [ops.convert_to_tensor(log_probs)],
                              [ops.convert_to_tensor(cotangent)])
want_grad = np.zeros_like(log_probs)
np.put_along_axis(want_grad, targets[..., None], cotangent[..., None], -1)
errors["pick"] = [
    float(np.abs(ops.convert_to_numpy(values[0])
                 - np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]).max()),
    float(np.abs(ops.convert_to_numpy(grads[0]) - want_grad).max())]

# linear: x W^T + b, with W (out, in), and its gradients
x = rng.normal(size=(3, 5, 4)).astype("float32")
w = rng.normal(size=(7, 4)).astype("float32")
b = rng.normal(size=(7,)).astype("float32")
g = rng.normal(size=(3, 5, 7)).astype("float32")
linear = lambda p: [backends.current().linear(p[0], p[1], p[2])]
values, grads = value_and_vjp(linear, [ops.convert_to_tensor(a) for a in (x, w, b)],
                              [ops.convert_to_tensor(g)])
want = [x @ w.T + b, g @ w, np.einsum("bto,bti->oi", g, x), g.sum((0, 1))]
got = [values[0], *grads]
errors["linear"] = [float(np.abs(ops.convert_to_numpy(a) - e).max()) for a, e in zip(got, want)]
no_bias = backends.current().linear(ops.convert_to_tensor(x), ops.convert_to_tensor(w))
errors["linear_no_bias"] = float(np.abs(ops.convert_to_numpy(no_bias) - x @ w.T).max())
print(json.dumps(errors))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_backend_ops_against_numpy(backend):
    """`pick_targets` (TensorFlow's own gather, the others Keras' take_along_axis) exactly;
    `linear` (PyTorch's fused addmm, the others matmul + bias) to float32 rounding."""
    errors = json.loads(run_in_backend(backend, CHECK).strip().splitlines()[-1])
    assert errors["pick"] == [0.0, 0.0]
    assert max(errors["linear"]) < 1e-5 and errors["linear_no_bias"] < 1e-5
