"""PyTorch's fused LSTM kernel for Keras-layout weights, on any device.

Keras' PyTorch backend calls PyTorch's fused LSTM (cuDNN) only on a GPU; on a CPU it runs
a Python loop with autograd per time step. The same fused op, public as `torch.lstm` (what
`torch.nn.LSTM` calls), runs on a CPU too (one oneDNN kernel for the whole window, forward
and backward), which is what the native reference uses:

    W_ih = kernel^T (4n, in),  W_hh = U~^T (4n, n),  b_ih = b,  b_hh = 0     gates i, f, c, o

(Keras and PyTorch share the gate order.) Gradients reach `kernel`, the dropped recurrent
matrix and `bias` through the transposes, so DropConnect's mask still applies to dU.

Without autograd (evaluation, export) the transposed copies of a weight are kept until the
weight is written again (`TransposeCache`): at batch 1 copying the two matrices was a large
part of a window's time, and evaluation reads the same weights for every window.

Traced by `torch.compile` (`jit_compile=True`) the kernel is called as the operator
`tflm::lstm` (`tflm.backends.torch_lstm_op`), which the graph keeps whole.
"""

import weakref

import torch

from tflm import compat
from tflm.backends import torch_lstm_op


class TransposeCache:
    """`w.T.contiguous()` per weight tensor, reused while the tensor is unchanged: keyed by
    the tensor's identity (an entry goes when its tensor is freed) and valid while the
    tensor's in-place version counter is the one the copy was made at. (Not a
    `WeakKeyDictionary`: it compares keys with `==`, element-wise on tensors.)"""

    def __init__(self):
        self._copies = {}  # id(weight) -> (weakref to weight, version, transposed copy)

    def transposed(self, weight):
        key, version = id(weight), compat.torch_tensor_version(weight)
        hit = self._copies.get(key)
        if hit is not None and hit[0]() is weight and hit[1] == version:
            return hit[2]
        copy = weight.T.contiguous()
        self._copies[key] = (weakref.ref(weight, self._forget(key)), version, copy)
        return copy

    def _forget(self, key):
        copies = self._copies

        def forget(ref):
            entry = copies.get(key)
            if entry is not None and entry[0] is ref:
                del copies[key]
        return forget

    def __len__(self):
        return len(self._copies)


_INFERENCE_TRANSPOSES = TransposeCache()
_ZEROS = {}  # (size, dtype, device) -> a zero vector no op writes to


def _zeros(size, dtype, device):
    """The zero bias b_hh (and b_ih where the layer has no bias): made once per size, dtype
    and device instead of a fill kernel per window. `torch.lstm` only reads it, and it does
    not require gradients, so autograd keeps no gradient for it."""
    key = (size, dtype, device)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(size, dtype=dtype, device=device)
    return _ZEROS[key]


def fused_lstm(inputs, initial_h, initial_c, kernel, recurrent_kernel, bias,
               return_sequences=True):
    """(last output, outputs, [h, c]), as Keras' fused LSTM (`tflm.compat.fused_lstm`)
    returns them.

    Args:
        inputs: `(batch, time, in)` torch tensor.
        initial_h, initial_c: `(batch, n)`.
        kernel: `(in, 4n)`; recurrent_kernel: `(n, 4n)`; bias: `(4n,)` or None.
        return_sequences: outputs `(batch, time, n)` if True, else `(batch, 1, n)`.
    """
    dtype = inputs.dtype
    kernel = kernel.to(dtype)
    recurrent_kernel = recurrent_kernel.to(dtype)
    four_n = recurrent_kernel.shape[1]
    zero_bias = _zeros(four_n, dtype, inputs.device)
    if bias is None:
        bias = zero_bias
    # the gradient must flow through the transposes; a traced graph makes its own
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        w_ih, w_hh = kernel.T.contiguous(), recurrent_kernel.T.contiguous()
    else:
        w_ih = _INFERENCE_TRANSPOSES.transposed(kernel)
        w_hh = _INFERENCE_TRANSPOSES.transposed(recurrent_kernel)
    params = [w_ih, w_hh, bias.to(dtype), zero_bias]
    h0, c0 = initial_h.to(dtype), initial_c.to(dtype)
    if torch.compiler.is_compiling():  # the kernel whole in the graph, not unrolled
        outputs, h, c = torch_lstm_op.lstm(inputs, h0, c0, *params)
    else:
        outputs, h, c = torch_lstm_op.run(inputs, h0, c0, *params,
                                          train=torch.is_grad_enabled())
    last = outputs[:, -1]
    return last, (outputs if return_sequences else last[:, None]), [h, c]
