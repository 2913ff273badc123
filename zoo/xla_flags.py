"""XLA's CPU compiler set for a JAX run: the same programs, compiled in less time.

On a CPU, JAX's first training step is mostly XLA compiling the train step; a short run
(one epoch of 100,000 PTB tokens, `bench/bench_reference_throughput.py`) spends a fifth of
its training loop there. XLA:CPU emits its loop fusions through MLIR fusion emitters by
default; `--xla_cpu_use_fusion_emitters=false` sends them through its older LLVM IR emitters
instead. On the 2-core AMD EPYC of bench/RESULTS.md (jaxlib 0.10.2) that took the
200 / 400 x 3 AWD-LSTM's train step compile from 2.40-2.46 to 1.93-1.97 s at two threads
(from 4.0-4.5 to 2.4-3.4 s inside `zoo.train`, whose single malloc arena slows compiling),
its first step from 5.3-5.6 to 3.9-4.2 s at one thread, and each step after it not at all
(175.9 / 180.0 against 175.8 / 182.1 ms at one thread, 115-122 against 114-115 ms at two).

`fast_cpu_compiles(backend)` adds that flag to `XLA_FLAGS` when

- the Keras backend is JAX (TensorFlow reads `XLA_FLAGS` too, for its own XLA);
- the installed jaxlib is one the flag was measured on (`VERIFIED_JAXLIB`): an `XLA_FLAGS`
  entry XLA does not know ends the process, and XLA is retiring the older emitters;
- `XLA_FLAGS` does not name the flag already (the user's setting wins);
- `TFLM_XLA_FLAGS` is not `default` (which leaves `XLA_FLAGS` alone);
- JAX has not started its backend yet: XLA reads `XLA_FLAGS` once, then (the first array or
  device query, not `import jax`), so a later flag would change nothing.

`zoo.train`, `zoo.evaluate` and `tools.qmatrix` call it first thing. In your own
`model.fit` script, call it before the first JAX array.
The flag changes code generation, not the program: results agree to float32 rounding.
"""

import importlib.metadata
import os
import sys

from zoo.allocator import keras_backend_name

FLAG = "--xla_cpu_use_fusion_emitters=false"
VERIFIED_JAXLIB = ((0, 10), (0, 11))  # [first, last) (major, minor) measured
OPT_OUT = "TFLM_XLA_FLAGS"
_added = []


def _jaxlib_version():
    """jaxlib's (major, minor), or None when jaxlib is not installed or its version unreadable."""
    try:
        parts = importlib.metadata.version("jaxlib").split(".")
        return int(parts[0]), int(parts[1])
    except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
        return None


def jaxlib_verified():
    """Whether the installed jaxlib is one the flag was measured on (`VERIFIED_JAXLIB`)."""
    version, (first, last) = _jaxlib_version(), VERIFIED_JAXLIB
    return version is not None and first <= version < last


def _jax_backend_started():
    """Whether JAX has started its backend (without importing tflm where JAX is not loaded:
    before a run starts, importing Keras would start the framework's imports too early)."""
    if "jax" not in sys.modules:
        return False
    from tflm.compat import jax_backend_started
    return jax_backend_started()


def fast_cpu_compiles(backend=None):
    """Add `FLAG` to `XLA_FLAGS` where the module says; returns the flags added (a list)."""
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return []
    if (backend or keras_backend_name()) != "jax":
        return []
    if not jaxlib_verified():
        return []
    flags = os.environ.get("XLA_FLAGS", "")
    name = FLAG.split("=")[0]
    if any(entry.split("=")[0] == name for entry in flags.split()):
        return []
    if _jax_backend_started():
        return []
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    _added.append(FLAG)
    return [FLAG]


def flags_added():
    """What `fast_cpu_compiles` has added to `XLA_FLAGS` in this process so far."""
    return list(_added)
