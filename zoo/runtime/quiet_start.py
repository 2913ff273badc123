"""A quiet start for the command lines: TensorFlow's start-up lines a user cannot act on are
not printed; Python warnings and our own messages are.

`start()` is the first thing `python -m zoo.train`, `python -m tools.qmatrix` and
`python -m tools.rank --progress` do after parsing their arguments. What it silences, and how
(TensorFlow 2.21 on a machine without a GPU prints the first four lines below on every start):

- ``TF_CPP_MIN_LOG_LEVEL=2`` (set only when the user has not set it) hides TensorFlow's C++
  INFO and WARNING lines once its logging is up: the ``cpu_feature_guard.cc`` note "This
  TensorFlow binary is optimized to use available CPU instructions ..." with its second line
  "To enable the following instructions: AVX2 FMA ...", the oneDNN note "oneDNN custom
  operations are on ...", the "Created device ..." lines. Not 3: C++ ERROR lines of a run
  (after the start) stay visible.
- What TensorFlow prints to stderr while it is imported and while it looks for devices
  comes before (or bypasses) that setting, so `start()` does both with the process's stderr
  (file descriptor 2) sent to a temporary file, then writes back every line except these:
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
        (absl's banner, printed once per shared library that logs before absl is set up)
    "I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not
        be used." (printed on import, twice, whatever TF_CPP_MIN_LOG_LEVEL says)
    "E0000 ... cuda_platform.cc:52] failed call to cuInit: ..." (the device search on a
        machine without a GPU; an ERROR, so level 2 shows it)
    "Unable to register cuDNN / cuFFT / cuBLAS factory", "... computation placer already
        registered", "TF-TRT Warning: Could not find TensorRT" (start-up lines of the GPU
        wheels)
  and the two lines of the CPU-instructions note and the oneDNN note above, should the
  level let them through (TensorFlow 2.21 prints the oneDNN note twice on import, before
  the level applies).
- "E0000 ... util.cc:131] oneDNN supports DT_BOOL only on platforms with AVX-512. Falling
  back to the default Eigen-based implementation if present." comes later, mid-run: an
  ERROR line, so level 2 shows it, printed the first time TensorFlow runs a transpose of
  a boolean tensor on the CPU (a zoo model's evaluation step holds one), on every CPU,
  AVX-512 or not (tensorflow/core/util/util.cc `DataTypeUnsupportedWarning`: oneDNN never
  takes the bool type, and the note names the CPU wrongly). TensorFlow prints it once per
  process (`absl::call_once`), so with Keras on TensorFlow and no GPU `start()` provokes
  it inside the filtered window with one eager transpose of a 1 x 1 boolean tensor (a
  few milliseconds) and drops it there; the run never prints it again. Nothing changes
  for the computation: such a transpose runs on Eigen either way. With a GPU visible it
  is left alone (an eager op would start TensorFlow's GPU context, which takes the GPU's
  memory, before a JAX or PyTorch run or a user's memory settings), and with another
  Keras backend TensorFlow runs nothing that prints it.
  Anything else (a Python warning, an import error, a message no one listed here) is
  written back unchanged.

Nothing is filtered when the user asks for TensorFlow's logs (``TF_CPP_MIN_LOG_LEVEL`` set to
0 or 1), or when TensorFlow is already imported. ``TF_ENABLE_ONEDNN_OPTS`` is left alone (it
changes numerics, and level 2 already hides its note); gRPC (``GRPC_VERBOSITY``) prints
nothing at a start, so it is left alone too.
"""

import contextlib
import os
import re
import sys
import tempfile

from zoo.runtime.allocator import keras_backend_name

LOG_LEVEL = "2"

# The start-up lines `start()` drops (a C++ log line's text, or a whole line).
NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are "
               r"written to STDERR$"),
    re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"),
    re.compile(r"\] failed call to cuInit"),
    re.compile(r"\] Unable to register cu(DNN|FFT|BLAS) factory"),
    re.compile(r"computation placer already registered"),
    re.compile(r"TF-TRT Warning: Could not find TensorRT"),
    re.compile(r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"),
    re.compile(r"port\.cc:\d+\] oneDNN custom operations are on"),
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow with the "
               r"appropriate compiler flags\.$"),
    re.compile(r"util\.cc:\d+\] oneDNN supports DT_\w+ only on platforms with AVX-512"),
)


def set_environment():
    """Set `TF_CPP_MIN_LOG_LEVEL` to 2 unless the user has set it (before TensorFlow loads)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", LOG_LEVEL)


def wants_tensorflow_logs():
    """Whether the user asked for TensorFlow's INFO or WARNING lines (`TF_CPP_MIN_LOG_LEVEL`
    0 or 1): then nothing is filtered."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", LOG_LEVEL).strip() in ("0", "1")


def is_noise(line):
    """Whether `line` (without its newline) is one of the start-up lines in `NOISE`."""
    return any(pattern.search(line) for pattern in NOISE)


def start():
    """`set_environment()`, then import TensorFlow and find its devices with the start-up
    lines in `NOISE` removed from stderr. Cheap when TensorFlow is already imported.

    Where TensorFlow is not installed and Keras runs on PyTorch or JAX (a GPU image with
    those frameworks only), there is nothing to quiet: it returns. With the TensorFlow
    backend the missing module is the user's error, and raises."""
    set_environment()
    if "tensorflow" in sys.modules:
        return
    try:
        with (contextlib.nullcontext() if wants_tensorflow_logs() else filtered_stderr()):
            # deferred: process set-up runs before any framework is imported
            import tensorflow as tf
            tf.config.list_physical_devices()  # CUDA's start-up lines come now, not mid-run
            if keras_backend_name() == "tensorflow" and not tf.config.list_physical_devices(
                    "GPU"):
                provoke_once_only_notes(tf)
    except ModuleNotFoundError as exc:
        if exc.name != "tensorflow" or keras_backend_name() == "tensorflow":
            raise


def provoke_once_only_notes(tf):
    """Make TensorFlow print now, while stderr is filtered, the notes it prints once per
    process and would otherwise print mid-run: oneDNN's DT_BOOL note (see the module
    docstring), provoked by transposing a boolean tensor."""
    tf.transpose(tf.zeros((1, 1), dtype=tf.bool))


@contextlib.contextmanager
def filtered_stderr():
    """Send file descriptor 2 (C++ code's stderr, and Python's) to a temporary file while the
    block runs, then write what it got back to stderr without the lines `is_noise` names,
    also when the block raises. Does nothing when there is no usable descriptor 2."""
    try:
        _flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines(keepends=True)
                    if not is_noise(line.rstrip("\r\n"))]
            if kept and sys.stderr is not None:
                sys.stderr.write("".join(kept))
                _flush()


def _flush():
    if sys.stderr is not None:
        sys.stderr.flush()
