"""The portable LSTM loop with its backward pass written out (`lstm_with_backward`).

Autodiff through a time loop (TensorFlow's while loop, JAX's scan) replays every step's
ops in reverse one by one, and accumulates dU = sum_t h_{t-1}^T dz_t inside the loop: T
products of (n x B) by (B x 4n), each reading and writing all of U. Written out, the
backward loop holds one matmul per step (dz_t U^T) and the gate algebra (on TensorFlow
only its carried part: the gate derivatives are computed for the whole window before the
loop), and dU is one (n x T B) by (T B x 4n) GEMM after it, as cuDNN's and oneDNN's LSTM
backward do.

Forward, gate order i, f, c, o as `lstm_kernels.portable_lstm`; p_t = x_t W + b is given,
m_t is 1 on a real step and 0 on a masked one (which holds the state and outputs zero):

    z_t = p_t + h_{t-1} U;   i, f, o = sigmoid(z_i, z_f, z_o);   g = tanh(z_c)
    c~ = f c_{t-1} + i g;    h~ = o tanh(c~)
    c_t = m c~ + (1 - m) c_{t-1};   h_t = m h~ + (1 - m) h_{t-1}
    y_t = m h~  (zero_output_for_mask)   or   y_t = m h~ + (1 - m) y_{t-1}  (Keras' default:
          a masked step repeats the previous output; y_{-1} is 0 in Keras' TensorFlow loop
          and h_0 in its JAX loop, and each backend keeps its own)

Backward, from the output gradient dy_t and the carried dh_t, dc_t (for the final state:
the gradients of h_T, c_T); with repeated outputs the gradient a masked output passes back
is carried too, e_t (e_T = 0), and dy_t stands for dy_t + e_t, with e_{t-1} = (1 - m) dy_t
(on JAX e_{-1} adds to dh_0):

    dh~ = m (dy_t + dh_t)
    dc~ = m dc_t + dh~ o (1 - tanh^2 c_t)
    dz_t = [dc~ g i (1 - i),  dc~ c_{t-1} f (1 - f),  dc~ i (1 - g^2),  dh~ tanh(c_t) o (1 - o)]
    dh_{t-1} = dz_t U^T + (1 - m) dh_t;   dc_{t-1} = dc~ f + (1 - m) dc_t
    dp_t = dz_t;   dU = sum_t h_{t-1}^T dz_t

(c_t stands for c~: they are equal where m = 1, and where m = 0 both dh~ and dc~ vanish.)
The gradients equal autodiff's to float rounding (tests/tflm/backends/test_lstm_backward.py, every
backend that runs it, masked and unmasked).
"""

import keras
from keras import ops

from tflm import backends, compat

# The backends whose portable loop is differentiated by tracing a loop (TensorFlow's while
# loop, JAX's scan). PyTorch runs its fused kernel, whose backward is already written out.
BACKENDS = ("tensorflow", "jax")


def applies(cell, return_sequences, go_backwards, unroll):
    """Whether `lstm_with_backward` computes this window: sigmoid / tanh gates, a whole
    sequence returned in order, a backend whose loop autodiff replays step by step (and
    that allows it here: `Backend.written_lstm_backward`)."""
    return (keras.backend.backend() in BACKENDS and return_sequences and not go_backwards
            and not unroll and backends.current().written_lstm_backward()
            and getattr(cell.recurrent_activation, "__name__", "") == "sigmoid"
            and getattr(cell.activation, "__name__", "") == "tanh")


def lstm_with_backward(projected, recurrent_kernel, initial_state, mask=None,
                       zero_output_for_mask=False):
    """`(last_output, outputs, [h_T, c_T])` of the LSTM over `projected` = x W + b,
    `(batch, time, 4 units)`, with the backward pass above. `mask` `(batch, time)`: true on
    real steps, or None; a masked step outputs zero with `zero_output_for_mask`, else the
    previous output (Keras' RNN semantics)."""
    h0, c0 = (ops.cast(s, projected.dtype) for s in initial_state)
    recurrent_kernel = ops.cast(recurrent_kernel, projected.dtype)
    if mask is None:
        outputs, h_t, c_t = _differentiable(_unmasked)(projected, recurrent_kernel, h0, c0)
    else:
        steps = ops.expand_dims(ops.cast(mask, projected.dtype), -1)
        masked = _masked_zero_output if zero_output_for_mask else _masked_held_output
        outputs, h_t, c_t = _differentiable(masked)(projected, recurrent_kernel, h0, c0,
                                                    steps)
    return outputs[:, -1], outputs, [h_t, c_t]


def project_inputs(sequences, kernel, mask=None):
    """x W for the window: on JAX, for a masked window, only up to its extent (whole chunks,
    zero past them: `tflm.backends.extent_loop.extent_matmul`), whose positions the loops
    never read; elsewhere one matmul."""
    if mask is None or not _to_extent():
        return ops.matmul(sequences, kernel)
    from tflm.backends import extent_loop  # deferred: it imports JAX, used on JAX only
    steps = ops.expand_dims(ops.cast(mask, sequences.dtype), -1)
    return extent_loop.extent_matmul(sequences, kernel, extent_loop.extent(steps))


_DIFFERENTIABLE = {}


def _differentiable(function):
    """`function` under `keras.ops.custom_gradient`, made on first use: the decorator
    exists on the `BACKENDS` only, so this module imports on every backend."""
    if function not in _DIFFERENTIABLE:
        _DIFFERENTIABLE[function] = ops.custom_gradient(function)
    return _DIFFERENTIABLE[function]


def _forward(projected, recurrent_kernel, h0, c0, steps, held_output=False):
    """The forward loop: `(z_t, h_t, c_t, y_t)` of every step and the final `[h, c]`; z
    `(batch, time, 4 units)`, the others `(batch, time, units)`; y_t is None unless
    `held_output` (then it differs from m h_t). On JAX a masked window's loop stops at its
    extent (`tflm.backends.extent_loop`): z, h and c are zero past it. Only the
    pre-activations z are kept of the gates: the backward pass recomputes the activations
    from them (see `_backward`)."""

    def step(x_t, states):
        h_prev, c_prev = states[0], states[1]
        p_t = x_t if steps is None else x_t[:, :-1]
        z = p_t + ops.matmul(h_prev, recurrent_kernel)
        z_i, z_f, z_c, z_o = ops.split(z, 4, axis=-1)
        c = ops.sigmoid(z_f) * c_prev + ops.sigmoid(z_i) * ops.tanh(z_c)
        h = ops.sigmoid(z_o) * ops.tanh(c)
        if steps is None:
            return (z, h, c), [h, c]
        m = x_t[:, -1:]
        new = [m * h + (1.0 - m) * h_prev, m * c + (1.0 - m) * c_prev]
        if held_output:
            new.append(m * h + (1.0 - m) * states[2])
        return (z, *new), new

    initial = [h0, c0] + ([_first_held_output(h0)] if held_output else [])
    n = _window_extent(steps)
    if n is not None:
        from tflm.backends import extent_loop  # deferred: it imports JAX, used on JAX only
        saved, final = extent_loop.extent_loop(step, [projected, steps], initial, 0, n)
        if held_output:  # past the extent every row holds its last output
            after = _after_extent(n, steps.shape[1])
            saved = saved[:3] + (ops.where(after, ops.expand_dims(final[2], 1), saved[3]),)
    else:
        # One input tensor: Keras' TensorFlow loop reads the window length from a nested
        # input's `.shape`, which a window of unknown length (fit's) does not have.
        inputs = projected if steps is None else ops.concatenate([projected, steps], axis=-1)
        _, saved, final = compat.rnn_loop(step, inputs, initial, mask=None,
                                          go_backwards=False, unroll=False,
                                          zero_output_for_mask=False, return_all_outputs=True)
    return saved[0], saved[1], saved[2], saved[3] if held_output else None, final[:2]


def _backward(recurrent_kernel, h0, c0, steps, z_states, h_states, c_states, d_outputs,
              d_h, d_c, held_output=False):
    """The backward loop (time reversed) and dU: `(dprojected, dU, dh0, dc0)`.

    With P_t = o (1 - tanh^2 c_t) and
    Q_t = [g i (1 - i), c_{t-1} f (1 - f), i (1 - g^2), tanh(c_t) o (1 - o)], a step is

        dc~ = m dc_t + dh~ P_t,   dz_t = [dc~, dc~, dc~, dh~] Q_t

    On TensorFlow P, f and Q are computed for all steps before the loop, in whole-window
    ops (`_FACTORS_BEFORE_LOOP`): its executor pays per op and per step, and the loop body
    shrinks to the carried algebra and dz U^T (the 200 / 400 x 3 PTB model's training step:
    103.6 -> 101.9 ms, two threads). XLA fuses a loop body into one kernel whatever its
    size, and JAX compiled the step 0.5 s slower with the factors outside: there the body
    computes them from z_t, c_t and c_{t-1}."""
    units = h0.shape[-1]
    c_prev = ops.concatenate([ops.expand_dims(c0, 1), c_states[:, :-1]], axis=1)
    before_loop = _FACTORS_BEFORE_LOOP.get(keras.backend.backend(), False)
    if before_loop:
        factors = _step_factors(z_states, c_states, c_prev, units)
        parts = [d_outputs, *factors]  # widths n, n, n, 4n
    else:
        parts = [d_outputs, z_states, c_states, c_prev]  # widths n, 4n, n, n
    u_t = ops.transpose(recurrent_kernel)
    if steps is not None:
        parts.append(steps)

    def step(x_t, carry):
        dh, dc = carry[0], carry[1]
        dy = x_t[:, :units]
        if held_output:
            dy = dy + carry[2]
        if before_loop:
            p_t, f_t, q_t = (x_t[:, units:2 * units], x_t[:, 2 * units:3 * units],
                             x_t[:, 3 * units:7 * units])
        else:
            p_t, f_t, q_t = _step_factors(x_t[:, units:5 * units], x_t[:, 5 * units:6 * units],
                                          x_t[:, 6 * units:7 * units], units)
        m = None if steps is None else x_t[:, 7 * units:]
        dh_new = dy + dh if m is None else m * (dy + dh)
        dc_new = (dc if m is None else m * dc) + dh_new * p_t
        dz = ops.concatenate([dc_new, dc_new, dc_new, dh_new], axis=-1) * q_t
        new = [ops.matmul(dz, u_t), dc_new * f_t]
        if m is not None:
            new = [new[0] + (1.0 - m) * dh, new[1] + (1.0 - m) * dc]
        if held_output:
            new.append((1.0 - m) * dy)
        return dz, new

    initial = [d_h, d_c] + ([ops.zeros_like(d_h)] if held_output else [])
    n = _window_extent(steps)
    if n is not None:
        from tflm.backends import extent_loop  # deferred: it imports JAX, used on JAX only
        if held_output:  # the held outputs past the extent pass their gradient back
            after = _after_extent(n, steps.shape[1])
            initial[2] = ops.sum(ops.where(after, d_outputs, 0.0), axis=1)
        (dz,), carry = extent_loop.extent_loop(step, parts, initial, 0, n, reverse=True)
    else:
        reversed_inputs = ops.flip(ops.concatenate(parts, axis=-1), axis=1)
        _, dz_reversed, carry = compat.rnn_loop(
            step, reversed_inputs, initial, mask=None, go_backwards=False, unroll=False,
            zero_output_for_mask=False, return_all_outputs=True)
        dz = ops.flip(dz_reversed, axis=1)
    h_prev = ops.concatenate([ops.expand_dims(h0, 1), h_states[:, :-1]], axis=1)
    if n is not None:  # dz is zero past the extent
        d_kernel = extent_loop.extent_products(h_prev, dz, n)
    else:
        d_kernel = ops.matmul(ops.transpose(ops.reshape(h_prev, (-1, units))),
                              ops.reshape(dz, (-1, 4 * units)))
    d_h0 = carry[0]
    if held_output and _HELD_FROM_H0.get(keras.backend.backend(), False):
        d_h0 = d_h0 + carry[2]
    return dz, d_kernel, d_h0, carry[1]


def _step_factors(z, c, c_prev, units):
    """(P, f, Q) of the docstring of `_backward`, from the pre-activations z (..., 4n), c_t
    and c_{t-1} (..., n): of one step or of a whole window."""
    i, f, _, o = ops.split(ops.sigmoid(z), 4, axis=-1)
    g = ops.tanh(z[..., 2 * units:3 * units])
    tanh_c = ops.tanh(c)
    factors = ops.concatenate([g * i * (1.0 - i), c_prev * f * (1.0 - f), i * (1.0 - g * g),
                               tanh_c * o * (1.0 - o)], axis=-1)
    return o * (1.0 - tanh_c * tanh_c), f, factors


# Where the backward loop reads P, f and Q computed before it (see `_backward`).
_FACTORS_BEFORE_LOOP = {"tensorflow": True}


# Where the masked loops stop at the window's extent (`tflm.backends.extent_loop`): JAX,
# whose windows run padded to a length compiled already.
_EXTENT_LOOP = {"jax": True}


def _to_extent():
    return _EXTENT_LOOP.get(keras.backend.backend(), False)


def _window_extent(steps):
    """The traced extent of a masked window where the loops stop there, else None."""
    if steps is None or not _to_extent():
        return None
    from tflm.backends import extent_loop  # deferred: it imports JAX, used on JAX only
    return extent_loop.extent(steps)


def _after_extent(extent, length):
    """`(1, time, 1)` bool: the positions at or past the window's `extent`."""
    positions = ops.arange(length, dtype="int32")
    return ops.reshape(positions >= extent, (1, -1, 1))


# Keras' loop on JAX repeats the previous *state* h at a masked step (so h_0 before any
# real step), on TensorFlow the previous *output* (zeros before any real step).
_HELD_FROM_H0 = {"jax": True}


def _first_held_output(h0):
    return h0 if _HELD_FROM_H0.get(keras.backend.backend(), False) else ops.zeros_like(h0)


def _cotangents(args, upstream, outputs):
    """The upstream gradients as one tuple (TensorFlow passes one per output, JAX the
    output structure), zeros for an output nothing depended on."""
    if upstream is not None:
        args = (upstream,)
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(ops.zeros_like(o) if a is None else a for a, o in zip(args, outputs))


def _unmasked(projected, recurrent_kernel, h0, c0):
    z_states, h_states, c_states, _, final = _forward(projected, recurrent_kernel, h0, c0,
                                                      None)
    outputs = (h_states, *final)

    def grad(*args, upstream=None):
        d_y, d_h, d_c = _cotangents(args, upstream, outputs)
        return _backward(recurrent_kernel, h0, c0, None, z_states, h_states, c_states,
                         d_y, d_h, d_c)

    return outputs, grad


def _masked(projected, recurrent_kernel, h0, c0, steps, held_output):
    z_states, h_states, c_states, y, final = _forward(projected, recurrent_kernel, h0, c0,
                                                      steps, held_output)
    outputs = (y if held_output else steps * h_states, *final)

    def grad(*args, upstream=None):
        d_y, d_h, d_c = _cotangents(args, upstream, outputs)
        grads = _backward(recurrent_kernel, h0, c0, steps, z_states, h_states, c_states,
                          d_y, d_h, d_c, held_output)
        return (*grads, ops.zeros_like(steps))

    return outputs, grad


def _masked_zero_output(projected, recurrent_kernel, h0, c0, steps):
    return _masked(projected, recurrent_kernel, h0, c0, steps, held_output=False)


def _masked_held_output(projected, recurrent_kernel, h0, c0, steps):
    return _masked(projected, recurrent_kernel, h0, c0, steps, held_output=True)
