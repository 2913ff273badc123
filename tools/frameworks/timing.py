"""Per-step timing and losses, recorded directly, and their summary.

A step's words/s is B * T / its wall time, ending with a blocking fetch of its loss. Each
step records its own window loss and NLL: the Keras runners read them from the step's logs
(`LanguageModel.log_window_values`), the native runner from its step; the running
(token-weighted) means since the first step are computed here from them.
"""

import math
import time

import numpy as np


def median_words_per_s(tokens, seconds, skip=0, exclude=None):
    pairs = [(n, t) for i, (n, t) in enumerate(zip(tokens, seconds))
             if i >= skip and not (exclude and exclude[i])]
    if not pairs:
        return None
    return float(np.median([n / t for n, t in pairs]))


class StepRecord:
    """Wall time, window loss / NLL, tokens and whether the step (re)traced, per step."""

    def __init__(self):
        self.times, self.losses, self.nlls, self.tokens, self.traced = [], [], [], [], []

    def add(self, seconds, loss, nll, tokens, traced=None):
        self.times.append(float(seconds))
        self.losses.append(float(loss))
        self.nlls.append(float(nll))
        self.tokens.append(int(tokens))
        self.traced.append(traced)

    def running(self, values):
        """Token-weighted running means of per-step `values`."""
        out, total, weight = [], 0.0, 0
        for value, n in zip(values, self.tokens):
            total += value * n
            weight += n
            out.append(total / weight)
        return out


def keras_step_timer(model):
    """A Keras callback filling a `StepRecord` (`.record`) from the steps of `model.fit`.

    Turns on `model.log_window_values`, so set it up before the model's first step."""
    import keras  # deferred: the native peer's worker reads this module without Keras

    model.log_window_values = True

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.record = StepRecord()

        def on_train_batch_begin(self, batch, logs=None):
            self._traces = model.traced_steps["train"]
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            loss = _scalar(logs["window_loss"])  # a blocking fetch: the step has finished
            seconds = time.perf_counter() - self._t0
            self.record.add(seconds, loss, _scalar(logs["window_nll"]),
                            round(_scalar(logs["window_tokens"])),
                            model.traced_steps["train"] > self._traces)

    return StepTimer()


def _scalar(value):
    import keras  # deferred: as keras_step_timer
    return float(np.asarray(keras.ops.convert_to_numpy(value)).reshape(-1)[0])


def step_summary(record, warmup, eager=False):
    """The result fields of the timed steps (`eager`: no traces to tell apart)."""
    times, tokens = record.times, record.tokens
    warmup = min(int(warmup), max(0, len(times) - 1))
    traced = None if eager else record.traced
    running_loss, running_nll = record.running(record.losses), record.running(record.nlls)
    return {
        "steps": len(times), "warmup": warmup, "step_tokens": tokens, "step_times_s": times,
        "step_losses": record.losses, "step_nlls": record.nlls,
        "running_loss": running_loss, "running_nll": running_nll, "step_traced": traced,
        "first_step_loss": record.losses[0] if times else None,
        "first_step_nll": record.nlls[0] if times else None,
        "train_perplexity": math.exp(running_nll[-1]) if times else None,
        "train_words_per_s": median_words_per_s(tokens, times, skip=warmup),
        "train_words_per_s_end_to_end": (float(sum(tokens) / sum(times)) if times else None),
        "train_words_per_s_steady": median_words_per_s(tokens, times, skip=warmup,
                                                       exclude=traced),
    }
