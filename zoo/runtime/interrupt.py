"""Ctrl-C during `python -m zoo.train`: training stops at the next safe point, not at
whatever line of TensorFlow's Python code the signal happens to land on.

Python raises `KeyboardInterrupt` where the main thread is when SIGINT arrives. Inside
TensorFlow (tf.function tracing, tf.data, iterator clean-up) that exception is sometimes
swallowed, so training just goes on, or leaves native state half-made, so the process dies
with a segmentation fault before it can say where its checkpoint is (TensorFlow 2.21: about
2 in 100 interrupts of the tiny synthetic run). So:

- `handle_ctrl_c()` (around a command line's `main`: `zoo.runtime.command.run_command`)
  installs a SIGINT handler. Outside a `deferring()` block it raises `KeyboardInterrupt`
  at once, as Python does.
- `deferring()` (zoo.runs.training, around building, training and evaluating the model) makes
  the first Ctrl-C only a request; `check()` raises it at a safe point: `CheckCtrlC` calls
  it after every training and evaluation batch and at every epoch's start and end, the
  training loop after each checkpoint. A second Ctrl-C raises at once. A request still
  waiting when the block ends (the run finished meanwhile) is dropped.

Without `handle_ctrl_c()` (a library user, the tests calling `main()` in process) Python's
own SIGINT handling is untouched and `check()` never raises.
"""

import contextlib
import signal
import threading

_state = {"installed": False, "deferring": False, "requested": False}


def _on_sigint(signum, frame):
    if _state["deferring"] and not _state["requested"]:
        _state["requested"] = True  # raised by check() at the next safe point
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def handle_ctrl_c():
    """Install the SIGINT handler for the block (main thread only, and only where SIGINT is
    not ignored: a run started with SIGINT ignored stays so)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    _state.update(installed=True, deferring=False, requested=False)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _state.update(installed=False, deferring=False, requested=False)


@contextlib.contextmanager
def deferring():
    """Within the block a first Ctrl-C waits for `check()` (when `handle_ctrl_c()` is on)."""
    outer = _state["deferring"]
    _state["deferring"] = True
    try:
        yield
    finally:
        _state["deferring"] = outer
        if not outer:
            _state["requested"] = False


def check():
    """A safe point: raise `KeyboardInterrupt` if a Ctrl-C is waiting."""
    if _state["requested"]:
        _state["requested"] = False
        raise KeyboardInterrupt


def CheckCtrlC():  # noqa: N802 - a Keras callback, named as one
    """A Keras callback that calls `check()` after every batch of fit / evaluate and at the
    start and end of every epoch. Async-safe (`tflm.callbacks`): where Keras runs the batch
    hooks on a worker thread, the `KeyboardInterrupt` reaches the loop at its next batch or
    at the epoch's end, still a safe point."""
    # deferred: process set-up runs before any framework is imported
    import keras

    class _CheckCtrlC(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_end(self, batch, logs=None):
            check()

        def on_test_batch_end(self, batch, logs=None):
            check()

        def on_epoch_begin(self, epoch, logs=None):
            check()

        def on_epoch_end(self, epoch, logs=None):
            check()

    return _CheckCtrlC()
