"""Loading saved zoo models (`.keras` files)."""

import keras

from zoo.models.registry import register_all


def load_model(path, **kwargs):
    """`keras.saving.load_model` for models made with zoo: registers every model family's
    classes (and tflm's layers) with Keras first, which the cheap `import zoo` does not.
    Keyword arguments go to `keras.saving.load_model`."""
    register_all()
    return keras.saving.load_model(path, **kwargs)
