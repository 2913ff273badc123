"""`tflm.backends.torch_layer_calls`: on PyTorch a layer inside a zoo model runs through
`layer.call` directly only where Keras' `Layer.__call__` would change nothing, and a model
trained that way (AWD-LSTM, Zaremba with a MoS head, Mogrifier) ends with the same weights,
bit for bit, as one trained through `Layer.__call__` everywhere."""

import pytest

from tests.tflm.backends.test_torch_seeds import run_counted

pytest.importorskip("torch")


# One preset per backbone; the MoS one for a head with layers of its own
PRESETS = {"awd_lstm_ptb": ["model.embed_dim=6", "model.hidden_dim=7"],
           "zaremba_small_mos_ptb": ["model.hidden_dim=6", "model.head.num_experts=2"],
           "mogrifier_ptb": ["model.embed_dim=6", "model.hidden_dim=6"]}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_direct_calls_train_the_same_weights_as_keras_calls(preset):
    result = run_counted(f"PRESET, SETS = {preset!r}, {PRESETS[preset]!r}\n" + """
import collections, json
import keras, numpy as np
from tflm.backends import torch_layer_calls
from tools.frameworks.keras_runner import PresetFit
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings

keras_direct = torch_layer_calls.direct
taken = collections.Counter()

def counted(layer, args, kwargs):
    went = keras_direct(layer, args, kwargs)
    taken[went] += 1
    return went

def train(direct):
    torch_layer_calls.direct = direct
    keras.utils.set_random_seed(3)
    config = resolve_config(PRESET, SETS)
    fit = PresetFit(RunSettings.from_config(config), 40, 6)
    initial.append([np.asarray(v.value.detach()).copy() for v in fit.model.weights])
    fit(3)
    fit(3)  # the state carried from the first fit's windows
    return [np.asarray(v.value.detach()) for v in fit.model.weights]

initial = []
direct = train(counted)
calls = dict(taken)
keras_calls = train(lambda layer, args, kwargs: False)
print("RESULT" + json.dumps({
    "taken": {str(k): v for k, v in calls.items()},
    "weights": len(direct),
    "equal": all(a.shape == b.shape and (a == b).all() for a, b in zip(direct, keras_calls)),
    "trained": any((a != b).any() for a, b in zip(direct, initial[0]))}))
""")
    # every call direct once the layers are built (the first step builds the head and the
    # dropouts through __call__)
    assert result["taken"]["True"] >= 5 * result["taken"].get("False", 0) > 0
    assert result["weights"] > 10
    assert result["trained"] and result["equal"]


def test_keras_calls_wherever_layer_call_would_differ():
    result = run_counted("""
import json
import keras, numpy as np, torch
from tflm import compat
from tflm.backends import torch_layer_calls
from tflm.layers import LockedDropout

x = torch.ones(2, 3, 4)
layer = LockedDropout(0.5, seed=1)
unbuilt = torch_layer_calls.direct(layer, (x,), {"training": True})
layer(x, training=True)

def direct(*args, layer=layer, **kwargs):
    return torch_layer_calls.direct(layer, args, kwargs)

masked = keras.layers.Embedding(5, 4, mask_zero=True)(torch.tensor([[0, 1, 2]]))
mixed = LockedDropout(0.5, seed=1, dtype="mixed_bfloat16")
mixed(x, training=True)
regularized = LockedDropout(0.5, seed=1, activity_regularizer="l2")
regularized(x, training=True)
cases = {
    "plain": direct(x, training=True),
    "plain, a list and a keyword scalar": direct([x, None], training=True, note="x"),
    "unbuilt": unbuilt,
    "training left to the call context": direct(x),
    "a NumPy array": direct(np.ones((2, 3, 4), "float32"), training=True),
    "float64": direct(x.double(), training=True),
    "a Keras mask": direct(masked, training=True),
    "a positional scalar": direct(x, 0.5, training=True),
    "a symbolic tensor": direct(keras.KerasTensor((2, 3, 4)), training=True),
    "mixed precision": direct(x, training=True, layer=mixed),
    "an activity regularizer": direct(x, training=True, layer=regularized),
}
handle = layer.register_forward_hook(lambda module, args, output: output * 0 + 7)
cases["a forward hook"] = direct(x, training=True)
hooked = torch_layer_calls.call(layer, x, training=True)
handle.remove()
cases["the hook removed"] = direct(x, training=True)


class MixedParent(keras.layers.Layer):  # its __call__ opens an autocast scope around call
    def call(self, inputs):
        cases["inside a mixed-precision layer's call"] = direct(x, training=True)
        return inputs


MixedParent(dtype="mixed_bfloat16")(x)
print("RESULT" + json.dumps({"cases": cases, "hook_ran": bool((hooked == 7).all()),
                             "mask_read": compat.keras_mask(masked) is not None}))
""")
    assert result["cases"] == {
        "plain": True, "plain, a list and a keyword scalar": True, "unbuilt": False,
        "training left to the call context": False, "a NumPy array": False,
        "float64": False, "a Keras mask": False, "a positional scalar": False,
        "a symbolic tensor": False, "mixed precision": False,
        "an activity regularizer": False, "a forward hook": False,
        "the hook removed": True, "inside a mixed-precision layer's call": False}
    assert result["hook_ran"] and result["mask_read"]
