"""The targets' log-probabilities under a softmax output layer, chunk by chunk (JAX).

Training needs only log P(y_t | c_t) of each position's target, not the `(batch, time, V)`
log-probabilities:

    l = h W^T + b,   log P(y | c) = l_y - logsumexp(l)

`target_log_probs` computes it for a few positions at a time (`ROWS` rows of the
flattened batch x time a chunk), and its written backward pass recomputes each chunk's
logits instead of keeping them:

    dl = g (onehot(y) - softmax(l)),   dh = dl W,   dW = sum_chunks dl^T h,   db = sum dl

so no tensor of V columns outlives a chunk, and the loops stop at the window's extent n
(one past the last position that is real in some row, `tflm.backends.extent_loop`): a
window padded to a length compiled already (`tflm.backends.compiled_lengths`) pays for
its real positions only, and the positions past the last chunk get 0. On the 2-core CPU
of bench/RESULTS.md the 200-wide, V = 10,000 layer's forward and backward at batch 20 took
65 ms for 35 positions padded to 40, 48 or 64, against 89 ms for `log_softmax` and a
gather on the unpadded window and 134 ms padded to 48.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from tflm.backends import extent_loop

# Rows (batch x positions) of one chunk: large enough for an efficient GEMM, small enough
# that the chunk's (rows, V) logits stay in cache-sized pieces.
ROWS = 160


def target_log_probs(h, weight, bias, targets, mask=None):
    """log softmax(h W^T + b) at `targets`: `(batch, time)` float32.

    `h` `(batch, time, d)`, `weight` `(V, d)`, `bias` `(V,)` or None, `targets` int
    `(batch, time)`, `mask` bool `(batch, time)` of real positions or None (all real)."""
    h = jnp.asarray(h, jnp.float32)
    weight = jnp.asarray(weight, jnp.float32)
    bias = (jnp.zeros(weight.shape[:1], jnp.float32) if bias is None
            else jnp.asarray(bias, jnp.float32))
    batch, length = h.shape[0], h.shape[1]
    if mask is None:
        extent = jnp.asarray(length, jnp.int32)
    else:
        extent = extent_loop.extent(jnp.asarray(mask, jnp.float32)[..., None])
    chunk = max(1, -(-ROWS // max(1, batch)))
    padded = -(-length // chunk) * chunk
    if padded != length:  # whole chunks: dynamic slices never run past the end
        h = jnp.pad(h, ((0, 0), (0, padded - length), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, padded - length)))
    picked = _chunked(chunk, h, weight, bias, jnp.asarray(targets, jnp.int32), extent)
    return picked[:, :length]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked(chunk, h, weight, bias, targets, extent):
    return _forward(chunk, h, weight, bias, targets, extent)[0]


def _chunks(chunk, extent):
    return (extent + chunk - 1) // chunk


def _logits(chunk, c, h, weight, bias, targets):
    rows = lax.dynamic_slice_in_dim(h, c * chunk, chunk, 1)
    ids = lax.dynamic_slice_in_dim(targets, c * chunk, chunk, 1)
    return rows, ids, rows @ weight.T + bias


def _forward(chunk, h, weight, bias, targets, extent):
    def body(c, out):
        _, ids, logits = _logits(chunk, c, h, weight, bias, targets)
        picked = jnp.take_along_axis(logits, ids[..., None], -1)[..., 0]
        return lax.dynamic_update_slice_in_dim(
            out, picked - jax.nn.logsumexp(logits, -1), c * chunk, 1)

    out = lax.fori_loop(0, _chunks(chunk, extent), body, jnp.zeros(h.shape[:2], h.dtype))
    return out, (h, weight, bias, targets, extent)


def _backward(chunk, residuals, g):
    h, weight, bias, targets, extent = residuals
    vocab, width = weight.shape

    def body(c, carry):
        d_h, d_weight, d_bias = carry
        rows, ids, logits = _logits(chunk, c, h, weight, bias, targets)
        g_c = lax.dynamic_slice_in_dim(g, c * chunk, chunk, 1)
        d_logits = (jax.nn.one_hot(ids, vocab, dtype=h.dtype)
                    - jax.nn.softmax(logits, -1)) * g_c[..., None]
        d_h = lax.dynamic_update_slice_in_dim(d_h, d_logits @ weight, c * chunk, 1)
        flat = d_logits.reshape(-1, vocab)
        return (d_h, d_weight + flat.T @ rows.reshape(-1, width),
                d_bias + jnp.sum(flat, 0))

    d_h, d_weight, d_bias = lax.fori_loop(
        0, _chunks(chunk, extent), body,
        (jnp.zeros_like(h), jnp.zeros_like(weight), jnp.zeros_like(bias)))
    return d_h, d_weight, d_bias, None, None


_chunked.defvjp(_forward, _backward)
