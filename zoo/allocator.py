"""glibc's malloc set for a training loop: memory a step frees stays with the process.

A training step allocates and frees the same large buffers (the (B, T, V) logits, their
gradient, the saved activations) every step. With glibc's defaults those buffers keep
going back to the operating system and come back as fresh pages, each faulted in again:

- allocations above the mmap threshold (at most 32 MiB) are mmap-ed and unmapped on free;
  the top of the heap is trimmed past `M_TRIM_THRESHOLD`;
- a thread allocates from an arena of its own (up to 8 per core). Its heaps are 64 MiB
  mappings, and a heap that a free leaves empty is unmapped, whatever the trim threshold.
  XLA's CPU client (JAX) allocates on its worker threads: the 200 / 400 x 3 PTB model's
  training step faulted in 31,600 pages (123 MiB) every step, 122 -> 90 ms a step at two
  threads (bench/RESULTS.md) once every thread allocates from the main arena.

`keep_freed_memory(backend)` sets, through `mallopt`:

    M_MMAP_MAX = 0            large blocks come from the heap, not from their own mappings
    M_TRIM_THRESHOLD = 2^31-1 the heap's free top is not returned to the system
    M_ARENA_MAX = 1           (JAX only) every thread allocates from the main arena

The first two are what the benchmarks' `--malloc keep` environment did for every
framework (PyTorch has no caching CPU allocator: the native peer went from 713 to 1,509
words/s with it). One arena is for JAX only: TensorFlow's own thread pools lost 5-13% a
step at two threads to the shared arena's lock, PyTorch neither lost nor gained.

The cost: the process keeps its peak heap for its lifetime (a training run reaches it in
its first steps anyway). Call it first thing, before any framework starts threads (later,
threads already hold arenas of their own). It does nothing on a system without glibc,
leaves alone each setting whose environment variable (`MALLOC_MMAP_MAX_`,
`MALLOC_TRIM_THRESHOLD_`, `MALLOC_ARENA_MAX`) the user set, and everything when
`TFLM_MALLOC=default`.
"""

import ctypes
import ctypes.util
import json
import os
import pathlib
import sys

# mallopt parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
_SETTINGS = {"M_MMAP_MAX": (M_MMAP_MAX, 0, "MALLOC_MMAP_MAX_"),
             "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2 ** 31 - 1, "MALLOC_TRIM_THRESHOLD_"),
             "M_ARENA_MAX": (M_ARENA_MAX, 1, "MALLOC_ARENA_MAX")}
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
    """Set glibc's malloc so freed memory is reused, not returned (see the module).
    `backend`: the Keras backend (default `keras_backend_name()`). Returns the settings
    made, `{name: value}` (empty where nothing was set)."""
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return {}
    libc = _glibc()
    if libc is None:
        return {}
    backend = backend or keras_backend_name()
    made = {}
    for name, (param, value, env) in _SETTINGS.items():
        if name == "M_ARENA_MAX" and backend != "jax":
            continue
        if env in os.environ:  # the user's own setting wins
            continue
        if libc.mallopt(param, value) == 1:
            made[name] = value
    _made.update(made)
    return made


def settings_made():
    """What `keep_freed_memory` has set in this process so far, `{name: value}`."""
    return dict(_made)
