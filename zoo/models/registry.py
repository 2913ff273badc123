"""The model families a preset can name (`model.kind`), by name.

A family is a backbone plus a task (a `zoo.models.backbone_head_model.BackboneHeadModel`
subclass) in its own folder under `zoo/models/`; its name here is what a preset's
`model.kind` says. Modules are named as strings and imported on first use, so reading the
registry costs no Keras import (`import zoo` stays cheap).
"""

import importlib

from zoo.errors import ConfigError
from zoo.models.kinds import DEFAULT_KIND

# model.kind -> (module, class)
MODEL_KINDS = {"awd_lstm": ("zoo.models.awd_lstm.awd_lstm_lm", "AWDLSTM"),
               "zaremba": ("zoo.models.zaremba.zaremba_lm", "ZarembaLSTM"),
               "mogrifier": ("zoo.models.mogrifier.mogrifier_lm", "MogrifierLM")}
# every class zoo registers with Keras serialization ("zoo>NAME") -> its module
SERIALIZABLE = {"AWDLSTM": "zoo.models.awd_lstm.awd_lstm_lm",
                "AWDLSTMBackbone": "zoo.models.awd_lstm.awd_lstm_backbone",
                "ZarembaLSTM": "zoo.models.zaremba.zaremba_lm",
                "ZarembaBackbone": "zoo.models.zaremba.zaremba_backbone",
                "MogrifierLM": "zoo.models.mogrifier.mogrifier_lm",
                "MogrifierBackbone": "zoo.models.mogrifier.mogrifier_backbone"}


def model_class(kind=DEFAULT_KIND):
    """The class `model.kind` names ("awd_lstm", the default, "zaremba" or "mogrifier")."""
    if kind not in MODEL_KINDS:
        raise ConfigError(f"unknown model.kind {kind!r}; use one of "
                          f"{', '.join(sorted(MODEL_KINDS))}.")
    module, name = MODEL_KINDS[kind]
    return getattr(importlib.import_module(module), name)


def register_all():
    """Import every module of `SERIALIZABLE`, which registers its classes (and tflm's
    layers) with Keras' serialization: what `keras.saving.load_model` needs to rebuild a
    zoo model."""
    for module in sorted(set(SERIALIZABLE.values())):
        importlib.import_module(module)
