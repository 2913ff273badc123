"""glibc's malloc set for a training loop: memory a step frees stays with the process.

A training step allocates and frees the same large buffers (the (B, T, V) logits, their
gradient, the saved activations) every step. With glibc's defaults those buffers keep
going back to the operating system and come back as fresh pages, each faulted in again:

- allocations above the mmap threshold (at most 32 MiB) are mmap-ed and unmapped on free;
  the top of the heap is trimmed past `M_TRIM_THRESHOLD`;
- a thread allocates from an arena of its own (up to 8 per core), whose heaps are 64 MiB
  mappings: a heap that a free leaves empty is unmapped, whatever the trim threshold, and a
  block larger than a heap is mmap-ed even with `M_MMAP_MAX` = 0 (glibc 2.36's fallback for
  a thread's own arena), then unmapped on free.

`keep_freed_memory(backend)` sets, through `mallopt`:

    M_MMAP_MAX = 0            large blocks come from the heap, not from their own mappings
    M_TRIM_THRESHOLD = 2^31-1 the heap's free top is not returned to the system

and on JAX, `jax_cpu_enable_async_dispatch = False`: JAX's CPU client runs each program on
the thread that calls it (Keras' training loop, on the main arena) instead of its worker
threads. XLA allocates a program's temporary buffer, one block, on the thread that runs it:
for the 200 / 400 x 3 PTB model's train step 118,112,256 bytes, which on a worker thread's
arena was mmap-ed and unmapped every step (strace), 28,800 pages (113 MiB) faulted in afresh:
a step of 123-145 ms against 99-104 ms at two threads (bench/training/results/reference_throughput.md).

The first fix was one arena for every thread (`M_ARENA_MAX` = 1). It stopped the faults but
made XLA's compiler threads take turns at the arena's lock: the train step compiled in
1.6-2.4 s at two threads, 9,500-34,000 voluntary context switches, against 1.4-1.5 s and
about 100 with glibc's arenas. Run inline, the program needs neither: seven interleaved pairs
of `python -m zoo.train` (one epoch of bench/training/reference_throughput.py's configuration, two threads) gave a
training loop of 14.49-16.89 s (median 14.78) against 14.90-16.45 s (median 15.41) with one
arena, a first step of 2.18-2.51 s against 2.40-2.83 s, and a peak memory of 1.18 GB against
1.44 GB; the same validation perplexity. What inline runs give up, Python's work for the
next step overlapping the running one, did not show: the other steps took 12.30-14.44 s
(median 12.50) against 12.50-13.88 s (median 12.87).

The two malloc settings are what the benchmarks' `--malloc keep` environment did for every
framework (PyTorch has no caching CPU allocator: the native peer went from 713 to 1,509
words/s with it).

The cost: the process keeps its peak heap for its lifetime (a training run reaches it in
its first steps anyway). Call it first thing, before any framework starts threads or JAX
its backend. It leaves alone each malloc setting whose environment variable
(`MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_`) the user set, JAX's dispatch where the
installed JAX has no such flag or its backend has started, and everything when
`TFLM_MALLOC=default`; the malloc settings need glibc.
"""

import ctypes
import ctypes.util
import importlib.util
import json
import os
import pathlib
import sys

# mallopt parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
_SETTINGS = {"M_MMAP_MAX": (M_MMAP_MAX, 0, "MALLOC_MMAP_MAX_"),
             "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2 ** 31 - 1, "MALLOC_TRIM_THRESHOLD_")}
JAX_ASYNC_DISPATCH = "jax_cpu_enable_async_dispatch"
OPT_OUT = "TFLM_MALLOC"
_made = {}


def _glibc():
    """glibc as a `ctypes.CDLL`, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only (not musl)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def keras_backend_name():
    """The Keras backend this process will run, read as Keras reads it
    (`KERAS_BACKEND`, else `backend` in `$KERAS_HOME/keras.json` or `~/.keras/keras.json`,
    else TensorFlow), without importing Keras (which would start the framework)."""
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "backend"):
        return sys.modules["keras"].backend.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    try:
        return json.loads((pathlib.Path(home) / "keras.json").read_text()).get(
            "backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def keep_freed_memory(backend=None):
    """Set glibc's malloc so freed memory is reused, not returned, and on JAX run CPU
    programs inline (see the module). `backend`: the Keras backend (default
    `keras_backend_name()`). Returns the settings made, `{name: value}` (empty where nothing
    was set)."""
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return {}
    made = {}
    libc = _glibc()
    for name, (param, value, env) in _SETTINGS.items():
        if libc is None or env in os.environ:  # the user's own setting wins
            continue
        if libc.mallopt(param, value) == 1:
            made[name] = value
    if (backend or keras_backend_name()) == "jax" and _run_jax_cpu_programs_inline():
        made[JAX_ASYNC_DISPATCH] = False
    _made.update(made)
    return made


def jax_backend_started():
    """Whether JAX has started its backend (without importing tflm where JAX is not loaded:
    before a run starts, importing Keras would start the framework's imports too early)."""
    if "jax" not in sys.modules:
        return False
    # deferred: process set-up runs before any framework is imported
    from tflm.compat import jax_backend_started as started
    return started()


def _run_jax_cpu_programs_inline():
    """JAX's CPU client runs each program on the calling thread (its flag is read when the
    backend starts). False where JAX is not installed, has no such flag, or has started."""
    if jax_backend_started() or importlib.util.find_spec("jax") is None:
        return False
    # deferred: process set-up runs before any framework is imported
    import jax
    if JAX_ASYNC_DISPATCH not in jax.config.values:
        return False
    jax.config.update(JAX_ASYNC_DISPATCH, False)
    return True


def settings_made():
    """What `keep_freed_memory` has set in this process so far, `{name: value}`."""
    return dict(_made)
