"""`tflm.backends.jax_target_log_probs`: the targets' log-probabilities, chunk by chunk up
to a window's extent, and their written backward pass, against NumPy; and the JAX train
step that uses them gives the full softmax's update."""

import json

import pytest

from tests.backends import run_in_backend

# The windows and cotangents a chunked pick is checked on (here and in
# test_jax_mixture_target_log_probs.py).
CHUNKED_CASES = r"""
import numpy as np
import jax.numpy as jnp
from tflm.backends import extent_loop

# (batch, time, real lengths per row or None, bias): chunks of ROWS / batch positions that
# do not divide the window (the last one overlaps), rows of different lengths, a window
# that is all padding, one shorter than a chunk
extent_loop.ROWS = 8
WINDOWS = {"unpadded": (3, 7, None, True), "trailing": (2, 11, [6, 3], True),
           "ragged": (3, 9, [9, 2, 5], False), "all padded": (2, 5, [0, 0], True),
           "under a chunk": (2, 9, [3, 1], True)}


def padding_mask(B, T, lengths):
    return None if lengths is None else np.arange(T)[None] < np.array(lengths)[:, None]


# The largest |ours - NumPy| of the values (at the real positions) and of the gradients,
# for each cotangent g: a training loss's (a scalar times the real positions' weights: the
# sums of the forward pass), and any other (the backward pass's own loop): padded positions
# carry no gradient in the first two, some in the third. `picked_and_grads(g)`: (values,
# gradients); `reference(g)`: (values, *gradients), None for a gradient not taken.
def errors_over_cotangents(rng, mask, real, picked_and_grads, reference):
    B, T = real.shape
    stray = rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.3)
    # the outputs past the extent are constant 0: no gradient flows through them
    extent = T if mask is None else int(np.max(np.where(real.any(0), np.arange(1, T + 1), 0)))
    out = {}
    for kind, g in {"along the mask": -0.37 * real, "random": rng.normal(size=(B, T)) * real,
                    "random, padding too": rng.normal(size=(B, T)) * real + stray}.items():
        picked, grads = picked_and_grads(jnp.asarray(g, jnp.float32))
        want = reference(g * (np.arange(T) < extent))
        errors = [float(np.max(np.abs(np.asarray(picked) - want[0]) * real, initial=0.0))]
        errors += [float(np.max(np.abs(np.asarray(got) - w)))
                   for got, w in zip(grads, want[1:]) if w is not None]
        out[kind] = max(errors)
    return out
"""

CHECK = CHUNKED_CASES + r"""
import json
import jax
from tflm.backends import jax_target_log_probs as picks

def reference(h, W, b, y, g):
    logits = h @ W.T + (0 if b is None else b)
    logits = logits - logits.max(-1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, y[..., None], -1)[..., 0]
    d_logits = (np.eye(W.shape[0])[y] - np.exp(log_p)) * g[..., None]
    d_b = None if b is None else d_logits.sum((0, 1))
    return picked, d_logits @ W, np.einsum("btv,btd->vd", d_logits, h), d_b

rng = np.random.default_rng(3)
V, d = 37, 6
result = {}
for name, (B, T, lengths, with_bias) in WINDOWS.items():
    h = rng.normal(size=(B, T, d))
    W = rng.normal(size=(V, d))
    b = rng.normal(size=V) if with_bias else None
    y = rng.integers(0, V, (B, T))
    mask = padding_mask(B, T, lengths)
    real = np.ones((B, T), bool) if mask is None else mask
    args = [jnp.asarray(a, jnp.float32) for a in (h, W)] + [
        None if b is None else jnp.asarray(b, jnp.float32)]

    def run(h, W, b, g):
        picked, vjp = jax.vjp(lambda h, W, b: picks.target_log_probs(
            h, W, b, jnp.asarray(y), None if mask is None else jnp.asarray(mask)), h, W, b)
        return picked, vjp(g)

    errors = errors_over_cotangents(rng, mask, real, lambda g: jax.jit(run)(*args, g),
                                    lambda g: reference(h, W, b, y, g))
    result.update({f"{name}, {kind}": error for kind, error in errors.items()})
print(json.dumps(result))
"""


def test_target_log_probs_and_gradients_against_numpy():
    result = json.loads(run_in_backend("jax", CHECK).strip().splitlines()[-1])
    assert len(result) == 15
    for name, error in result.items():
        assert error < 1e-5, (name, error)


ALONG = r"""
import json
import numpy as np
import jax.numpy as jnp
from tflm.backends.jax_target_log_probs import along_weights

w = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], np.float32)
cases = {
    "scaled mask": (-0.37 * w, 5),
    "zero": (0 * w, 5),
    "fractional weights": (np.float32(2.5) * (w * np.float32(0.3)), 5),
    "a padded position": (-0.37 * w + np.eye(2, 5, 3, dtype=np.float32), 5),
    "past the extent only": (-0.37 * w + np.eye(2, 5, 3, dtype=np.float32), 3),
    "one real position off": (-0.37 * w * np.array([1, 1, 1.01, 1, 1], np.float32), 5),
}
result = {}
for name, (g, extent) in cases.items():
    weights = w * np.float32(0.3) if name == "fractional weights" else w
    alpha, yes = along_weights(jnp.asarray(g, jnp.float32), jnp.asarray(weights), extent)
    result[name] = [bool(yes), float(alpha)]
print(json.dumps(result))
"""


def test_the_backward_pass_reuses_the_forward_sums_only_for_a_cotangent_along_the_weights():
    """`along_weights` decides whether the backward pass scales the forward pass's dW_w,
    db_w (alpha, True) or runs its own loop (False): it must say False for any g that is
    not alpha w before the extent, and True (with the right alpha) for a loss's g."""
    result = json.loads(run_in_backend("jax", ALONG).strip().splitlines()[-1])
    assert result["scaled mask"] == [True, pytest.approx(-0.37)]
    assert result["zero"] == [True, 0.0]
    assert result["fractional weights"] == [True, pytest.approx(2.5)]
    assert result["a padded position"][0] is False
    assert result["past the extent only"] == [True, pytest.approx(-0.37)]
    assert result["one real position off"][0] is False


def test_softmax_layer_target_log_probs_equal_its_log_probs_picked():
    """`SoftmaxLayer.target_log_probs` on the backend in use, tied and untied, against the
    layer's own log-probabilities at the targets; heads it does not compute refuse."""
    import numpy as np
    from keras import ops
    from tflm.layers import SoftmaxLayer, TiedEmbedding
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, 5, 4)).astype("float32")
    y = rng.integers(0, 9, (2, 5)).astype("int32")
    for head in (SoftmaxLayer(embedding=TiedEmbedding(9, 4)), SoftmaxLayer(vocab_size=9)):
        assert head.picks_targets
        full = ops.convert_to_numpy(head(h))
        picked = ops.convert_to_numpy(head.target_log_probs(h, y))
        np.testing.assert_allclose(picked, np.take_along_axis(full, y[..., None], -1)[..., 0],
                                   rtol=1e-5, atol=1e-6)
    for head in (SoftmaxLayer(vocab_size=9, adversarial_alpha=0.005),
                 SoftmaxLayer(vocab_size=9, num_samples=3), SoftmaxLayer(vocab_size=9,
                                                                         output_rank=2)):
        assert not head.picks_targets
        with pytest.raises(ValueError, match="plain softmax"):
            head.target_log_probs(h, y)
