"""The learning rate decayed every epoch after a first stage: TensorFlow's PTB tutorial.

With lr_0 the initial rate, d the decay and m the number of epochs of the first stage
("max_epoch"; Zhang 2018 "stage 1"), epoch i (0-based) trains with

    lr(i) = lr_0 * d ** max(i + 1 - m, 0)

so epochs 1..m (1-based) train at lr_0 and every later epoch at d times the previous one's
rate (small: m = 4, d = 0.5; medium: 6, 0.8; large: 14, 1 / 1.15).

Reference: tensorflow/models tutorials/rnn/ptb/ptb_word_lm.py (`lr_decay = config.lr_decay
** max(i + 1 - config.max_epoch, 0.0)`); Zaremba, Sutskever & Vinyals 2014, "Recurrent
Neural Network Regularization"; Zhang 2018 Table A.1.
"""

import math

import keras
import numpy as np


def decayed_rate(learning_rate, decay, decay_after, epoch):
    """lr(epoch) of the module docstring (`epoch` 0-based)."""
    return float(learning_rate) * float(decay) ** max(int(epoch) + 1 - int(decay_after), 0)


class EpochDecay(keras.callbacks.Callback):
    """Set the optimizer's learning rate at the start of every epoch to
    lr_0 * decay ** max(epoch + 1 - decay_after, 0) (a pure function of the epoch, so a
    loop of one-epoch `fit` calls and a resumed run get the same rates as one long `fit`).

    Args:
        decay: d in (0, 1] (1 keeps the rate).
        decay_after: m >= 0, the epochs trained at lr_0 (the tutorial's max_epoch).
        learning_rate: lr_0. Default None: the optimizer's rate when training first begins.
        verbose: print a line when the rate changes. Default 0.

    `get_state()` / `set_state()` carry lr_0 across a resumed run.

    Example:

    >>> model.compile(optimizer=tflm.optimizers.SGD(1.0))
    >>> model.fit(train, epochs=13, callbacks=[EpochDecay(0.5, decay_after=4)])

    Reference: tensorflow/models ptb_word_lm.py (see the module docstring).
    """

    def __init__(self, decay, decay_after, learning_rate=None, verbose=0):
        super().__init__()
        if (isinstance(decay, bool) or not isinstance(decay, (int, float))
                or not math.isfinite(decay) or not 0 < decay <= 1):
            raise ValueError(f"decay must be a number in (0, 1] (the factor per epoch after "
                             f"the first stage, e.g. 0.5); got {decay!r}.")
        if isinstance(decay_after, bool) or not isinstance(decay_after, int) or decay_after < 0:
            raise ValueError(f"decay_after must be an integer >= 0 (the epochs at the initial "
                             f"learning rate, the tutorial's max_epoch); got {decay_after!r}.")
        self.decay = float(decay)
        self.decay_after = int(decay_after)
        self.learning_rate = None if learning_rate is None else float(learning_rate)
        self.verbose = int(verbose)

    def rate(self, epoch):
        """The learning rate of the 0-based `epoch`."""
        if self.learning_rate is None:
            raise ValueError("EpochDecay has no initial learning rate yet; pass "
                             "learning_rate= or let training begin first.")
        return decayed_rate(self.learning_rate, self.decay, self.decay_after, epoch)

    def on_train_begin(self, logs=None):
        if self.learning_rate is None:
            self.learning_rate = _current(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        lr, old = self.rate(int(epoch)), _current(self.model.optimizer)
        if np.float32(lr) != np.float32(old):  # the optimizer holds it in float32
            self.model.optimizer.learning_rate = lr
            if self.verbose:
                print(f"\nEpochDecay: epoch {epoch + 1}: learning rate {old:.6g} -> {lr:.6g}.")

    def get_state(self):
        return {"learning_rate": self.learning_rate}

    def set_state(self, state):
        if not isinstance(state, dict) or "learning_rate" not in state:
            raise ValueError("EpochDecay.set_state needs a dict with key 'learning_rate' (as "
                             f"returned by get_state); got {state!r}.")
        if self.learning_rate is None and state["learning_rate"] is not None:
            self.learning_rate = float(state["learning_rate"])


def _current(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
