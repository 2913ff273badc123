"""Loading saved zoo models (`.keras` files)."""


def load_model(path, **kwargs):
    """`keras.saving.load_model` for models made with zoo: imports the modules that register
    zoo's classes (and tflm's layers) with Keras first, which the cheap `import zoo` does not.
    Keyword arguments go to `keras.saving.load_model`."""
    import keras

    import zoo.awd_lstm  # noqa: F401  (registers AWDLSTM, AWDLSTMBackbone and tflm's layers)
    import zoo.zaremba  # noqa: F401  (registers ZarembaLSTM, ZarembaBackbone)
    return keras.saving.load_model(path, **kwargs)
