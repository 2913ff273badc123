"""The targets' log-probabilities under a mixture of softmaxes, chunk by chunk (JAX).

A mixture-of-softmaxes head (`tflm.layers.MoSLayer`, Yang et al. 2018) trains on log P(y_t |
c_t) of each position's target alone. With K components h_k `(L,)`, the log prior log pi
`(K,)` and the shared output layer W `(V, L)`, b:

    l_k = h_k W^T + b,   a_k = log pi_k + l_{k,y} - logsumexp_V(l_k),
    log P(y | c) = logsumexp_k a_k

`mixture_target_log_probs` computes it for a few positions at a time (the chunks of
`tflm.backends.extent_loop`, as `tflm.backends.jax_target_log_probs` does for one softmax),
so no `(batch, time, K, V)` tensor is formed or kept for the backward pass (the batched
head forms one and autodiff keeps it), and the loops stop at the window's extent.

Its gradient, for a cotangent g of the `(batch, time)` output, with the components'
responsibilities for the target rho_k = softmax_k(a) and p_k = softmax_V(l_k):

    d log pi_k = g rho_k
    dh_k = g q_k,   q_k = rho_k (onehot(y) - p_k) W
    dW = sum_r g_r sum_k rho_{r,k} (onehot(y_r) - p_{r,k})^T h_{r,k},   db likewise

The forward pass keeps rho `(batch, time, K)` and q `(batch, time, K, L)` and computes dW
and db for g = w, the real positions' weights (a training loss is alpha sum_r w_r NLL_r);
the backward pass scales them by alpha, or, for any other g, runs the chunks again
(`jax_target_log_probs.along_weights` decides). Three GEMMs of the output layer a step, as
autodiff of the batched head does. Values and gradients equal NumPy's to float32
rounding (tests/tflm/backends/test_jax_mixture_target_log_probs.py), and a JAX train step
of an MoS model gives TensorFlow's, which differentiates the batched mixture
(`tflm.layers.mos.mixture_log_probs`; tests/tflm/backends/test_jax_backend.py). Positions
past the extent get 0 and no gradient.
"""

import jax
import jax.numpy as jnp
from jax import lax

from tflm.backends import extent_loop
from tflm.backends.jax_target_log_probs import along_weights, prepared


def mixture_target_log_probs(h, log_prior, weight, bias, targets, mask=None):
    """log sum_k pi_k softmax(h_k W^T + b) at `targets`: `(batch, time)` float32.

    `h` `(batch, time, K, L)`, `log_prior` `(batch, time, K)` (log pi, normalized),
    `weight` `(V, L)`, `bias` `(V,)` or None, `targets` int `(batch, time)`, `mask` bool
    `(batch, time)` of real positions or None (all real)."""
    h, weight, bias, targets, extent, weights = prepared(h, weight, bias, targets, mask)
    return _picked(h, jnp.asarray(log_prior, jnp.float32), weight, bias, targets, extent,
                   weights)


@jax.custom_vjp
def _picked(h, log_prior, weight, bias, targets, extent, weights):
    chunks = extent_loop.Chunks(h.shape[0], h.shape[1], extent)

    def body(i, out):
        return chunks.update(out, _chunk(chunks, i, h, log_prior, weight, bias,
                                         targets)[0], i)

    return lax.fori_loop(0, chunks.count, body, jnp.zeros(h.shape[:2], h.dtype))


def _chunk(chunks, i, h, log_prior, weight, bias, targets):
    """Chunk i's values, responsibilities rho, residuals rho_k (onehot(y) - p_k) `(batch,
    size, K, V)` and its h rows."""
    rows, ids = chunks.slice(h, i), chunks.slice(targets, i)
    logits = rows @ weight.T + bias                                         # (b, s, K, V)
    log_z = jax.nn.logsumexp(logits, -1)                                    # (b, s, K)
    ids_k = jnp.broadcast_to(ids[..., None, None], logits.shape[:-1] + (1,))
    picked = jnp.take_along_axis(logits, ids_k, -1)[..., 0] - log_z
    a = chunks.slice(log_prior, i) + picked
    value = jax.nn.logsumexp(a, -1)
    rho = jnp.exp(a - value[..., None])
    p = jnp.exp(logits - log_z[..., None])
    residual = rho[..., None] * (jax.nn.one_hot(ids, weight.shape[0], dtype=p.dtype)[
        ..., None, :] - p)
    return value, rho, residual, rows


def _weighted_sums(chunks, i, rows, residual, row_weights, batch):
    """Chunk i's terms of dW and db for the row weights `row_weights` `(batch, time)`; the
    overlapping last chunk's rows count once."""
    k = residual.shape[2]
    w = chunks.slice(row_weights, i).reshape(-1, 1) * chunks.new_rows(i, batch)
    w = jnp.repeat(w, k, axis=0)                                            # per component
    flat = residual.reshape(-1, residual.shape[-1])
    return flat.T @ (rows.reshape(-1, rows.shape[-1]) * w), (w.T @ flat)[0]


def _forward(h, log_prior, weight, bias, targets, extent, weights):
    """The values, rho, q, and dW_w, db_w (the module's docstring), in one loop."""
    batch = h.shape[0]
    chunks = extent_loop.Chunks(batch, h.shape[1], extent)

    def body(i, carry):
        out, rho_all, q, d_weight, d_bias = carry
        value, rho, residual, rows = _chunk(chunks, i, h, log_prior, weight, bias, targets)
        d_w, d_b = _weighted_sums(chunks, i, rows, residual, weights, batch)
        return (chunks.update(out, value, i), chunks.update(rho_all, rho, i),
                chunks.update(q, residual @ weight, i), d_weight + d_w, d_bias + d_b)

    out, rho, q, d_weight, d_bias = lax.fori_loop(
        0, chunks.count, body,
        (jnp.zeros(h.shape[:2], h.dtype), jnp.zeros_like(log_prior), jnp.zeros_like(h),
         jnp.zeros_like(weight), jnp.zeros_like(bias)))
    return out, (h, log_prior, weight, bias, targets, extent, weights, rho, q, d_weight,
                 d_bias)


def _sums_again(h, log_prior, weight, bias, targets, extent, g):
    """dW and db for any g: each chunk recomputed."""
    batch = h.shape[0]
    chunks = extent_loop.Chunks(batch, h.shape[1], extent)

    def body(i, carry):
        d_weight, d_bias = carry
        _, _, residual, rows = _chunk(chunks, i, h, log_prior, weight, bias, targets)
        d_w, d_b = _weighted_sums(chunks, i, rows, residual, g, batch)
        return d_weight + d_w, d_bias + d_b

    return lax.fori_loop(0, chunks.count, body,
                         (jnp.zeros_like(weight), jnp.zeros_like(bias)))


def _backward(residuals, g):
    h, log_prior, weight, bias, targets, extent, weights, rho, q, d_weight_w, d_bias_w = \
        residuals
    alpha, proportional = along_weights(g, weights, extent)
    d_weight, d_bias = lax.cond(
        proportional,
        lambda: (alpha * d_weight_w, alpha * d_bias_w),
        lambda: _sums_again(h, log_prior, weight, bias, targets, extent, g))
    # past the extent rho and q are 0: those outputs are the constant 0
    return (g[..., None, None] * q, g[..., None] * rho, d_weight, d_bias, None, None,
            jnp.zeros_like(weights))


_picked.defvjp(_forward, _backward)
