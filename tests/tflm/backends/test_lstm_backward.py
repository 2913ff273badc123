"""`tflm.backends.lstm_backward`: the portable LSTM's written-out backward pass gives the
outputs, final state and gradients autodiff of the loop gives, masked and unmasked, on
TensorFlow (in process) and JAX; and the layers use it only where it applies."""

import json

import numpy as np
import pytest

from tests.backends import run_in_backend

CHECK = r"""
import json
import numpy as np
import keras
from keras import ops
from tflm.backends import lstm_backward
from tflm.backends.autodiff import value_and_vjp
from tflm.backends.lstm_kernels import CellWeights, portable_lstm

B, T, F, N = 3, 7, 5, 4
rng = np.random.default_rng(11)
x = rng.normal(size=(B, T, F)).astype("float32")
W = rng.normal(0, 0.7, (F, 4 * N)).astype("float32")
U = rng.normal(0, 0.7, (N, 4 * N)).astype("float32")
b = rng.normal(0, 0.3, 4 * N).astype("float32")
h0 = rng.normal(size=(B, N)).astype("float32")
c0 = rng.normal(size=(B, N)).astype("float32")
cotangents = [rng.normal(size=s).astype("float32") for s in ((B, T, N), (B, N), (B, N))]
masks = {"none": None,
         "padded": np.arange(T)[None, :] < np.array([[7], [5], [2]]),  # padded windows
         "holes": rng.random((B, T)) < 0.6,  # masked first steps too
         # padded to a compiled length: the last steps masked in every sequence
         "trailing": np.arange(T)[None, :] < np.array([[5], [4], [2]]),
         "all masked": np.zeros((B, T), bool)}
masks["holes"][0, :2] = False
cell_of = lambda w, bias: CellWeights(w, bias, keras.activations.tanh,
                                       keras.activations.sigmoid)
result = {}
cases = [("none", None, True)] + [(f"{name} {zero}", mask, zero)
                                  for name, mask in list(masks.items())[1:]
                                  for zero in ("zero", "held")]
# JAX: also the written pass under `jit`, where a masked window's loops run to its traced
# extent (`tflm.backends.extent_loop`) and skip the positions padded in every row.
ways = (False, True) + (("jit",) if keras.backend.backend() == "jax" else ())
if keras.backend.backend() == "jax":
    from tflm.backends import extent_loop
    extent_loop.ROWS = 4  # chunks of 2 positions in the projections: several, one partly past
for name, mask, zero in cases:
    got = {}
    for written in ways:
        def fn(p):
            _, outputs, (h, c) = portable_lstm(cell_of(p[1], p[2]), p[0], [p[4], p[5]], mask,
                                               p[3], written_backward=bool(written),
                                               zero_output_for_mask=zero == "zero")
            return [outputs, h, c]
        run = lambda primals, cots: value_and_vjp(fn, primals, cots)
        if written == "jit":
            import jax
            run = jax.jit(run)
        values, grads = run([ops.convert_to_tensor(a) for a in (x, W, b, U, h0, c0)],
                            [ops.convert_to_tensor(c) for c in cotangents])
        got[written] = [ops.convert_to_numpy(v) for v in list(values) + list(grads)]
    result[name] = max(float(np.max(np.abs(a - w)) / max(1.0, float(np.max(np.abs(a)))))
                       for way in ways[1:] for a, w in zip(got[False], got[way]))
cell = cell_of(W, b)
result["applies"] = [lstm_backward.applies(cell, True, False, False),
                     lstm_backward.applies(cell, False, False, False),
                     lstm_backward.applies(cell, True, True, False),
                     lstm_backward.applies(CellWeights(W, b, keras.activations.relu,
                                                       keras.activations.sigmoid),
                                           True, False, False)]
print(json.dumps(result))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_written_backward_equals_autodiff(backend):
    result = json.loads(run_in_backend(backend, CHECK).strip().splitlines()[-1])
    names = ["none"] + [f"{mask} {output}" for mask in ("padded", "holes", "trailing",
                                                          "all masked")
                          for output in ("zero", "held")]
    for name in names:
        assert result[name] < 2e-5, (name, result[name])
    assert result["applies"] == [True, False, False, False]


def test_layer_takes_it_in_training_only():
    """A WeightDropLSTM window differentiated in a training call runs through the written
    backward; its gradients equal the layer's with the loop differentiated by autodiff."""
    import keras
    from unittest import mock
    from tflm.backends import lstm_backward
    from tflm.layers import WeightDropLSTM
    if keras.backend.backend() not in lstm_backward.BACKENDS:
        pytest.skip("the written backward is for the traced-loop backends")
    layer = WeightDropLSTM(6, weight_dropout=0.0, return_sequences=True, use_cudnn=False)
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32")
    layer(x)
    with mock.patch.object(lstm_backward, "lstm_with_backward",
                           wraps=lstm_backward.lstm_with_backward) as spy:
        layer(x, training=False)
        assert spy.call_count == 0
        layer(x, training=True)
        assert spy.call_count == 1

