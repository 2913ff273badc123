"""The streamed Gram route of `tools.spectrum` (method "gram") on a GPU, with torch or CuPy.

    G = sum over row blocks B of  B^T B   (float64),      s_i = sqrt(max(lambda_i(G), 0))

Each block of Q (float16 / float32, read from the `.npy` file on the host) is copied to the
device, widened to float64 there (exactly), and its b x N rows give one scratch product
B^T B (cuBLAS DGEMM: the b-term sums in any order, at most b - 1 roundings on a product's
path), which is then added to G once: the depth d = b + ceil(M / b) of the CPU route's
error bound holds unchanged (`tools.spectrum` module docstring), and so does its floor.
The eigenvalues come from the symmetric eigensolver of the GPU library (cuSOLVER
``syevd`` through ``torch.linalg.eigvalsh`` or ``cupy.linalg.eigvalsh``), backward stable
like LAPACK's, so the bound's second step (p(N) = N) holds too.

The full product B^T B is formed (2 b N^2 flops, not dsyrk's b N^2): torch has no rank-k
update, and on the H200 of bench/analysis/results/gpu_rank_tools.md (float64 GEMM at 54
TFLOP/s) the 161 block products of the PTB-test matrix took 0.76-1.0 s, against 0.53 s just
to copy Q from the host. Each block crosses to the device in its own dtype and is widened
there: half the bytes of widening it on the host. The GPU holds G, the scratch product and
one block: 2 N^2 + b N float64 numbers (1.6 GB at N = 10,000).

`accumulator(backend, n, torch_device)` returns an object with ``add(rows)``,
``trace_and_frobenius()`` and ``eigenvalues()`` (ascending, NumPy float64); the torch one
also runs on a CPU device, which is how the tests check it without a GPU.
"""

import numpy as np


class TorchGram:
    """G = sum B^T B in float64 on a torch device ("cuda", or "cpu" for the tests)."""

    def __init__(self, n, device="cuda"):
        import torch  # deferred: an optional GPU library
        self._torch = torch
        self.device = torch.device(device)
        self.g = torch.zeros((n, n), dtype=torch.float64, device=self.device)

    def add(self, rows):
        torch = self._torch
        x = torch.from_numpy(np.ascontiguousarray(rows)).to(self.device)
        x = x.to(torch.float64)  # float16 / float32 -> float64 is exact
        self.g += x.T @ x        # the block's sums land in a scratch product, added once

    def trace_and_frobenius(self):
        torch = self._torch
        return (float(torch.trace(self.g)), float(torch.linalg.matrix_norm(self.g)))

    def eigenvalues(self):
        lam = self._torch.linalg.eigvalsh(self.g)
        self.g = None
        return lam.cpu().numpy()


class CupyGram:
    """G = sum B^T B in float64 on the current CuPy device."""

    def __init__(self, n):
        import cupy  # deferred: an optional GPU library
        self._cupy = cupy
        self.g = cupy.zeros((n, n), dtype=cupy.float64)

    def add(self, rows):
        cupy = self._cupy
        x = cupy.asarray(np.ascontiguousarray(rows)).astype(cupy.float64)
        self.g += x.T @ x

    def trace_and_frobenius(self):
        cupy = self._cupy
        return float(cupy.trace(self.g)), float(cupy.linalg.norm(self.g))

    def eigenvalues(self):
        lam = self._cupy.linalg.eigvalsh(self.g)
        self.g = None
        return self._cupy.asnumpy(lam)


def accumulator(backend, n, torch_device=None):
    """A Gram accumulator for an n-column stream: `backend` "torch" (on `torch_device`,
    default "cuda") or "cupy"."""
    if backend == "torch":
        return TorchGram(n, torch_device or "cuda")
    if backend == "cupy":
        return CupyGram(n)
    raise ValueError(f"backend must be 'torch' or 'cupy', got {backend!r}")
