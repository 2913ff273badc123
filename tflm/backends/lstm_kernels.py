"""Which kernel runs one window of a `WeightDropLSTM`: the fused one or the portable loop.

    fused     the backend's fused kernel (`Backend.fused_lstm`): cuDNN on TensorFlow, JAX and
              PyTorch GPUs (JAX with per-sequence lengths for padded windows), PyTorch's
              oneDNN kernel on a CPU. Called with the dropped recurrent matrix U~.
    portable  the LSTM recursion in `keras.ops` (`portable_lstm`), on every backend and
              device: x W + b for all steps at once, then only h U~ inside Keras' time loop.

`kernel="auto"` takes the fused kernel where the backend has one for the call and the
portable loop otherwise; `"fused"` insists (ValueError where none applies); `"portable"`
never tries. `WeightDropLSTM` maps its `use_cudnn` argument onto these ("auto", True,
False) and records the kernel that ran in `layer.last_kernel`, so a benchmark selects a
kernel through the layer's arguments and reads which one ran, without patching anything.
"""

import collections

from keras import ops

from tflm import backends
from tflm.backends import lstm_backward

KERNELS = ("auto", "fused", "portable")

# What the kernels read of an LSTM cell: W (in, 4n), b (4n) or None, U is passed apart (it
# may be DropConnect-ed), and the two activations. `WeightDropLSTM` hands b_ih + b_hh as b.
CellWeights = collections.namedtuple(
    "CellWeights", ["kernel", "bias", "activation", "recurrent_activation"])

LSTMWindow = collections.namedtuple(
    "LSTMWindow", ["last_output", "outputs", "states", "kernel", "xla_compatible"])


def kernel_for_use_cudnn(use_cudnn):
    """The `kernel` argument for a Keras `use_cudnn` value ("auto", True, False)."""
    if use_cudnn == "auto":
        return "auto"
    return "fused" if use_cudnn else "portable"


def lstm_window(cell, sequences, initial_state, mask, recurrent_kernel, *, kernel="auto",
                return_sequences=True, go_backwards=False, unroll=False,
                zero_output_for_mask=True, training=False):
    """Run the LSTM `cell` (a `CellWeights` or a Keras LSTM cell: its kernel W, bias b and
    activations; `recurrent_kernel` as U) over
    `sequences` `(batch, time, features)` from `initial_state` [h, c].

    Returns an `LSTMWindow`: last output, outputs (`(batch, time, units)` when
    `return_sequences`, else `(batch, 1, units)`), final [h, c], the kernel that ran
    ("fused" or "portable") and whether that kernel can run under XLA. `training`: the
    window will be differentiated, so the portable loop takes its written-out backward
    pass where it applies (`lstm_backward`; the same gradients, fewer ops per step).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got {kernel!r}.")
    if kernel != "portable":
        try:
            last, outputs, states, xla = backends.current().fused_lstm(
                cell, sequences, initial_state, mask, recurrent_kernel,
                return_sequences=return_sequences, go_backwards=go_backwards, unroll=unroll)
            return LSTMWindow(last, outputs, states, "fused", xla)
        except NotImplementedError:
            if kernel == "fused":
                raise ValueError(
                    "WeightDropLSTM: use_cudnn=True but no fused (cuDNN) LSTM kernel is "
                    f"available on {backends.current().name} for this layer configuration "
                    "or device; pass use_cudnn='auto' to use the portable loop.") from None
    last, outputs, states = portable_lstm(
        cell, sequences, initial_state, mask, recurrent_kernel,
        return_sequences=return_sequences, go_backwards=go_backwards, unroll=unroll,
        zero_output_for_mask=zero_output_for_mask, written_backward=training)
    return LSTMWindow(last, outputs, states, "portable", True)


def portable_lstm(cell, sequences, initial_state, mask, recurrent_kernel, *,
                  return_sequences=True, go_backwards=False, unroll=False,
                  zero_output_for_mask=True, written_backward=False):
    """The LSTM recursion with a given recurrent matrix (gate order i, f, c, o):

        z_t = (x_t W + b) + h_{t-1} U;   i, f, o = sigma(z_i, z_f, z_o);  g = tanh(z_c)
        c_t = f c_{t-1} + i g;           h_t = o tanh(c_t)

    Masked steps hold the state. Returns `(last_output, outputs, [h, c])`.
    `written_backward`: differentiate through `lstm_backward` where it applies, else
    through autodiff of the loop."""
    kernel = ops.cast(cell.kernel, sequences.dtype)
    recurrent_kernel = ops.cast(recurrent_kernel, sequences.dtype)
    written = written_backward and lstm_backward.applies(cell, return_sequences,
                                                         go_backwards, unroll)
    if written:
        projected = lstm_backward.project_inputs(sequences, kernel, mask)
    else:
        projected = ops.matmul(sequences, kernel)
    if cell.bias is not None:
        projected = projected + ops.cast(cell.bias, sequences.dtype)
    if written:
        return lstm_backward.lstm_with_backward(projected, recurrent_kernel, initial_state,
                                                mask, zero_output_for_mask)

    def step(z_x, states):
        h_prev, c_prev = states
        z = z_x + ops.matmul(h_prev, recurrent_kernel)
        z_i, z_f, z_c, z_o = ops.split(z, 4, axis=-1)
        i = cell.recurrent_activation(z_i)
        f = cell.recurrent_activation(z_f)
        c = f * c_prev + i * cell.activation(z_c)
        h = cell.recurrent_activation(z_o) * cell.activation(c)
        return h, [h, c]

    return backends.current().rnn_loop(step, projected, initial_state, mask=mask,
                                       go_backwards=go_backwards, unroll=unroll,
                                       zero_output_for_mask=zero_output_for_mask,
                                       return_all_outputs=return_sequences)
