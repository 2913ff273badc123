"""JAX's persistent compilation cache for training runs: a rerun skips the compiles.

On JAX every distinct window shape compiles the train step anew (AWD-LSTM's random window
lengths make about a dozen shapes an epoch, `tflm.data.default_pad_to_multiple`). On the
2-core CPU of bench/training/results/reference_throughput.md one compile took ~4.6 s, so a one-epoch run of the
200 / 400 x 3 model spent ~50 s of its ~100 s training loop compiling; with the cache
filled by an earlier run of the same configuration those first steps took ~1 s each
(tracing and loading). Any later run with the same model shape and window lengths (another
seed, a resumed or repeated run, a sweep over learning rates) reuses the compiled programs.

    TFLM_JAX_CACHE_DIR   where the cache lives (default ~/.cache/tflm/jax-compilation);
                         "off" (or empty) disables it
"""

import os
import pathlib

ENV = "TFLM_JAX_CACHE_DIR"
DEFAULT = pathlib.Path("~/.cache/tflm/jax-compilation")


def cache_dir():
    """The cache folder `TFLM_JAX_CACHE_DIR` names (None when it says "off" or "")."""
    value = os.environ.get(ENV)
    if value is None:
        return DEFAULT.expanduser()
    if value.strip().lower() in ("", "off"):
        return None
    return pathlib.Path(value).expanduser()


def enable():
    """Point JAX's persistent compilation cache at `cache_dir()` when the Keras backend is
    JAX; returns the folder used (None: another backend, or disabled)."""
    # deferred: process set-up runs before any framework is imported
    import keras
    if keras.backend.backend() != "jax":
        return None
    folder = cache_dir()
    if folder is None:
        return None
    # deferred: process set-up runs before any framework is imported
    import jax
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Every program, not only those that took JAX's default 1 s to compile: a run also
    # compiles dozens of small ones (each weight initializer's shape, the evaluation
    # steps), 0.2 s each on the CPU of bench/training/results/reference_throughput.md, 1.4-1.6 s of the PTB model's build.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return folder
