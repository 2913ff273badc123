"""The targets' log-probabilities under a softmax output layer, chunk by chunk (JAX).

Training needs only log P(y_t | c_t) of each position's target, not the `(batch, time, V)`
log-probabilities:

    l = h W^T + b,   log P(y | c) = l_y - logsumexp(l)

`target_log_probs` computes it for a few positions at a time (`extent_loop.ROWS` rows of
the flattened batch x time a chunk), and its written backward pass recomputes each chunk's
logits instead of keeping them:

    dl = g (onehot(y) - softmax(l)),   dh = dl W,   dW = sum_chunks dl^T h,   db = sum dl

so no tensor of V columns outlives a chunk, and the loops stop at the window's extent n
(one past the last position that is real in some row, `tflm.backends.extent_loop`): a
window padded to a length compiled already (`tflm.backends.compiled_lengths`) pays for
its real positions only, and the positions past it get 0. On the 2-core CPU
of bench/RESULTS.md the 200-wide, V = 10,000 layer's forward and backward at batch 20 took
65 ms for 35 positions padded to 40, 48 or 64, against 89 ms for `log_softmax` and a
gather on the unpadded window and 134 ms padded to 48.
"""

import jax
import jax.numpy as jnp
from jax import lax

from tflm.backends import extent_loop


def target_log_probs(h, weight, bias, targets, mask=None):
    """log softmax(h W^T + b) at `targets`: `(batch, time)` float32.

    `h` `(batch, time, d)`, `weight` `(V, d)`, `bias` `(V,)` or None, `targets` int
    `(batch, time)`, `mask` bool `(batch, time)` of real positions or None (all real).
    Chunks of `extent_loop.ROWS` rows (`extent_loop.Chunks`) cover the positions before the
    extent exactly; the others get 0."""
    h = jnp.asarray(h, jnp.float32)
    weight = jnp.asarray(weight, jnp.float32)
    bias = (jnp.zeros(weight.shape[:1], jnp.float32) if bias is None
            else jnp.asarray(bias, jnp.float32))
    if mask is None:
        extent = jnp.asarray(h.shape[1], jnp.int32)
    else:
        extent = extent_loop.extent(jnp.asarray(mask, jnp.float32)[..., None])
    return _picked(h, weight, bias, jnp.asarray(targets, jnp.int32), extent)


@jax.custom_vjp
def _picked(h, weight, bias, targets, extent):
    return _forward(h, weight, bias, targets, extent)[0]


def _logits(chunks, i, h, weight, bias, targets):
    rows = chunks.slice(h, i)
    return rows, chunks.slice(targets, i), rows @ weight.T + bias


def _forward(h, weight, bias, targets, extent):
    chunks = extent_loop.Chunks(h.shape[0], h.shape[1], extent)

    def body(i, out):
        _, ids, logits = _logits(chunks, i, h, weight, bias, targets)
        picked = jnp.take_along_axis(logits, ids[..., None], -1)[..., 0]
        return chunks.update(out, picked - jax.nn.logsumexp(logits, -1), i)

    out = lax.fori_loop(0, chunks.count, body, jnp.zeros(h.shape[:2], h.dtype))
    return out, (h, weight, bias, targets, extent)


def _backward(residuals, g):
    h, weight, bias, targets, extent = residuals
    vocab, width = weight.shape
    batch = h.shape[0]
    chunks = extent_loop.Chunks(batch, h.shape[1], extent)

    def body(i, carry):
        d_h, d_weight, d_bias = carry
        rows, ids, logits = _logits(chunks, i, h, weight, bias, targets)
        d_logits = (jax.nn.one_hot(ids, vocab, dtype=h.dtype)
                    - jax.nn.softmax(logits, -1)) * chunks.slice(g, i)[..., None]
        d_h = chunks.update(d_h, d_logits @ weight, i)
        # the overlapping last chunk: each position counts once in the sums
        new = chunks.new_rows(i, batch)
        flat = d_logits.reshape(-1, vocab)
        return (d_h, d_weight + flat.T @ (rows.reshape(-1, width) * new),
                d_bias + (new.T @ flat)[0])

    d_h, d_weight, d_bias = lax.fori_loop(
        0, chunks.count, body,
        (jnp.zeros_like(h), jnp.zeros_like(weight), jnp.zeros_like(bias)))
    return d_h, d_weight, d_bias, None, None


_picked.defvjp(_forward, _backward)
