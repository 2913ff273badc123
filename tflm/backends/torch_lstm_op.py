"""PyTorch's fused LSTM kernel as an operator `torch.compile` keeps whole (`tflm::lstm`).

Traced by `torch.compile`, `torch.lstm` in training is replaced by PyTorch's decomposition
(`lstm_impl` in its decompositions): the time loop unrolled into a matmul and the gates'
arithmetic per step, forward and backward, with no cuDNN or oneDNN kernel left. At the
AWD-LSTM preset's bptt of 70 that made a compiled step slower than the eager one on the CPU
(8 / 8 wide, one thread: 13.34 against 7.15-9.47 ms, 3,503 ops a step against 1,417;
`bench/training/results/step_profile.md`). As a custom operator
(`torch.library.custom_op`) the fused kernel stays one call in the graph:

    tflm::lstm(x, h0, c0, W_ih, W_hh, b_ih, b_hh) -> (outputs, h_T, c_T)

(one layer, batch first, gate order i, f, c, o, as `torch_lstm.fused_lstm` calls
`torch.lstm`). Its forward runs the kernel without autograd; its backward,
`tflm::lstm_backward`, runs it again with autograd and takes the gradients (a recomputation:
an operator cannot hand autograd's graph from its forward to its backward), for x, h0, c0,
W_ih, W_hh and b_ih; b_hh is the constant zero bias and gets none.
"""

import torch
from torch import Tensor

from tflm import compat


def run(x, h0, c0, w_ih, w_hh, b_ih, b_hh, train):
    """`(outputs, h_T, c_T)` of `torch.lstm` for one batch-first layer (the eager call of
    `torch_lstm.fused_lstm`, and the one inside `lstm` and `lstm_backward`)."""
    outputs, h, c = torch.lstm(
        x, (h0[None], c0[None]), [w_ih, w_hh, b_ih, b_hh],
        True,       # has_biases
        1,          # num_layers
        0.0,        # dropout
        train,      # train
        False,      # bidirectional
        True)       # batch_first
    return outputs, h[0], c[0]


@torch.library.custom_op("tflm::lstm", mutates_args=())
def lstm(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
         b_hh: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`(outputs (B, T, n), h_T (B, n), c_T (B, n))` of one LSTM layer over x (B, T, in)."""
    with torch.no_grad():
        outputs, h, c = run(x, h0, c0, w_ih, w_hh, b_ih, b_hh, train=False)
    # batch first, the kernel's outputs are a (T, B, n) buffer seen transposed: made
    # contiguous, the layout the graph is told (`_lstm_fake`) whatever the device
    return outputs.contiguous(), h, c


@lstm.register_fake
def _lstm_fake(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    n = w_hh.shape[1]
    return (x.new_empty((x.shape[0], x.shape[1], n)), h0.new_empty(h0.shape),
            c0.new_empty(c0.shape))


@torch.library.custom_op("tflm::lstm_backward", mutates_args=())
def lstm_backward(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor,
                  b_ih: Tensor, b_hh: Tensor, d_outputs: Tensor, d_h: Tensor,
                  d_c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of `lstm` for x, h0, c0, W_ih, W_hh and b_ih, given those of its
    three outputs: the forward run again under autograd, then `torch.autograd.grad`."""
    with compat.torch_autograd_inside_operator(), torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (x, h0, c0, w_ih, w_hh, b_ih)]
        outputs = run(*leaves, b_hh.detach(), train=True)
        grads = torch.autograd.grad(outputs, leaves, (d_outputs, d_h, d_c),
                                    allow_unused=True)
    # contiguous whatever the inputs' layouts, as `_lstm_backward_fake` tells the graph
    return tuple(torch.zeros_like(t, memory_format=torch.contiguous_format) if g is None
                 else g.contiguous() for g, t in zip(grads, leaves))


@lstm_backward.register_fake
def _lstm_backward_fake(x, h0, c0, w_ih, w_hh, b_ih, b_hh, d_outputs, d_h, d_c):
    return tuple(t.new_empty(t.shape) for t in (x, h0, c0, w_ih, w_hh, b_ih))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, d_outputs, d_h, d_c):
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = ctx.saved_tensors
    if d_outputs is None:  # an output nothing depended on
        d_outputs = x.new_zeros((x.shape[0], x.shape[1], w_hh.shape[1]))
    d_h = torch.zeros_like(h0) if d_h is None else d_h
    d_c = torch.zeros_like(c0) if d_c is None else d_c
    return (*lstm_backward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, d_outputs, d_h, d_c), None)


lstm.register_autograd(_backward, setup_context=_setup_context)
