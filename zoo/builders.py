"""The model, optimizer, averaging trigger, learning-rate schedule and window padding a run's
configuration names."""

from zoo.errors import ConfigError

# Fields of the `training` part that the model itself owns (`tflm.LanguageModel` arguments).
MODEL_OWNED_TRAINING = ("bptt", "clip_norm", "weight_decay", "seed", "flooding_level",
                        "loss_reduction")

# model.kind -> (module, class): the model families a preset can name.
MODEL_KINDS = {"awd_lstm": ("zoo.awd_lstm", "AWDLSTM"),
               "zaremba": ("zoo.zaremba", "ZarembaLSTM")}


def model_class(config):
    """The class `model.kind` names ("awd_lstm", the default, or "zaremba")."""
    import importlib
    kind = config.get("model", {}).get("kind", "awd_lstm")
    if kind not in MODEL_KINDS:
        raise ConfigError(f"unknown model.kind {kind!r}; use one of "
                          f"{', '.join(sorted(MODEL_KINDS))}.")
    module, name = MODEL_KINDS[kind]
    return getattr(importlib.import_module(module), name)


def build_model(config, vocab_size, **overrides):
    """The model of `config` (`model.kind`: `zoo.AWDLSTM` by default, `zoo.ZarembaLSTM`
    for "zaremba"): its `model` part, the training fields the model owns
    (`MODEL_OWNED_TRAINING`) unless the model part sets them, then `overrides`."""
    cls = model_class(config)
    kwargs = dict(config["model"])
    kwargs.pop("kind", None)
    training = config.get("training", {})
    for key in MODEL_OWNED_TRAINING:
        if key in training:
            kwargs.setdefault(key, training[key])
    kwargs.pop("vocab_size", None)
    kwargs.update(overrides)
    try:
        return cls(vocab_size=int(vocab_size), **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"bad model configuration: {err}") from err


def make_optimizer(training):
    """SGD, averaged SGD (NT-/ET-ASGD) or Adam from the `training` part."""
    from tflm import optimizers
    name = str(training.get("optimizer", "sgd")).lower()
    lr = float(training.get("lr", 30.0))
    multipliers = training.get("learning_rate_multipliers")
    if name == "sgd":
        return optimizers.SGD(lr, learning_rate_multipliers=multipliers)
    if name == "asgd":
        return optimizers.AveragedSGD(lr, learning_rate_multipliers=multipliers)
    if name == "adam":  # torch's Adam, the window factor in its step size
        return optimizers.Adam(lr)
    raise ConfigError(f"unknown optimizer {name!r} in training.optimizer; use sgd, asgd or "
                      "adam.")


def make_lr_schedule(training):
    """The `training.when` schedule (`tflm.step_decay.StepDecay`: the learning rate divided
    by 10 after each listed 1-based epoch, as salesforce/awd-lstm-lm `--when`), or the
    `training.lr_decay` one (`tflm.epoch_decay.EpochDecay`: lr * lr_decay ** max(epoch + 1
    - decay_after, 0), TensorFlow's PTB tutorial), or None when neither is set."""
    when = training.get("when") or []
    decay = training.get("lr_decay")
    if when and decay is not None:
        raise ConfigError("training.when and training.lr_decay both schedule the learning "
                          "rate; set one of them.")
    if decay is not None:
        from tflm.epoch_decay import EpochDecay
        try:
            return EpochDecay(decay, int(training.get("decay_after", 0)),
                              learning_rate=float(training.get("lr", 30.0)))
        except ValueError as err:
            raise ConfigError(f"training.lr_decay / decay_after: {err}") from err
    if not when:
        return None
    from tflm.step_decay import StepDecay
    try:
        return StepDecay(when, learning_rate=float(training.get("lr", 30.0)))
    except ValueError as err:
        raise ConfigError(f"training.when: {err}") from err


def make_trigger(training, finetune=False):
    """The averaging trigger: `switch` = "nonmono" (NT-ASGD, `nonmono` epochs), "epoch"
    (ET-ASGD at `switch_epoch`) or None; finetuning stops on the non-monotonic rule."""
    from tflm.triggers import EpochTrigger, NonMonotonicTrigger
    if str(training.get("optimizer", "sgd")).lower() != "asgd":
        return None
    if finetune:
        return NonMonotonicTrigger(int(training.get("nonmono", 5)), on_trigger="stop",
                                   verbose=0)
    switch = training.get("switch", "nonmono")
    if switch == "nonmono":
        return NonMonotonicTrigger(int(training.get("nonmono", 5)), verbose=0)
    if switch == "epoch":
        return EpochTrigger(int(training.get("switch_epoch", 200)), verbose=0)
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
    import keras

    from tflm import data
    pad_to_compiled = bool(training.get("pad_to_compiled_lengths", True))
    model.pad_to_compiled_lengths = pad_to_compiled
    model.padded_windows = pad > 1 or (pad_to_compiled and keras.backend.backend() == "jax")
    if pad_to_compiled and not training.get("fixed_windows", False):
        model.shortest_compiled_length = data.padded_length(data.covering_length(
            int(training.get("bptt", 70)), max_len=training.get("max_seq_len")), pad)
    return pad_to_compiled


def pad_to_multiple(training):
    """`training.pad_to_multiple`, default `tflm.data.default_pad_to_multiple`: 4 on JAX
    (one compiled step per padded window length instead of one per length), 1 (no padding)
    on TensorFlow and PyTorch, whose steps take any length."""
    import keras

    from tflm import data
    value = training.get("pad_to_multiple")
    if value is None:
        return data.default_pad_to_multiple(keras.backend.backend())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"training.pad_to_multiple must be a positive integer (4 suits "
                          f"JAX, 1 turns padding off); got {value!r}.")
    return value
