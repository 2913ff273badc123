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


def extent_loop(step, inputs, initial_states, start, stop, reverse=False):
    """Run `step(x_t, states) -> (outputs_t, new_states)` over positions [start, stop) of
    `inputs` (one `(batch, time, features)` array, or a list of them: x_t is then their
    slices at t joined on the feature axis) from `initial_states` (a list); `reverse`: from
    stop - 1 down to start.

    Returns `(outputs, states)`: `outputs` a tuple of `(batch, time, ...)` arrays (one per
    output of `step`; a single array output gives a 1-tuple), zero at the positions outside
    [start, stop); `states` the states after the last position run. The loop reads and
    writes one position of the batch-major arrays a step: nothing of the window's size is
    copied (no transposes, no joined or flipped copies), so the positions it skips cost
    nothing but the zeros of the outputs."""
    parts = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    initial_states = list(initial_states)

    def x_at(t):
        slices = [lax.dynamic_index_in_dim(p, t, 1, keepdims=False) for p in parts]
        return slices[0] if len(slices) == 1 else jnp.concatenate(slices, axis=-1)

    def as_tuple(outputs):
        return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)

    shapes = jax.eval_shape(lambda s: as_tuple(step(x_at(0), s)[0]), initial_states)
    length = parts[0].shape[1]
    buffers = tuple(jnp.zeros(o.shape[:1] + (length,) + o.shape[1:], o.dtype) for o in shapes)

    def body(i, carry):
        states, buffers = carry
        t = start + stop - 1 - i if reverse else i
        outputs, new_states = step(x_at(t), states)
        buffers = tuple(lax.dynamic_update_index_in_dim(b, o, t, 1)
                        for b, o in zip(buffers, as_tuple(outputs)))
        return list(new_states), buffers

    states, buffers = lax.fori_loop(start, stop, body, (initial_states, buffers))
    return buffers, states


# Rows (batch x positions) of one chunk of `extent_matmul` / `extent_products` (and of
# `tflm.backends.jax_target_log_probs`): large enough for an efficient GEMM.
ROWS = 160


class Chunks:
    """Chunks of `size` positions covering [0, extent) exactly, without padding the window:
    `full = extent // size` whole chunks at i size, then, when `extent % size`, one more
    that ends at the extent (it starts at `max(extent - size, 0)` and so overlaps the last
    whole chunk). A map over the positions writes the overlap twice with the same values;
    a sum over them takes each position once with `new_rows(i)` (the rows of chunk i not in
    an earlier chunk). `size` is `ROWS / batch` positions (at least 1, at most the window).
    """

    def __init__(self, batch, length, extent):
        self.size = min(max(1, -(-ROWS // max(1, batch))), int(length))
        self.full = extent // self.size
        self.count = self.full + (extent % self.size > 0).astype(self.full.dtype)
        self._extent = extent

    def start(self, i):
        return jnp.where(i < self.full, i * self.size,
                         jnp.maximum(self._extent - self.size, 0))

    def new_rows(self, i, batch, dtype=jnp.float32):
        """`(batch * size, 1)` of `dtype`: 1 on the rows of chunk i that no earlier chunk
        held."""
        first_new = jnp.where(i < self.full, i * self.size, self.full * self.size)
        positions = self.start(i) + jnp.arange(self.size)
        new = (positions >= first_new).astype(dtype)
        return jnp.broadcast_to(new[None, :], (batch, self.size)).reshape(-1, 1)

    def slice(self, x, i):
        return lax.dynamic_slice_in_dim(x, self.start(i), self.size, 1)

    def update(self, out, value, i):
        return lax.dynamic_update_slice_in_dim(out, value, self.start(i), 1)


def extent_products(a, b, extent):
    """sum over the positions t < extent of a_t^T b_t, chunk by chunk: `a` `(batch, time,
    m)`, `b` `(batch, time, n)` -> `(m, n)` (a weight gradient's sum over positions)."""
    chunks = Chunks(a.shape[0], a.shape[1], extent)

    def body(i, total):
        # in a's dtype: a float32 mask would promote a bfloat16 total (mixed precision)
        a_i = (chunks.slice(a, i).reshape(-1, a.shape[-1])
               * chunks.new_rows(i, a.shape[0], a.dtype))
        return total + a_i.T @ chunks.slice(b, i).reshape(-1, b.shape[-1])

    return lax.fori_loop(0, chunks.count, body,
                         jnp.zeros((a.shape[-1], b.shape[-1]), a.dtype))


def extent_matmul(x, weight, extent):
    """x_t W for the positions t < extent, chunk by chunk (`Chunks`), zero past them: `x`
    `(batch, time, m)`, `weight` `(m, n)` -> `(batch, time, n)`; its backward pass
    (dx_t = dy_t W^T, dW = sum_t x_t^T dy_t) stops there too."""
    return _extent_matmul(x, weight, extent)


def chunked_map(x, extent, function, width):
    """`function` of each chunk of `x` `(batch, time, m)` -> `(batch, chunk, width)`, for
    the positions < extent; zeros past them."""
    chunks = Chunks(x.shape[0], x.shape[1], extent)

    def body(i, out):
        return chunks.update(out, function(chunks.slice(x, i)), i)

    return lax.fori_loop(0, chunks.count, body,
                         jnp.zeros(x.shape[:2] + (width,), x.dtype))


@jax.custom_vjp
def _extent_matmul(x, weight, extent):
    return chunked_map(x, extent, lambda x_c: x_c @ weight, weight.shape[1])


def _extent_matmul_forward(x, weight, extent):
    return _extent_matmul(x, weight, extent), (x, weight, extent)


def _extent_matmul_backward(residuals, d_y):
    x, weight, extent = residuals
    d_x = chunked_map(d_y, extent, lambda d_c: d_c @ weight.T, weight.shape[0])
    return d_x, extent_products(x, d_y, extent), None


_extent_matmul.defvjp(_extent_matmul_forward, _extent_matmul_backward)
