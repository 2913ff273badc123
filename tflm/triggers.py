"""Callbacks that start weight averaging (NT-ASGD, ET-ASGD), validate and checkpoint the
averaged weights, and stop finetuning.

Typical use (the reference AWD-LSTM recipe):

    model.compile(optimizer=tflm.optimizers.AveragedSGD(30.0))
    model.fit(train, validation_data=valid, epochs=750, callbacks=[
        NonMonotonicTrigger(patience=5),          # or EpochTrigger(200) for ET-ASGD
        BestModelCheckpoint("best.keras"),        # saves the averaged weights once averaging
        keras.callbacks.TensorBoard("logs")])     # after the trigger: logs "averaging"

Every callback keeps its state across `fit` calls (a loop of `fit(initial_epoch=e,
epochs=e + 1)` works) and exposes `get_state()` / `set_state()` (JSON-serializable) so a
resumed run continues where it stopped. Epoch numbers are Keras' 0-based epoch indices.

Reference: Merity, Keskar & Socher 2018 §3 (NT-ASGD; salesforce/awd-lstm-lm main.py and
finetune.py); Parthiban 2020 thesis §4.3.2.2 (ET-ASGD; quettabit/awd-lstm-lmkit).
"""

import math

import keras

from tflm.optimizers import averaged_weights, find_averaged_optimizer


def _monitored(logs, monitor, who):
    logs = logs or {}
    if monitor not in logs:
        raise KeyError(f"{who} monitors {monitor!r}, which is not in the epoch logs "
                       f"(available: {sorted(logs)}); pass validation_data to fit, or set "
                       "monitor= to one of the available keys.")
    return float(logs[monitor])


def _is_whole(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and int(value) == value)


def _check_state(state, keys, who):
    if not isinstance(state, dict) or not set(keys) <= set(state):
        raise ValueError(f"{who}.set_state needs a dict with keys {sorted(keys)} (as returned "
                         f"by get_state); got {state!r}.")


class AveragedValidation(keras.callbacks.Callback):
    """Validate the averaged weights: swap them in at `on_test_begin`, back at `on_test_end`.

    With it, `fit(validation_data=...)` reports `val_loss` / `val_perplexity` of the averaged
    model once averaging has started (and of the raw weights before), as the reference
    does. The swap copies the weights and restores them bit for bit; it does nothing while
    the optimizer has no average, and several such callbacks in one list swap only once.
    The triggers below include this behaviour (`average_validation=True`); use this class
    alone when no trigger is in the list. It also writes `averaging` (1.0 / 0.0: was the
    average being accumulated at the end of this epoch) into the epoch logs, so place it
    before `keras.callbacks.TensorBoard`.

    Args:
        average_validation: swap the averaged weights in for validation. Default True.
    """

    def __init__(self, average_validation=True):
        super().__init__()
        self.average_validation = bool(average_validation)
        self._context = None

    def _optimizer(self, required=True):
        opt = find_averaged_optimizer(self.model)
        if opt is None and required:
            raise TypeError(
                f"{type(self).__name__} needs a model compiled with tflm.optimizers."
                f"AveragedSGD; model.optimizer is {type(self.model.optimizer).__name__}.")
        return opt

    def on_train_begin(self, logs=None):
        self._optimizer()

    def on_test_begin(self, logs=None):
        if self.average_validation and self._context is None:
            context = averaged_weights(self.model)
            if context.__enter__():
                self._context = context
            else:
                context.__exit__(None, None, None)

    def on_test_end(self, logs=None):
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)

    def _log_averaging(self, logs):
        opt = self._optimizer(required=False)
        averaging = bool(opt is not None and opt.is_averaging)
        if logs is not None:
            logs["averaging"] = 1.0 if averaging else 0.0
        return averaging

    def on_epoch_end(self, epoch, logs=None):
        self._log_averaging(logs)


class NonMonotonicTrigger(AveragedValidation):
    """NT-ASGD: start averaging when validation stops improving non-monotonically.

    At the end of every epoch while the optimizer is not averaging yet, with v the monitored
    validation value of this epoch and `history` the values of the previous such epochs:

        switch if len(history) > n and v > min(history[:-n])
        then history.append(v)

    i.e. v is worse than the best value from more than n epochs ago (the check uses the
    history *before* appending v, exactly as salesforce/awd-lstm-lm main.py). The switch
    happens after this epoch's validation, so averaging starts with the first step of the
    next epoch; after the switch nothing more is appended. With `on_trigger="stop"` the
    same rule ends training instead (the reference finetune.py): it is then checked at
    every epoch, averaging or not, on the averaged validation value.

    Args:
        patience: the non-monotone interval n >= 1. Default 5 (Merity et al.; Takase et al.
            found 60 better).
        monitor: epoch-log key to watch (lower is better). Default "val_loss".
        on_trigger: "switch" (start averaging) or "stop" (set `model.stop_training`; a loop
            over several `fit` calls should test `trigger.stopped`). Default "switch".
        average_validation: validate the averaged weights (see `AveragedValidation`).
            Default True.
        verbose: print a line when it fires. Default 1.

    Attributes: `history`, `switched`, `switch_epoch`, `stopped`, `stop_epoch`.

    Example:

    >>> model.fit(train, validation_data=valid, epochs=750,
    ...           callbacks=[NonMonotonicTrigger(patience=5)])

    Reference: Merity, Keskar & Socher 2018 §3 (NT-ASGD).
    """

    def __init__(self, patience=5, monitor="val_loss", on_trigger="switch",
                 average_validation=True, verbose=1):
        super().__init__(average_validation=average_validation)
        if not _is_whole(patience) or int(patience) < 1:
            raise ValueError(f"patience (the non-monotone interval n) must be an integer "
                             f">= 1; got {patience!r}.")
        if on_trigger not in ("switch", "stop"):
            raise ValueError(f"on_trigger must be 'switch' or 'stop'; got {on_trigger!r}.")
        self.patience = int(patience)
        self.monitor = str(monitor)
        self.on_trigger = on_trigger
        self.verbose = int(verbose)
        self.history = []
        self.switched, self.switch_epoch = False, None
        self.stopped, self.stop_epoch = False, None

    @staticmethod
    def rule(history, value, patience):
        """The reference condition: len(history) > n and value > min(history[:-n])."""
        return len(history) > patience and value > min(history[:-patience])

    def on_train_begin(self, logs=None):
        if self.on_trigger == "switch":
            self._optimizer()

    def on_epoch_end(self, epoch, logs=None):
        averaging = self._log_averaging(logs)
        if self.on_trigger == "switch" and averaging:
            return
        value = _monitored(logs, self.monitor, type(self).__name__)
        if self.rule(self.history, value, self.patience):
            best = min(self.history[:-self.patience])
            if self.on_trigger == "switch":
                self._optimizer().start_averaging_now()
                self.switched, self.switch_epoch = True, int(epoch)
                what = "switching to averaged SGD (averaging from the next step)"
            else:
                self.model.stop_training = True
                self.stopped, self.stop_epoch = True, int(epoch)
                what = "stopping"
            if self.verbose:
                print(f"\nNonMonotonicTrigger: epoch {epoch + 1}: {self.monitor} {value:.5g} > "
                      f"{best:.5g} (the best before the last {self.patience} epochs); {what}.")
        self.history.append(value)

    def get_state(self):
        return {"history": list(self.history), "switched": self.switched,
                "switch_epoch": self.switch_epoch, "stopped": self.stopped,
                "stop_epoch": self.stop_epoch}

    def set_state(self, state):
        _check_state(state, ("history", "switched", "switch_epoch"), "NonMonotonicTrigger")
        self.history = [float(v) for v in state["history"]]
        self.switched, self.switch_epoch = bool(state["switched"]), state["switch_epoch"]
        self.stopped = bool(state.get("stopped", False))
        self.stop_epoch = state.get("stop_epoch")


class EpochTrigger(AveragedValidation):
    """ET-ASGD: start averaging at the start of epoch `epoch` (0-based Keras index).

    Epochs 0 .. E-1 are plain SGD; the first averaged step (k = 1 of `AveragedSGD`) is the
    first step of epoch E, so the average holds iterates of epoch E onward. `epoch=200` is
    the thesis' ET-ASGD: 200 full epochs of SGD, then averaging (quettabit/awd-lstm-lmkit
    `--switch_epoch 200`, which switches after validating its 1-based epoch 200). The
    validation of epoch E - 1 still sees the raw weights; from epoch E on the averaged
    ones. A run resumed at an epoch >= E whose optimizer is not averaging starts averaging
    at once.

    Args:
        epoch: E >= 0. Default 200.
        average_validation: validate the averaged weights. Default True.
        verbose: print a line when it fires. Default 1.

    Reference: Parthiban 2020 thesis §4.3.2.2; Ganea et al. 2019 (LMS-PLIF).
    """

    def __init__(self, epoch=200, average_validation=True, verbose=1):
        super().__init__(average_validation=average_validation)
        if not _is_whole(epoch) or int(epoch) < 0:
            raise ValueError(f"epoch must be an integer >= 0 (0-based epoch index at whose "
                             f"start averaging begins); got {epoch!r}.")
        self.epoch = int(epoch)
        self.verbose = int(verbose)
        self.switched, self.switch_epoch = False, None

    def on_epoch_begin(self, epoch, logs=None):
        opt = self._optimizer()
        if epoch >= self.epoch and not opt.is_averaging:
            opt.start_averaging_now()
            self.switched, self.switch_epoch = True, int(epoch)
            if self.verbose:
                print(f"\nEpochTrigger: averaging from the start of epoch {epoch + 1}.")

    def get_state(self):
        return {"switched": self.switched, "switch_epoch": self.switch_epoch}

    def set_state(self, state):
        _check_state(state, ("switched", "switch_epoch"), "EpochTrigger")
        self.switched, self.switch_epoch = bool(state["switched"]), state["switch_epoch"]


class BestModelCheckpoint(keras.callbacks.Callback):
    """Save the model whenever the monitored value improves; averaged weights once averaging.

    The file holds what validation measured: inside `averaged_weights(model)` when the
    optimizer has an average (the reference's "Saving Averaged!"), the raw weights before.
    One best value spans both phases, as in the reference.

    Args:
        filepath: ".keras" (whole model with optimizer state) or ".weights.h5" path.
        monitor: epoch-log key. Default "val_perplexity".
        mode: "min" or "max". Default "min".
        initial_value_threshold: only save when better than this (finetuning starts from
            the loaded model's validation value). Default None.
        verbose: print a line on every save. Default 0.

    Attributes: `best`, `best_epoch`, `saved_averaged` (whether the last save held averages).
    """

    def __init__(self, filepath, monitor="val_perplexity", mode="min",
                 initial_value_threshold=None, verbose=0):
        super().__init__()
        filepath = str(filepath)
        if not (filepath.endswith(".keras") or filepath.endswith(".weights.h5")):
            raise ValueError(f"filepath must end in .keras or .weights.h5; got {filepath!r}.")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max'; got {mode!r}.")
        self.filepath, self.monitor, self.mode = filepath, str(monitor), mode
        self.best = None if initial_value_threshold is None else float(initial_value_threshold)
        self.best_epoch = None
        self.saved_averaged = False
        self.verbose = int(verbose)

    def _improved(self, value):
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def on_epoch_end(self, epoch, logs=None):
        value = _monitored(logs, self.monitor, type(self).__name__)
        if not self._improved(value):
            return
        with averaged_weights(self.model) as averaged:
            if self.filepath.endswith(".weights.h5"):
                self.model.save_weights(self.filepath)
            else:
                self.model.save(self.filepath)
        self.best, self.best_epoch, self.saved_averaged = value, int(epoch), averaged
        if self.verbose:
            print(f"\nBestModelCheckpoint: epoch {epoch + 1}: {self.monitor} {value:.5g}; saved "
                  f"{'averaged' if averaged else 'raw'} weights to {self.filepath}.")

    def get_state(self):
        return {"best": self.best, "best_epoch": self.best_epoch,
                "saved_averaged": self.saved_averaged}

    def set_state(self, state):
        _check_state(state, ("best", "best_epoch"), "BestModelCheckpoint")
        self.best = None if state["best"] is None else float(state["best"])
        self.best_epoch = state["best_epoch"]
        self.saved_averaged = bool(state.get("saved_averaged", False))
