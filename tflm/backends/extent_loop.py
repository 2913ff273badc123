"""A time loop that runs only up to a padded window's last real position (JAX).

JAX compiles one program per window shape, so a window runs padded to a length compiled
already (`tflm.backends.compiled_lengths`). Keras' loop (`lax.scan`) then steps through
the padded positions too, each step masked: all of the recurrence's compute, none of its
effect. Where every row of the window is padded from position n on, the extent

    n = max { t + 1 : some row of the window is real at t }

is a traced scalar, and `extent_loop` runs the step for positions [start, stop) only
(`lax.fori_loop` with traced bounds: a while loop), leaving zeros in the outputs of the
positions it skips. What a caller must add for them (the carried state, held outputs) is
its own semantics: `tflm.backends.lstm_backward` uses it for the masked LSTM loop, where
a skipped position (m = 0 in every row) holds the state and outputs zero or the previous
output, and its backward pass passes the carried gradients through unchanged.

JAX only: the loop is differentiated through a written backward pass (a while loop with
traced bounds has no reverse-mode autodiff).
"""

import jax
import jax.numpy as jnp
from jax import lax


def extent(steps):
    """The traced extent n of a window from its `(batch, time, 1)` mask of real steps (1
    real, 0 padded): one past the last position that is real in some row (0 when none)."""
    real = jnp.any(steps[..., 0] > 0, axis=0)
    positions = jnp.arange(1, steps.shape[1] + 1, dtype=jnp.int32)
    return jnp.max(jnp.where(real, positions, 0))


def extent_loop(step, inputs, initial_states, start, stop):
    """Run `step(x_t, states) -> (outputs_t, new_states)` over positions [start, stop) of
    `inputs` `(batch, time, features)` from `initial_states` (a list).

    Returns `(outputs, states)`: `outputs` a tuple of `(batch, time, ...)` arrays (one per
    output of `step`; a single array output gives a 1-tuple), zero at the positions outside
    [start, stop); `states` the states after position stop - 1."""
    time_major = jnp.swapaxes(inputs, 0, 1)
    initial_states = list(initial_states)

    def as_tuple(outputs):
        return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)

    shapes = jax.eval_shape(lambda x, s: as_tuple(step(x, s)[0]), time_major[0],
                            initial_states)
    buffers = tuple(jnp.zeros(time_major.shape[:1] + o.shape, o.dtype) for o in shapes)

    def body(t, carry):
        states, buffers = carry
        outputs, new_states = step(time_major[t], states)
        buffers = tuple(lax.dynamic_update_index_in_dim(b, o, t, 0)
                        for b, o in zip(buffers, as_tuple(outputs)))
        return list(new_states), buffers

    states, buffers = lax.fori_loop(start, stop, body, (initial_states, buffers))
    return tuple(jnp.swapaxes(b, 0, 1) for b in buffers), states


# Rows (batch x positions) of one chunk of `extent_matmul` / `extent_products`.
ROWS = 160


def _chunk_positions(batch):
    return max(1, -(-ROWS // max(1, batch)))


def _whole_chunks(x, chunk):
    """`x` `(batch, time, ...)` padded with zeros on the time axis to whole chunks."""
    padded = -(-x.shape[1] // chunk) * chunk
    if padded == x.shape[1]:
        return x
    return jnp.pad(x, [(0, 0), (0, padded - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def extent_products(a, b, extent):
    """sum over positions t < extent (in whole chunks) of a_t^T b_t: `a` `(batch, time, m)`,
    `b` `(batch, time, n)` -> `(m, n)`; positions past the extent must hold zeros in `a`
    or `b` up to the end of the last chunk (a weight gradient's sum over positions)."""
    chunk = _chunk_positions(a.shape[0])
    a, b = _whole_chunks(a, chunk), _whole_chunks(b, chunk)

    def body(c, total):
        a_c = lax.dynamic_slice_in_dim(a, c * chunk, chunk, 1).reshape(-1, a.shape[-1])
        b_c = lax.dynamic_slice_in_dim(b, c * chunk, chunk, 1).reshape(-1, b.shape[-1])
        return total + a_c.T @ b_c

    chunks = (extent + chunk - 1) // chunk
    return lax.fori_loop(0, chunks, body, jnp.zeros((a.shape[-1], b.shape[-1]), a.dtype))


def extent_matmul(x, weight, extent):
    """x_t W for the positions t < extent, in whole chunks of `ROWS` rows, zero past the
    last chunk: `x` `(batch, time, m)`, `weight` `(m, n)` -> `(batch, time, n)`; its
    backward pass (dx_t = dy_t W^T, dW = sum_t x_t^T dy_t) stops there too."""
    return _extent_matmul(x, weight, extent)


def _chunked_map(x, extent, function, width):
    chunk = _chunk_positions(x.shape[0])
    padded = _whole_chunks(x, chunk)

    def body(c, out):
        x_c = lax.dynamic_slice_in_dim(padded, c * chunk, chunk, 1)
        return lax.dynamic_update_slice_in_dim(out, function(x_c), c * chunk, 1)

    chunks = (extent + chunk - 1) // chunk
    out = lax.fori_loop(0, chunks, body, jnp.zeros(padded.shape[:2] + (width,), x.dtype))
    return out[:, :x.shape[1]]


@jax.custom_vjp
def _extent_matmul(x, weight, extent):
    return _chunked_map(x, extent, lambda x_c: x_c @ weight, weight.shape[1])


def _extent_matmul_forward(x, weight, extent):
    return _extent_matmul(x, weight, extent), (x, weight, extent)


def _extent_matmul_backward(residuals, d_y):
    x, weight, extent = residuals
    d_x = _chunked_map(d_y, extent, lambda d_c: d_c @ weight.T, weight.shape[0])
    return d_x, extent_products(x, d_y, extent), None


_extent_matmul.defvjp(_extent_matmul_forward, _extent_matmul_backward)
