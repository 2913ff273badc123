"""The output layer's GEMMs on oneDNN on an x86 CPU: y = x W^T + b and its two gradients.

PyTorch's CPU matmul and `F.linear` call its BLAS, MKL in the x86 wheels; oneDNN, which
PyTorch also ships (its LSTM kernel runs on it), is reached for float32 only through a
private entry point (`tflm.compat.onednn_linear`). On the 2-core AMD EPYC
(AVX-512) of bench/training/results/reference_throughput.md the three GEMMs of the tied output layer of the 200 / 400
x 3 PTB model, (720 x 200) x (200 x 8,685) forward and both gradients, take 97 ms with
MKL and 41 ms with oneDNN at one thread (49 / 25 ms at two); MKL does not take its
AVX-512 paths on this CPU. The gain is that host's: on 2026-12-07 the same kind of VM
(another host, the same PyTorch 2.13.0) ran the forward and both gradients of a 700 x 200 x
10,000 layer in 108 ms through F.linear and 145 ms through this route at one thread, 69-75
ms either way at two. Choosing the route by timing both would make a run's rounding depend
on the timings; it stays fixed. The same fp32 arithmetic: results agree to float32 rounding
(tests/tflm/backends/test_backend_ops.py, tests/tflm/test_compat.py).

    forward    y = x W^T + b
    backward   dx = dy W,   dW = dy^T x,   db = sum_rows dy

`linear(x, weight, bias)` takes this route for float32 tensors on a CPU of an x86 machine
where PyTorch has oneDNN, outside `torch.autocast` (where F.linear computes in the autocast
dtype) and `torch.compile` (`uses_onednn`), else `torch.nn.functional.linear`. Its
gradient is written out, so it is differentiable once (as every training step and
`window_gradients` need), not twice.
"""

import platform

import torch

from tflm import compat

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def uses_onednn(x, weight, bias=None):
    """Whether `linear(x, weight, bias)` runs on oneDNN: not under `torch.compile`, whose
    traced tensors have no storage for oneDNN's opaque layout to read (and whose compiler
    picks the GEMMs itself)."""
    if torch.compiler.is_compiling():
        return False
    tensors = [x, weight] + ([] if bias is None else [bias])
    return (_X86 and torch.backends.mkldnn.is_available() and x.numel() > 0
            and not torch.is_autocast_enabled("cpu")
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors))


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias):
        ctx.save_for_backward(x2, weight)
        ctx.bias_defined = bias is not None
        return compat.onednn_linear(x2, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        dx, dweight, dbias = compat.onednn_linear_backward(x2, grad, weight, ctx.bias_defined)
        return dx, dweight, dbias


def linear(x, weight, bias=None):
    """`x weight^T + bias` for `x` (..., in), `weight` (out, in), `bias` (out,) or None."""
    if not uses_onednn(x, weight, bias):
        return torch.nn.functional.linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = _OneDNNLinear.apply(x2, weight, bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])
