"""What every recurrent backbone's `call` shares (AWD-LSTM, Zaremba, Mogrifier): the window's
tokens split from their padding, one recurrent layer run from its carried state, and the
outputs dict the heads and `tflm.LanguageModel` read.

The carried state is float32 under a mixed precision policy too (`LanguageModel` keeps it so
across windows); a layer computes in its own dtype within the window.

Backbones call their layers, and a zoo model its backbone and head, through `call_layer`
(`tflm.backends.Backend.call_layer`): on PyTorch, `layer.call` directly where Keras'
`Layer.__call__` would only add host work, so a layer whose `call` takes `training` is
passed it.
"""

from keras import ops

from tflm import backends
from tflm.padding import padding_mask, without_padding


def split_padding(tokens):
    """`(int32 tokens with PAD_ID replaced, the (batch, time) mask of real positions or None
    when nothing is padded)`."""
    tokens = ops.cast(tokens, "int32")
    mask = padding_mask(tokens)
    return (tokens if mask is None else without_padding(tokens)), mask


def call_layer(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`, as the running backend calls a layer inside a model
    (`tflm.backends.Backend.call_layer`)."""
    return backends.current().call_layer(layer, *args, **kwargs)


def run_layer(layer, x, state, mask, training):
    """`(outputs, (h, c))` of a recurrent `layer` (return_sequences and return_state) on `x`
    from the carried `state` ((h, c), or None for zeros); the new state in float32."""
    initial = None if state is None else [ops.cast(s, layer.compute_dtype) for s in state]
    outputs, h, c = call_layer(layer, x, initial_state=initial, mask=mask,
                               training=training)
    return outputs, (ops.cast(h, "float32"), ops.cast(c, "float32"))


def backbone_outputs(sequence_output, layer_outputs, raw_outputs, states, mask):
    """The dict a backbone returns: "sequence_output", "layer_outputs", "raw_layer_outputs",
    "states", and "padding_mask" when the window is padded."""
    out = {"sequence_output": sequence_output, "layer_outputs": layer_outputs,
           "raw_layer_outputs": raw_outputs, "states": states}
    if mask is not None:
        out["padding_mask"] = mask
    return out
