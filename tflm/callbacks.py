"""Training callbacks: throughput, bits per character, divergence guard, progress of a loop
of `fit` calls.

The callbacks here with batch hooks are async-safe (`async_safe = True`). On the backends
Keras marks thread-safe (JAX, PyTorch), a `fit` / `evaluate` whose callbacks all are runs the
batch-end hooks on a worker thread: the loop dispatches the next step without waiting for
this one's logs, so the Python work between steps (the next batch, the callbacks, the
dispatch) can overlap the step (on an accelerator, or on CPU cores the step leaves idle)
instead of adding to it. Async-safe means: no access to
`self.model` (on JAX that writes the state back to the variables mid-step) and correct when
calls come concurrently or out of order. An exception raised in a hook reaches `fit` at the
next batch, or at the end of the epoch before any `on_epoch_end` runs. `HookThreads` tells
on which thread a `fit`'s hooks ran.
"""

import math
import threading
import time

import keras


class TrainingDiverged(RuntimeError):
    """The loss or the perplexity (training or validation) became NaN or infinite."""


class WordsPerSecond(keras.callbacks.Callback):
    """Adds the epoch's training throughput and where its time went to the epoch logs:

        words_per_second     training tokens / seconds of the training loop (validation
                             excluded, as salesforce/awd-lstm-lm's ms/batch excludes it)
        train_seconds        epoch begin -> the end of the last training batch
        first_step_seconds   epoch begin -> the end of the first batch (tracing / compiling
                             the step lands here on TensorFlow and JAX; the first k
                             batches with `steps_per_execution` k)
        train_steps          the training batches of the epoch
        validation_seconds   `fit`'s validation pass (0 without validation data)
        epoch_seconds        epoch begin -> epoch end (all of the above)

    Place it before `keras.callbacks.TensorBoard` in the callback list so the figures are
    logged. `tokens_per_epoch` is batch size x number of target positions.

    Async-safe: a batch ends when its logs are ready (Keras converts them before calling
    the hook, on the worker thread too), and the last of those times ends the loop.
    """

    async_safe = True

    def __init__(self, tokens_per_epoch):
        super().__init__()
        self.tokens_per_epoch = int(tokens_per_epoch)
        self.last = None
        self._lock = threading.Lock()
        self._start = self._first = self._last_batch = self._test_start = self._test_end = None
        self._steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._first = self._last_batch = self._test_start = self._test_end = None
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:  # so the last call sets the end of the loop
            self._last_batch = time.perf_counter()
            # with steps_per_execution k a call ends k batches (`batch` is the last one's
            # index; past the epoch's end in its last, shorter group)
            steps = (self.params or {}).get("steps")
            self._steps = max(self._steps, batch + 1 if steps is None else min(batch + 1,
                                                                               steps))
            if self._first is None:
                self._first = self._last_batch - self._start

    def on_test_begin(self, logs=None):
        if self._last_batch is not None:  # fit's validation, not a standalone evaluate
            self._test_start = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._test_start is not None:
            self._test_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        seconds = end - self._start
        train = (self._last_batch or end) - self._start
        self.last = self.tokens_per_epoch / max(train, 1e-9)
        if logs is not None:
            logs["words_per_second"] = self.last
            logs["epoch_seconds"] = seconds
            logs["train_seconds"] = train
            logs["first_step_seconds"] = self._first or 0.0
            logs["train_steps"] = self._steps
            logs["validation_seconds"] = ((self._test_end or end) - self._test_start
                                          if self._test_start is not None else 0.0)


class HookThreads(keras.callbacks.Callback):
    """Records, for every training batch, whether its batch-end hooks ran on the main thread:
    whether a `fit` dispatched its steps asynchronously (see the module docstring).

    Attributes:
        on_main: one bool per training batch so far.
        where: "main" (Keras ran the hooks on the training thread: a callback in the list is
            not async-safe, or the backend is TensorFlow), "worker" (every hook on Keras'
            worker thread), "both", or None before the first batch.
    """

    async_safe = True

    def __init__(self):
        super().__init__()
        self.on_main = []

    def on_train_batch_end(self, batch, logs=None):
        self.on_main.append(threading.current_thread() is threading.main_thread())

    @property
    def where(self):
        if not self.on_main:
            return None
        return "main" if all(self.on_main) else "worker" if not any(self.on_main) else "both"


class BitsPerCharacter(keras.callbacks.Callback):
    """Adds `bpc` and `val_bpc` (bits per character = NLL / ln 2, from the epoch's token-mean
    `nll` and `val_nll`) to the epoch logs of a character-level model: the figure
    character-level papers report (Andonov 2019 Table 7.9: loss 0.84 -> 1.212 bpc). The NLL
    and not the loss: the loss adds AR / TAR and regularizers. Place it before
    `keras.callbacks.TensorBoard` in the callback list so the figures are logged."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        for prefix in ("", "val_"):
            if f"{prefix}nll" in logs:
                logs[f"{prefix}bpc"] = float(logs[f"{prefix}nll"]) / math.log(2.0)


class StopOnNaN(keras.callbacks.Callback):
    """Raise `TrainingDiverged` when the loss or the perplexity stops being finite.

    Checked after every training step (`loss`, `perplexity`: NaN or +-inf names the epoch
    and step) and at the end of every epoch (also `val_loss`, `val_perplexity`, so a model
    whose validation diverged is never saved as a good epoch). The perplexity is
    exp(mean NLL); it overflows float32 only above 88.7 nats per token, far above log V of
    any vocabulary, so an infinite perplexity is a diverged model even while the loss is
    still a (huge) finite number.

    Raising (rather than `stop_training`) ends `fit` before any later callback can save the
    diverged weights, so the last good checkpoint stays the last one written: put it first
    in the callback list. Async-safe (it reads only the logs): where Keras runs batch hooks
    on a worker thread, the error reaches `fit` at the next batch or at the epoch's end,
    before any `on_epoch_end`, and the step it names may be one of the few after the first
    non-finite one (the hook that noticed first; the logs are running means, non-finite
    from then on).

    Args:
        monitor: the batch-log keys to check after every step. Default ("loss",
            "perplexity").
        epoch_monitor: the epoch-log keys to check at the end of an epoch. Default
            ("loss", "perplexity", "val_loss", "val_perplexity").
    """

    async_safe = True

    def __init__(self, monitor=("loss", "perplexity"),
                 epoch_monitor=("loss", "perplexity", "val_loss", "val_perplexity")):
        super().__init__()
        self.monitor = tuple(monitor)
        self.epoch_monitor = tuple(epoch_monitor)
        self.epoch = 0

    @staticmethod
    def _first_bad(logs, keys):
        for key in keys:
            value = (logs or {}).get(key)
            if value is not None and not math.isfinite(float(value)):
                return key, float(value)
        return None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        bad = self._first_bad(logs, self.monitor)
        if bad is not None:
            raise TrainingDiverged(
                f"training {bad[0]} became {bad[1]} at epoch {self.epoch + 1}, step "
                f"{batch + 1}; lower the learning rate or clip the gradient norm.")

    def on_epoch_end(self, epoch, logs=None):
        bad = self._first_bad(logs, self.epoch_monitor)
        if bad is not None:
            what = ("validation " + bad[0][4:]) if bad[0].startswith("val_") else \
                f"training {bad[0]}"
            raise TrainingDiverged(
                f"{what} became {bad[1]} at the end of epoch {epoch + 1}; lower the learning "
                "rate or clip the gradient norm.")


class EpochProgbar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, with the header "Epoch k/N" counting the whole run's N epochs.

    A loop that calls `fit(initial_epoch=e, epochs=e + 1)` once per epoch (to checkpoint
    between epochs) would otherwise print "Epoch e+1/e+1", and nothing for the first epoch.
    Pass it in `callbacks` (it replaces the progress bar `fit` adds with `verbose=1`).

    Async-safe, unlike Keras' own: updates are serialized, and one older than the bar's
    position (a batch whose hook ran late on another thread) is skipped, as the logs of a
    later batch hold the running means it would have shown.

    Args:
        total_epochs: N, the number of epochs of the whole run.
    """

    async_safe = True

    def __init__(self, total_epochs):
        super().__init__()
        self.total_epochs = int(total_epochs)
        self._lock = threading.Lock()

    def set_params(self, params):
        super().set_params(params)
        self.epochs = self.total_epochs

    def _unless_stale(self, hook, batch, logs):
        with self._lock:
            if batch + 1 > self.seen:
                hook(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._unless_stale(super().on_train_batch_end, batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._unless_stale(super().on_test_batch_end, batch, logs)

    def on_predict_batch_end(self, batch, logs=None):
        self._unless_stale(super().on_predict_batch_end, batch, logs)
