"""The learning rate divided by 10 after listed epochs: `--when` of salesforce/awd-lstm-lm.

With `when` = (e_1, e_2, ...) (1-based epoch numbers), the learning rate is divided by the
divisor d after the validation of each listed epoch, so epoch k + 1 (1-based) trains with

    lr(k + 1) = lr_0 / d ** #{e in when : e <= k}

(`--when 300 400`, d = 10: epochs 1-300 at lr_0, 301-400 at lr_0 / 10, 401- at lr_0 / 100).
The division acts on whatever optimizer the run uses (SGD, `tflm.optimizers.Adam`), but
only while it is not averaging: the reference divides only in the branch of epochs
validated on the raw weights, and its switch to averaged SGD creates a new optimizer at
the initial learning rate, divided once more when the switch epoch itself is listed. So
with A = the 1-based number of the last epoch trained without averaging (= the 0-based
index of the first averaged one), every averaged epoch trains with

    lr = lr_0 / d ** [A in when]

Reference: salesforce/awd-lstm-lm main.py (`--when`, default [-1] = never; `if epoch in
args.when: optimizer.param_groups[0]['lr'] /= 10.` after the epoch's validation and the
ASGD switch, in the non-averaged branch only); its README's character-level commands
(`--when 300 400` for PTB, `--when 25 35` for enwik8); Merity, Keskar & Socher 2018,
"An Analysis of Neural Language Modeling at Multiple Scales".
"""

import math
import numbers

import keras
import numpy as np

from tflm.optimizers import find_averaged_optimizer


def check_when(when, name="when"):
    """`when` as a tuple of ints, or `ValueError` unless it lists epoch numbers >= 1 in
    increasing order (an empty list: no division)."""
    if isinstance(when, (str, bytes)) or not hasattr(when, "__iter__"):
        raise ValueError(f"{name} must be a list of epoch numbers (e.g. [300, 400]); "
                         f"got {when!r}.")
    values = list(when)
    if not all(isinstance(e, numbers.Integral) and not isinstance(e, bool) and e >= 1
               for e in values):
        raise ValueError(f"{name} must list whole epoch numbers >= 1 (1-based: the epochs "
                         f"after which the learning rate is divided); got {when!r}.")
    if any(a >= b for a, b in zip(values, values[1:])):
        raise ValueError(f"{name} must list each epoch once, in increasing order (e.g. "
                         f"[300, 400]); got {when!r}.")
    return tuple(int(e) for e in values)


class StepDecay(keras.callbacks.Callback):
    """Divide the learning rate by `divisor` after each epoch listed in `when`.

    Sets the optimizer's learning rate at the start of every epoch from the formula of the
    module docstring (a pure function of the epoch and the epoch averaging started), so a
    loop of `fit(initial_epoch=e, epochs=e + 1)` calls and a resumed run get the same rates
    as one long `fit`. Place it after the averaging trigger (`tflm.triggers`) in the
    callback list, so that an `EpochTrigger` has started averaging before it looks.

    Args:
        when: 1-based epoch numbers in increasing order, e.g. (300, 400).
        divisor: d > 0. Default 10.0 (the reference's).
        learning_rate: lr_0. Default None: the optimizer's learning rate when training
            first begins.
        verbose: print a line when the rate changes. Default 0.

    Attributes: `learning_rate` (lr_0), `averaging_from` (A, None before averaging).
    `get_state()` / `set_state()` carry both across a resumed run.

    Example:

    >>> model.compile(optimizer=tflm.optimizers.Adam(2e-3))
    >>> model.fit(train, validation_data=valid, epochs=500,
    ...           callbacks=[StepDecay(when=(300, 400))])

    Reference: salesforce/awd-lstm-lm main.py `--when` (see the module docstring).
    """

    def __init__(self, when, divisor=10.0, learning_rate=None, verbose=0):
        super().__init__()
        self.when = check_when(when)
        if (isinstance(divisor, bool) or not isinstance(divisor, (int, float))
                or not math.isfinite(divisor) or divisor <= 0):
            raise ValueError(f"divisor must be a finite number > 0 (10 divides the learning "
                             f"rate by ten); got {divisor!r}.")
        self.divisor = float(divisor)
        self.learning_rate = None if learning_rate is None else _rate(learning_rate)
        self.verbose = int(verbose)
        self.averaging_from = None

    def rate(self, epoch):
        """The learning rate of the epoch with 0-based index `epoch` (= 1-based epochs done)."""
        if self.learning_rate is None:
            raise ValueError("StepDecay has no initial learning rate yet; pass "
                             "learning_rate= or let training begin first.")
        if self.averaging_from is not None and epoch >= self.averaging_from:
            drops = int(self.averaging_from in self.when)
        else:
            drops = sum(1 for e in self.when if e <= epoch)
        lr = self.learning_rate
        for _ in range(drops):  # as the reference: repeated division, not lr_0 / d ** n
            lr /= self.divisor
        return lr

    def on_train_begin(self, logs=None):
        if self.learning_rate is None:
            self.learning_rate = _current(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        averaged = find_averaged_optimizer(self.model)
        if self.averaging_from is None and averaged is not None and averaged.is_averaging:
            self.averaging_from = int(epoch)
        lr, old = self.rate(int(epoch)), _current(self.model.optimizer)
        if np.float32(lr) != np.float32(old):  # the optimizer holds it in float32
            self.model.optimizer.learning_rate = lr
            if self.verbose:
                print(f"\nStepDecay: epoch {epoch + 1}: learning rate {old:.6g} -> {lr:.6g}.")

    def get_state(self):
        return {"learning_rate": self.learning_rate, "averaging_from": self.averaging_from}

    def set_state(self, state):
        if not isinstance(state, dict) or not {"learning_rate", "averaging_from"} <= set(state):
            raise ValueError("StepDecay.set_state needs a dict with keys 'averaging_from' and "
                             f"'learning_rate' (as returned by get_state); got {state!r}.")
        if self.learning_rate is None and state["learning_rate"] is not None:
            self.learning_rate = _rate(state["learning_rate"])
        start = state["averaging_from"]
        self.averaging_from = None if start is None else int(start)


def _rate(value):
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"learning_rate must be a finite number >= 0; got {value!r}.")
    return float(value)


def _current(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
