"""Training callbacks: throughput, divergence guard."""

import math
import time

import keras


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


class WordsPerSecond(keras.callbacks.Callback):
    """Adds `words_per_second` (training tokens / wall time of the epoch) to the epoch logs.

    Place it before `keras.callbacks.TensorBoard` in the callback list so the figure is
    logged. `tokens_per_epoch` is batch size x number of target positions.
    """

    def __init__(self, tokens_per_epoch):
        super().__init__()
        self.tokens_per_epoch = int(tokens_per_epoch)
        self.last = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start
        self.last = self.tokens_per_epoch / max(seconds, 1e-9)
        if logs is not None:
            logs["words_per_second"] = self.last
            logs["epoch_seconds"] = seconds


class StopOnNaN(keras.callbacks.Callback):
    """Raise `TrainingDiverged` naming the epoch and step when the loss is not finite.

    Raising (rather than `stop_training`) ends `fit` before any later callback can save the
    diverged weights, so the last good checkpoint stays the last one written.
    """

    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise TrainingDiverged(
                f"loss became {float(loss)} at epoch {self.epoch + 1}, step {batch + 1}; "
                "lower the learning rate or raise clip_norm, and restart from the last "
                "good checkpoint.")
