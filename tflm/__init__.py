"""tflm: Keras 3 layers, data and training parts for word-level recurrent language models
and the softmax bottleneck.

Importing `tflm` registers every layer and optimizer with Keras serialization (package
"tflm"), so saved models load with `keras.saving.load_model` after `import tflm`."""

from tflm import (activations, callbacks, layers, losses, metrics, optimizers,  # noqa: F401
                  regularizers, triggers)
from tflm.language_model import LanguageModel  # noqa: F401

__version__ = "0.1.0"
