"""The targets' log-probabilities under a softmax output layer, chunk by chunk (JAX).

Training needs only log P(y_t | c_t) of each position's target, not the `(batch, time, V)`
log-probabilities:

    l = h W^T + b,   p = softmax(l),   log P(y | c) = l_y - logsumexp(l)

`target_log_probs` computes it for a few positions at a time (`extent_loop.ROWS` rows of
the flattened batch x time a chunk), so no tensor of V columns outlives a chunk, and the
loops stop at the window's extent n (one past the last position that is real in some row,
`tflm.backends.extent_loop`): a window padded to a length compiled already
(`tflm.backends.compiled_lengths`) pays for its real positions only, and the positions past
it get 0.

Its gradient, for a cotangent g of the `(batch, time)` output:

    dh_r = g_r q_r,   q_r = (onehot(y_r) - p_r) W
    dW = sum_r g_r (onehot(y_r) - p_r)^T h_r,   db = sum_r g_r (onehot(y_r) - p_r)

dh is row by row, so the forward pass keeps q (`(batch, time, d)`) for any g. dW and db
mix the rows through g, and the forward pass cannot know g; but a training loss is
c * sum_r w_r NLL_r with the real positions' weights w (`tflm.padding.
real_position_weights`, the `mask`) and a scalar c, so g = alpha w. The forward pass
computes dW_w and db_w, the sums above with g = w, in the same chunk loop, and the
backward pass returns alpha dW_w, alpha db_w when g is alpha w (to 1e-6 of max |g|, alpha
read at the largest weight: exact for 0 / 1 weights). Any other g (sample weights, a
loss of the user's) runs the loop again, recomputing each chunk's logits for its dW and db.

So a train step does three GEMMs of the output layer, as PyTorch's autodiff of a full
log_softmax does, without its `(batch, time, V)` tensors. On the 2-core CPU of
bench/RESULTS.md (git history) the 200-wide, V = 10,000 layer's forward and backward at batch 20 (35
positions padded to 56) took 62 ms at one thread and 35 ms at two, against 77 / 41 ms
when the backward pass recomputed the logits (four GEMMs), and 89 ms (one thread) for
`log_softmax` and a gather on the unpadded window.
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
    extent exactly; the others get 0. The backward pass is quickest for a cotangent
    proportional to the mask (the module's docstring)."""
    h, weight, bias, targets, extent, weights = prepared(h, weight, bias, targets, mask)
    return _picked(h, weight, bias, targets, extent, weights)


def prepared(h, weight, bias, targets, mask):
    """The arguments as the chunk loops take them: `h`, `weight` and `bias` float32 (a
    zero bias for None), `targets` int32, and from `mask` (None: all real) the window's
    extent and the positions' float weights."""
    weight = jnp.asarray(weight, jnp.float32)
    bias = (jnp.zeros(weight.shape[:1], jnp.float32) if bias is None
            else jnp.asarray(bias, jnp.float32))
    batch, length = h.shape[:2]
    if mask is None:
        weights = jnp.ones((batch, length), jnp.float32)
        extent = jnp.asarray(length, jnp.int32)
    else:
        weights = jnp.asarray(mask, jnp.float32)
        extent = extent_loop.extent(weights[..., None])
    return (jnp.asarray(h, jnp.float32), weight, bias, jnp.asarray(targets, jnp.int32),
            extent, weights)


# g counts as alpha w when every |g_r - alpha w_r| is at most this fraction of max |g|
PROPORTIONAL = 1e-6


@jax.custom_vjp
def _picked(h, weight, bias, targets, extent, weights):
    return _values(h, weight, bias, targets, extent)


def _logits(chunks, i, h, weight, bias, targets):
    rows = chunks.slice(h, i)
    return rows, chunks.slice(targets, i), rows @ weight.T + bias


def _residual(ids, logits, log_z, vocab):
    """onehot(y) - softmax(l) of a chunk, from its logits and their logsumexp."""
    return jax.nn.one_hot(ids, vocab, dtype=logits.dtype) - jnp.exp(logits - log_z[..., None])


def _weighted_sums(chunks, i, rows, residual, row_weights, batch):
    """Chunk i's terms of dW = sum_r w_r residual_r^T h_r and db = sum_r w_r residual_r
    (`row_weights` `(batch, time)`: w); the overlapping last chunk's rows count once."""
    w = chunks.slice(row_weights, i).reshape(-1, 1) * chunks.new_rows(i, batch)
    flat = residual.reshape(-1, residual.shape[-1])
    return flat.T @ (rows.reshape(-1, rows.shape[-1]) * w), (w.T @ flat)[0]


def _values(h, weight, bias, targets, extent):
    chunks = extent_loop.Chunks(h.shape[0], h.shape[1], extent)

    def body(i, out):
        _, ids, logits = _logits(chunks, i, h, weight, bias, targets)
        picked = jnp.take_along_axis(logits, ids[..., None], -1)[..., 0]
        return chunks.update(out, picked - jax.nn.logsumexp(logits, -1), i)

    return lax.fori_loop(0, chunks.count, body, jnp.zeros(h.shape[:2], h.dtype))


def _forward(h, weight, bias, targets, extent, weights):
    """The values, q, and dW_w, db_w (the module's docstring), in one loop."""
    batch = h.shape[0]
    chunks = extent_loop.Chunks(batch, h.shape[1], extent)

    def body(i, carry):
        out, q, d_weight, d_bias = carry
        rows, ids, logits = _logits(chunks, i, h, weight, bias, targets)
        log_z = jax.nn.logsumexp(logits, -1)
        picked = jnp.take_along_axis(logits, ids[..., None], -1)[..., 0] - log_z
        residual = _residual(ids, logits, log_z, weight.shape[0])
        d_w, d_b = _weighted_sums(chunks, i, rows, residual, weights, batch)
        return (chunks.update(out, picked, i), chunks.update(q, residual @ weight, i),
                d_weight + d_w, d_bias + d_b)

    out, q, d_weight, d_bias = lax.fori_loop(
        0, chunks.count, body,
        (jnp.zeros(h.shape[:2], h.dtype), jnp.zeros_like(h), jnp.zeros_like(weight),
         jnp.zeros_like(bias)))
    return out, (h, weight, bias, targets, extent, weights, q, d_weight, d_bias)


def along_weights(g, weights, extent):
    """(alpha, whether g = alpha w) over the positions before the extent (those after it
    have constant outputs: their g does not matter); alpha is g / w at the largest w."""
    before = (jnp.arange(g.shape[1]) < extent)[None, :]
    g = jnp.where(before, g, 0.0)
    weights = jnp.where(before, weights, 0.0)
    at = jnp.argmax(weights.reshape(-1))
    largest = weights.reshape(-1)[at]
    alpha = jnp.where(largest > 0, g.reshape(-1)[at] / jnp.where(largest > 0, largest, 1.0),
                      0.0)
    off = jnp.max(jnp.abs(g - alpha * weights))
    return alpha, off <= PROPORTIONAL * jnp.max(jnp.abs(g))


def _sums_again(h, weight, bias, targets, extent, g):
    """dW and db for any g: each chunk's logits recomputed."""
    batch = h.shape[0]
    chunks = extent_loop.Chunks(batch, h.shape[1], extent)

    def body(i, carry):
        d_weight, d_bias = carry
        rows, ids, logits = _logits(chunks, i, h, weight, bias, targets)
        residual = _residual(ids, logits, jax.nn.logsumexp(logits, -1), weight.shape[0])
        d_w, d_b = _weighted_sums(chunks, i, rows, residual, g, batch)
        return d_weight + d_w, d_bias + d_b

    return lax.fori_loop(0, chunks.count, body,
                         (jnp.zeros_like(weight), jnp.zeros_like(bias)))


def _backward(residuals, g):
    h, weight, bias, targets, extent, weights, q, d_weight_w, d_bias_w = residuals
    alpha, proportional = along_weights(g, weights, extent)
    d_weight, d_bias = lax.cond(
        proportional,
        lambda: (alpha * d_weight_w, alpha * d_bias_w),
        lambda: _sums_again(h, weight, bias, targets, extent, g))
    # the outputs past the extent are constant 0, and no output depends on the weights
    return g[..., None] * q, d_weight, d_bias, None, None, jnp.zeros_like(weights)


_picked.defvjp(_forward, _backward)
