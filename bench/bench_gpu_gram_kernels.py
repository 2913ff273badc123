"""The Gram route's kernels on a GPU, one at a time (bench/RESULTS_gpu.md, issue 17).

Times, as the minimum of a few repeats after a warm-up: the float64 symmetric eigensolver on
a 10,000 x 10,000 Gram matrix through torch (its default library, cuSOLVER, MAGMA) and
CuPy; 161 block updates G += B^T B of 512 x 10,000 float32 blocks copied from pageable host
memory and widened to float64 (the PTB-test matrix's 82,430 rows), torch and CuPy; and the
161 host-to-device copies alone. Prints one line per measurement (seconds). Needs torch
with CUDA and CuPy; run on the lent GPU machine:

    python bench/bench_gpu_gram_kernels.py
"""
import time, numpy as np, torch, cupy
def t(fn, sync, n=3):
    fn(); sync(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t0)
    return min(ts)
ts = torch.cuda.synchronize
cs = cupy.cuda.Device().synchronize
n = 10000
a = torch.randn(n, n, dtype=torch.float64, device="cuda"); g = a @ a.T
print("torch pref", torch.backends.cuda.preferred_linalg_library())
print("torch eigvalsh default", t(lambda: torch.linalg.eigvalsh(g), ts, 2))
torch.backends.cuda.preferred_linalg_library("cusolver")
print("torch eigvalsh cusolver", t(lambda: torch.linalg.eigvalsh(g), ts, 2))
torch.backends.cuda.preferred_linalg_library("magma")
print("torch eigvalsh magma", t(lambda: torch.linalg.eigvalsh(g), ts, 2))
torch.backends.cuda.preferred_linalg_library("default")
gc = cupy.asarray(g.cpu().numpy())
print("cupy eigvalsh", t(lambda: cupy.linalg.eigvalsh(gc), cs, 2))
host = np.random.default_rng(0).standard_normal((512, n), dtype=np.float32)
G = torch.zeros(n, n, dtype=torch.float64, device="cuda")
def add_t():
    x = torch.from_numpy(host).to("cuda").to(torch.float64); G.add_(x.T @ x)
print("torch add block x161", 161 * t(add_t, ts, 5))
Gc = cupy.zeros((n, n), cupy.float64)
def add_c():
    global Gc
    x = cupy.asarray(host).astype(cupy.float64); Gc += x.T @ x
print("cupy add block x161", 161 * t(add_c, cs, 5))
print("h2d only torch x161", 161 * t(lambda: torch.from_numpy(host).to("cuda"), ts, 5))
