"""PyTorch's fused LSTM kernel for Keras-layout weights, on any device.

Keras' PyTorch backend calls PyTorch's fused LSTM (cuDNN) only on a GPU; on a CPU it runs
a Python loop with autograd per time step. The same fused op, public as `torch.lstm` (what
`torch.nn.LSTM` calls), runs on a CPU too (one oneDNN kernel for the whole window, forward
and backward), which is what the native reference uses:

    W_ih = kernel^T (4n, in),  W_hh = U~^T (4n, n),  b_ih = b,  b_hh = 0     gates i, f, c, o

(Keras and PyTorch share the gate order.) Gradients reach `kernel`, the dropped recurrent
matrix and `bias` through the transposes, so DropConnect's mask still applies to dU.
"""


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
    import torch

    dtype = inputs.dtype
    kernel = kernel.to(dtype)
    recurrent_kernel = recurrent_kernel.to(dtype)
    four_n = recurrent_kernel.shape[1]
    if bias is None:
        bias = torch.zeros(four_n, dtype=dtype, device=inputs.device)
    params = [kernel.T.contiguous(), recurrent_kernel.T.contiguous(), bias.to(dtype),
              torch.zeros(four_n, dtype=dtype, device=inputs.device)]
    outputs, h, c = torch.lstm(
        inputs, (initial_h.to(dtype)[None], initial_c.to(dtype)[None]), params,
        True,                      # has_biases
        1,                         # num_layers
        0.0,                       # dropout
        torch.is_grad_enabled(),   # train
        False,                     # bidirectional
        True)                      # batch_first
    last = outputs[:, -1]
    return last, (outputs if return_sequences else last[:, None]), [h[0], c[0]]
