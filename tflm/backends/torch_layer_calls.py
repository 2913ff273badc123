"""Keras layers called without `Layer.__call__`'s bookkeeping where it changes nothing (PyTorch).

In eager PyTorch every call of a Keras layer runs its `Layer.__call__` on the host, around
`layer.call`: the arguments mapped over for dtype conversion, a `CallSpec` bound from the
signature, the input spec checked, the training flag resolved from the call context, the
mask arguments filled and the outputs' mask metadata set, an autocast and a name scope,
`torch.nn.Module.__call__` and Keras' traceback filtering. For the tensors tflm passes
between its own layers all of it leaves `call`'s result as it is. On this 2-core CPU it
costs 58 us for a layer whose `call` returns its input, and a `WeightDropLSTM` called
with its initial state, mask and training flag took 1,022 us against 496 us for its
`call` (tiny sizes: 20 x 70 x 8); an AWD-LSTM training step calls 11 layers inside the
model. A GPU step of the preset is bound by the host's work
(bench/training/results/step_profile.md: Keras on PyTorch 74 % idle), so the host's time
is the step's.

`call(layer, *args, **kwargs)` runs `layer.call(*args, **kwargs)` when `Layer.__call__`
would have run it unchanged:

    the layer is built                       (else __call__ builds it)
    no activity regularizer                  (else __call__ adds its loss)
    `compat.keras_call_is_plain(layer)`      no autocast scope to open or leave (a float32
                                             policy, no mixed-precision scope around), no
                                             rematerialization, no PyTorch module hooks
    no `keras.distribution`                  (else __call__ lays the outputs out)
    tensors or None as arguments             PyTorch tensors, in lists or tuples or not;
                                             a keyword argument may also be a Python
                                             scalar or string (else __call__ converts
                                             arrays, raises on a non-tensor positional
                                             argument, or traces symbolic tensors)
    no floating tensor of another dtype      than the layer computes in (else __call__
                                             casts it)
    no tensor carrying a Keras mask          (else __call__ fills the `mask` argument)
    `training` passed when `call` takes it   (else __call__ takes it from the outer call)

and `layer(*args, **kwargs)` otherwise. What a direct call leaves out is bookkeeping
whose result tflm does not read: the input spec check (tflm's callers pass the shapes
`build` was given), the Keras mask metadata on the outputs (tflm passes masks as
arguments) and the name scope (variables are made in `build`). Losses a layer adds in
`call` (`add_loss`) are kept as under `__call__`: the model's own call, the entry of the
call context, clears them once per step either way.

Under `torch.compile`'s tracing (`jit_compile=True`: `tflm.backends.torch_compiled_step`)
the direct call also keeps the forward pass one graph: `Layer.__call__` binds a `CallSpec`
with `inspect.Signature.bind`, where dynamo breaks the graph.
"""

import inspect

import keras
import torch

from tflm import compat

_SCALARS = (bool, int, float, str)


_TAKES_TRAINING = {}  # layer class -> whether its `call` takes `training`


def _takes_training(cls):
    # a dict, not functools.lru_cache: dynamo traces through an lru_cache (and warns)
    if cls not in _TAKES_TRAINING:
        _TAKES_TRAINING[cls] = "training" in inspect.signature(cls.call).parameters
    return _TAKES_TRAINING[cls]


def _plain_value(value, dtype, positional):
    """Whether `Layer.__call__` would pass `value` to `call` unchanged."""
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        return ((dtype is None or not value.is_floating_point()
                 or keras.backend.standardize_dtype(value.dtype) == dtype)
                and compat.keras_mask(value) is None)
    if isinstance(value, (list, tuple)):
        return all(_plain_value(v, dtype, positional) for v in value)
    return not positional and isinstance(value, _SCALARS)


def direct(layer, args, kwargs):
    """Whether `layer.call(*args, **kwargs)` gives what `layer(*args, **kwargs)` would."""
    if not layer.built or layer.activity_regularizer is not None:
        return False
    if keras.distribution.distribution() is not None:
        return False
    if not compat.keras_call_is_plain(layer):
        return False
    if "training" not in kwargs and _takes_training(type(layer)):
        return False
    dtype = layer.input_dtype if layer.autocast else None
    return (all(_plain_value(a, dtype, True) for a in args)
            and all(_plain_value(v, dtype, False) for v in kwargs.values()))


def call(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`, through `layer.call` directly where that is the same
    (the module docstring)."""
    if direct(layer, args, kwargs):
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)
