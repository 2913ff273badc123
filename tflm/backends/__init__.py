"""The one seam between tflm's language-model machinery and a Keras backend.

Everything that differs between TensorFlow, JAX and PyTorch lives in this folder, behind
the small interface of `tflm.backends.base.Backend` (docs/design.md, contract 6):

    base.py                 the interface, and the defaults eager backends share
    gradients.py            the gradient logic every train step shares (clip, L2, T/bptt, ...)
    streams.py              the Python-held state between windows (eager backends)
    tensorflow_backend.py   TensorFlow: graph step with replica all-reduce   (+ _streams.py)
    jax_backend.py          JAX: stateless jitted steps                      (+ _streams.py)
    torch_backend.py        PyTorch: eager step
    lstm_kernels.py         which LSTM kernel runs a window: fused (cuDNN) or portable
    lstm_backward.py        the portable loop's backward pass written out (one dU GEMM)
    torch_lstm.py, jax_lstm.py   the fused kernels Keras does not offer
    torch_layer_calls.py    layers called without Keras' bookkeeping where it changes nothing

`current()` returns the object of the running Keras backend. Importing this package
imports no framework; each backend module is imported when first asked for.
"""

import importlib

import keras

from tflm.backends.base import Backend

_CLASSES = {
    "tensorflow": ("tflm.backends.tensorflow_backend", "TensorFlowBackend"),
    "jax": ("tflm.backends.jax_backend", "JaxBackend"),
    "torch": ("tflm.backends.torch_backend", "TorchBackend"),
}
_INSTANCES = {}


def current():
    """The `Backend` object of `keras.backend.backend()` (one per process and backend)."""
    name = keras.backend.backend()
    if name not in _INSTANCES:
        if name in _CLASSES:
            module, cls = _CLASSES[name]
            _INSTANCES[name] = getattr(importlib.import_module(module), cls)()
        else:
            _INSTANCES[name] = Backend()
    return _INSTANCES[name]


def tensorflow_installed():
    """Whether TensorFlow can be imported here, found without importing it (3 s and the
    GPU's memory on a JAX or PyTorch machine). Keras on JAX or PyTorch needs none; the
    TensorBoard callbacks then write their files with the `tensorboard` package alone."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except ImportError:  # a finder that refuses it (an environment that blocks TensorFlow)
        return False
