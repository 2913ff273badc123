"""XLA's CPU compiler set for a JAX run: the same programs, compiled in less time.

On a CPU, JAX's first training step is mostly XLA compiling the train step; a short run
(one epoch of 100,000 PTB tokens, `python -m bench.training.reference_throughput`) spends a fifth of
its training loop there. Two flags take a quarter or more of that compile away and leave the
steps as fast as they were (the 200 / 400 x 3 AWD-LSTM on the 2-core AMD EPYC of
bench/RESULTS.md in git history, jaxlib 0.10.2):

    --xla_cpu_use_fusion_emitters=false
        XLA:CPU emits its loop fusions through MLIR fusion emitters by default; this sends
        them through its older LLVM IR emitters. Train step compile at two threads
        2.40-2.46 -> 1.93-1.97 s (4.0-4.5 -> 2.4-3.4 s inside `zoo.train`, whose single
        malloc arena slowed compiling then: `zoo.runtime.allocator`); the first step at one thread
        5.3-5.6 -> 3.9-4.2 s;
        the steps after it 175.9 / 180.0 against 175.8 / 182.1 ms at one thread.
    --xla_backend_optimization_level=2      (CPU-only runs)
        LLVM's -O2 pipeline instead of -O3 (the vectorizers stay; fast-math stays off at
        every level). On top of the first flag, compile 1.95 / 2.06 -> 1.73 / 1.86 s;
        `zoo.train` at two threads, three interleaved pairs: training loop 17.35-17.98 ->
        16.58-17.09 s, first step 3.1-3.9 -> 2.8-3.3 s; steps 93.8 / 99.5 against 95.5 /
        94.5 ms at two threads, 148.0 / 135.4 against 141.4 / 142.2 ms at one; a large
        elementwise fusion (log_softmax(3 tanh(x) + sigmoid(x)) over 700 x 10,000) 10.8 ms
        at -O3 and 10.1-10.5 ms at -O2 on one CPU.

Either changes code generation, not the program: a step's results agree to float32
rounding. Training amplifies last-digit differences: one epoch of the configuration above
ended at validation perplexity 744 with the first flag and 706 with both (two runs of one
seed that differed in summation order only ended at 761 and 786, bench/RESULTS.md in git history).

`fast_cpu_compiles(backend)` adds each flag to `XLA_FLAGS` when

- the Keras backend is JAX (TensorFlow reads `XLA_FLAGS` too, for its own XLA);
- the installed jaxlib is one the flags were measured on (`VERIFIED_JAXLIB`): an
  `XLA_FLAGS` entry XLA does not know ends the process, and XLA is retiring the older
  emitters;
- `XLA_FLAGS` does not name that flag already (the user's setting wins);
- for the optimization level, JAX can only run on the CPU (`JAX_PLATFORMS=cpu`, or no GPU
  or TPU plugin installed): the level applies to GPU code generation too, unmeasured here;
- `TFLM_XLA_FLAGS` is not `default` (which leaves `XLA_FLAGS` alone);
- JAX has not started its backend yet: XLA reads `XLA_FLAGS` once, then (the first array or
  device query, not `import jax`), so a later flag would change nothing.

`zoo.train`, `zoo.evaluate` and `tools.qmatrix` call it first thing. In your own
`model.fit` script, call it before the first JAX array.
"""

import importlib.metadata
import importlib.util
import os

from zoo.runtime.allocator import jax_backend_started as _jax_backend_started
from zoo.runtime.allocator import keras_backend_name

FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
OPTIMIZATION_LEVEL = "--xla_backend_optimization_level=2"
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
    """Whether the installed jaxlib is one the flags were measured on (`VERIFIED_JAXLIB`)."""
    version, (first, last) = _jaxlib_version(), VERIFIED_JAXLIB
    return version is not None and first <= version < last


def cpu_only():
    """Whether JAX can only run on the CPU here: `JAX_PLATFORMS` names the CPU alone, or no
    GPU / TPU plugin is installed (PJRT plugins live in the `jax_plugins` namespace; the
    older CUDA wheels and libtpu in packages of their own)."""
    platforms = [p.strip().lower() for p in os.environ.get("JAX_PLATFORMS", "").split(",")
                 if p.strip()]
    if platforms:
        return platforms == ["cpu"]
    return not any(importlib.util.find_spec(name) is not None for name in (
        "jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu"))


def fast_cpu_compiles(backend=None):
    """Add the module's flags to `XLA_FLAGS` where it says; returns the flags added."""
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return []
    if (backend or keras_backend_name()) != "jax" or not jaxlib_verified():
        return []
    if _jax_backend_started():
        return []
    wanted = [FUSION_EMITTERS] + ([OPTIMIZATION_LEVEL] if cpu_only() else [])
    flags = os.environ.get("XLA_FLAGS", "")
    named = {entry.split("=")[0] for entry in flags.split()}
    added = [flag for flag in wanted if flag.split("=")[0] not in named]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([flags] + added).strip()
        _added.extend(added)
    return added


def flags_added():
    """What `fast_cpu_compiles` has added to `XLA_FLAGS` in this process so far."""
    return list(_added)
