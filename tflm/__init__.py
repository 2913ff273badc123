"""tflm: Keras 3 layers, data and training parts for word-level recurrent language models
and the softmax bottleneck.

Importing `tflm` registers every layer with Keras serialization (package "tflm")."""

from tflm import activations, layers, losses, metrics  # noqa: F401

__version__ = "0.1.0"
