"""The model, optimizer, averaging trigger, learning-rate schedule and window padding a run's
settings (`zoo.runs.settings`) name."""

import keras

from tflm import data, optimizers
from tflm.epoch_decay import EpochDecay
from tflm.step_decay import StepDecay
from tflm.triggers import EpochTrigger, NonMonotonicTrigger
from zoo.errors import ConfigError
from zoo.models.registry import model_class
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings


def build_model(settings, vocab_size, **overrides):
    """The model of a run's `settings` (`RunSettings`; `model.kind`: `zoo.AWDLSTM` by
    default, `zoo.ZarembaLSTM` for "zaremba"): its model arguments, the training fields the
    model owns (`TrainingSettings.model_arguments`) unless the model part sets them, then
    `overrides`; its `dtype` (the Keras dtype policy of all its layers, saved with it) is
    `training.precision`."""
    cls = model_class(settings.model.kind)
    kwargs = dict(settings.training.model_arguments(), **settings.model.arguments)
    kwargs.update(overrides)
    kwargs.setdefault("dtype", settings.training.precision)
    try:
        return cls(vocab_size=int(vocab_size), **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"bad model configuration: {err}") from err


def from_preset(name, vocab_size=None, **overrides):
    """Build the model of preset `name` (`zoo.AWDLSTM`, or the class its `model.kind`
    names); keyword overrides replace model fields.

    `vocab_size` defaults to the preset's corpus vocabulary size (`corpus.vocab_size`).
    Training fields the model owns (`bptt`, `clip_norm`, `weight_decay`, `seed`,
    `flooding_level`) come from the preset's `training` part unless overridden (as
    `python -m zoo.train` builds it: `build_model`).
    """
    settings = RunSettings.from_config(resolve_config(name))
    if vocab_size is None:
        vocab_size = settings.corpus.options.get("vocab_size")
    if vocab_size is None:
        raise ConfigError(f"Preset {name!r} does not fix the vocabulary size; pass "
                          "vocab_size=.")
    return build_model(settings, vocab_size, **overrides)


def make_optimizer(training):
    """SGD, averaged SGD (NT-/ET-ASGD) or Adam from the `TrainingSettings`; under
    `precision="mixed_float16"` inside Keras' `LossScaleOptimizer` (float16's range needs
    the scaled loss; the train steps unscale before clipping: `tflm.backends.gradients`)."""
    optimizer = _plain_optimizer(training)
    if training.precision == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _plain_optimizer(training):
    multipliers = training.learning_rate_multipliers
    if training.optimizer == "sgd":
        return optimizers.SGD(training.lr, learning_rate_multipliers=multipliers)
    if training.optimizer == "asgd":
        return optimizers.AveragedSGD(training.lr, learning_rate_multipliers=multipliers)
    if training.optimizer == "adam":  # torch's Adam, the window factor in its step size
        return optimizers.Adam(training.lr, beta_1=training.adam_beta_1)
    raise ConfigError(f"unknown optimizer {training.optimizer!r} in training.optimizer; use "
                      "sgd, asgd or adam.")


def make_lr_schedule(training):
    """The `training.when` schedule (`tflm.step_decay.StepDecay`: the learning rate divided
    by 10 after each listed 1-based epoch, as salesforce/awd-lstm-lm `--when`), or the
    `training.lr_decay` one (`tflm.epoch_decay.EpochDecay`: lr * lr_decay ** max(epoch + 1
    - decay_after, 0), TensorFlow's PTB tutorial), or None when neither is set."""
    when, decay = list(training.when), training.lr_decay
    if when and decay is not None:
        raise ConfigError("training.when and training.lr_decay both schedule the learning "
                          "rate; set one of them.")
    if decay is not None:
        try:
            return EpochDecay(decay, training.decay_after, learning_rate=training.lr)
        except ValueError as err:
            raise ConfigError(f"training.lr_decay / decay_after: {err}") from err
    if not when:
        return None
    try:
        return StepDecay(when, learning_rate=training.lr)
    except ValueError as err:
        raise ConfigError(f"training.when: {err}") from err


def make_trigger(training, finetune=False):
    """The averaging trigger: `switch` = "nonmono" (NT-ASGD, `nonmono` epochs), "epoch"
    (ET-ASGD at `switch_epoch`) or None; finetuning stops on the non-monotonic rule."""
    if not training.averaged:
        return None
    if finetune:
        return NonMonotonicTrigger(training.nonmono, on_trigger="stop", verbose=0)
    switch = training.switch
    if switch == "nonmono":
        return NonMonotonicTrigger(training.nonmono, verbose=0)
    if switch == "epoch":
        return EpochTrigger(training.switch_epoch, verbose=0)
    if switch in (None, "none"):
        return None
    raise ConfigError(f"unknown training.switch {switch!r}; use nonmono, epoch or none.")


def set_window_shapes(model, training, pad):
    """`python -m zoo.train`'s window-shape settings on `model`, for windows padded to a
    multiple of `pad` positions (`pad_to_multiple`). Returns `pad_to_compiled_lengths`.

    - `model.pad_to_compiled_lengths` (`training.pad_to_compiled_lengths`, default True;
      JAX only): a window may run padded at a length compiled already.
    - `model.padded_windows`: whether a training window may hold padding (False on
      TensorFlow and PyTorch without padding: the traced step runs the mask-free LSTM loop
      and checks the promise at run time where the backend can).
    - `model.shortest_compiled_length` (random window lengths only): the one length that
      nearly every training window is padded to, `tflm.data.covering_length` rounded up
      to `pad`: one training program serves the run where a padded position costs less
      than a compile (`tflm.backends.compiled_lengths`; the choice uses no timing)."""
    pad_to_compiled = training.pad_to_compiled_lengths
    model.pad_to_compiled_lengths = pad_to_compiled
    model.padded_windows = pad > 1 or (pad_to_compiled and keras.backend.backend() == "jax")
    if pad_to_compiled and not training.fixed_windows:
        model.shortest_compiled_length = data.padded_length(data.covering_length(
            training.bptt, max_len=training.max_seq_len), pad)
    return pad_to_compiled


def pad_to_multiple(training):
    """`training.pad_to_multiple`, default `tflm.data.default_pad_to_multiple`: 4 on JAX
    (one compiled step per padded window length instead of one per length), 1 (no padding)
    on TensorFlow and PyTorch, whose steps take any length."""
    if training.pad_to_multiple is None:
        return data.default_pad_to_multiple(keras.backend.backend())
    return training.pad_to_multiple
