"""What a worker measures besides its steps: memory, the device, the GEMM rate, versions.

The frameworks are imported inside the functions that need them: a worker loads only its
own (Keras with one backend, or PyTorch alone), and the parent none.
"""

import os
import platform
import time

import numpy as np

from tools.frameworks.machine import cpu_model, peak_rss_mib
from zoo.runtime import device_memory


class Skip(Exception):
    """The backend cannot run here (not an error of the tool): reported as skipped."""


def cpu_description():
    return f"CPU ({cpu_model()}, {os.cpu_count()} cores)"


def numpy_matmul_rate(n=1024, repeats=5):
    """float32 GEMM rate of this process on the CPU (FLOP/s): median of `repeats` n^3."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / float(np.median(times))


def torch_cuda_matmul_rate(dtype_name="float32", n=4096, repeats=10):
    import torch  # deferred: this worker's framework only
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / float(np.median(times))


def gpu_matmul_rate(precision):
    """The torch GEMM rate on the GPU in the run's precision, or None without CUDA."""
    try:
        return torch_cuda_matmul_rate("bfloat16" if precision == "mixed_bfloat16"
                                      else "float32")
    except Exception:  # torch missing or no CUDA build: no GPU rate
        return None


def keras_device(backend, device):
    """(on_gpu, device name) for a Keras backend; raises Skip if a GPU was asked for and
    this framework sees none."""
    if backend == "tensorflow":
        import tensorflow as tf  # deferred: this worker's framework only
        gpus = tf.config.list_physical_devices("GPU")
        name = gpus[0].name if gpus else None
    elif backend == "jax":
        import jax  # deferred: this worker's framework only
        devs = [d for d in jax.devices() if d.platform == "gpu"]
        name = devs[0].device_kind if devs else None
    else:
        import torch  # deferred: this worker's framework only
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    if device == "gpu" and name is None:
        raise Skip(f"--device gpu: no GPU visible to {backend}")
    if device == "gpu":
        return True, name
    return False, cpu_description()


def add_memory(result, framework, on_gpu, rss_after_imports=None):
    """Peak memory into `result`: the GPU allocator's peak on a GPU, else the peak RSS.

    The peak RSS (`ru_maxrss`) is the whole process's: the Python runtime, the framework
    and whatever it imported, its thread pools, and the memory glibc keeps under
    `--malloc keep`. `rss_after_imports` (MiB, measured before the worker loads data or
    builds the model) gives what the run itself added: `peak_rss_added_mib` = peak RSS -
    RSS after imports."""
    result["peak_rss_mib"] = peak_rss_mib()
    if rss_after_imports is not None:
        result["rss_after_imports_mib"] = rss_after_imports
        result["peak_rss_added_mib"] = result["peak_rss_mib"] - rss_after_imports
    if on_gpu:
        result["peak_memory_mib"] = device_memory.peak_mib(framework)
        result["memory_kind"] = "GPU allocator peak"
    else:
        result["peak_memory_mib"] = result["peak_rss_mib"]
        result["memory_kind"] = "peak RSS"


def versions(framework):
    out = {"python": platform.python_version(), "numpy": np.__version__}
    if framework in ("tensorflow", "jax", "torch"):
        import keras  # deferred: this worker's framework only
        out["keras"] = keras.__version__
    if framework == "tensorflow":
        import tensorflow as tf  # deferred: this worker's framework only
        out["tensorflow"] = tf.__version__
    elif framework == "jax":
        import jax  # deferred: this worker's framework only
        import jaxlib  # deferred: this worker's framework only
        out["jax"] = jax.__version__
        out["jaxlib"] = jaxlib.__version__
    else:
        import torch  # deferred: this worker's framework only
        out["torch"] = torch.__version__
    return out


def set_threads(framework, threads):
    """Pin the framework's CPU thread pools to `threads` (0: leave the defaults).

    The environment (OMP/MKL/OpenBLAS, TF_NUM_*, XLA_FLAGS) is set by the parent before this
    process starts; the calls below make it explicit where a framework has an API."""
    n = int(threads or 0)
    if not n:
        return
    if framework in ("torch", "torch-native"):
        import torch  # deferred: this worker's framework only
        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError:  # already set (parallel work started)
            pass
    elif framework == "tensorflow":
        import tensorflow as tf  # deferred: this worker's framework only
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)
