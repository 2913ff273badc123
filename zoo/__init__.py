"""Ready models and presets built from tflm.

    zoo.AWDLSTMBackbone   embedding + weight-dropped LSTMs -> every layer's hidden states
    zoo.AWDLSTM           the language model: backbone + output head (a `tflm.LanguageModel`)
    zoo.ZarembaLSTM       Zaremba et al. 2014 / the TF PTB tutorial's model (`model.kind`
                          "zaremba"), with its backbone zoo.ZarembaBackbone
    zoo.MogrifierLM       the Mogrifier LSTM (Melis et al. 2020) as deepmind/lamb trains it
                          (`model.kind` "mogrifier"), with its backbone zoo.MogrifierBackbone
    zoo.from_preset(name) the model of a preset; zoo.list_presets(), zoo.load_preset(name)
    zoo.make_head(spec)   an output head by name; zoo.head_names()
    zoo.load_model(path)  a saved zoo model (.keras)
    zoo.transfer_weights(src, model)  a pre-trained model's weights into one with another head

`python -m zoo.train` trains a preset. `import zoo` is cheap: the names above import Keras
and the model code when first used. After `import zoo`, `keras.saving.load_model` rebuilds
saved zoo models (`zoo.models.keras_registration`: zoo's names are known to Keras from the
moment Keras is imported).
"""

import importlib

from zoo.models.keras_registration import register_when_keras_loads

_EXPORTS = {
    "AWDLSTM": "zoo.models.awd_lstm.awd_lstm_lm",
    "AWDLSTMBackbone": "zoo.models.awd_lstm.awd_lstm_backbone",
    "head_names": "zoo.models.heads",
    "make_head": "zoo.models.heads",
    "from_preset": "zoo.runs.builders",
    "list_presets": "zoo.presets",
    "load_preset": "zoo.presets",
    "load_model": "zoo.models.saving",
    "transfer_weights": "zoo.models.transfer",
    "ZarembaLSTM": "zoo.models.zaremba.zaremba_lm",
    "ZarembaBackbone": "zoo.models.zaremba.zaremba_backbone",
    "MogrifierLM": "zoo.models.mogrifier.mogrifier_lm",
    "MogrifierBackbone": "zoo.models.mogrifier.mogrifier_backbone",
}

__all__ = sorted(_EXPORTS)

register_when_keras_loads()


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
