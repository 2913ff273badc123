"""Weights by role: the Keras side of the mapping the native PyTorch peer uses.

Every backend and the native peer start from the same initial weights, exchanged as NumPy
arrays keyed by role (the native side is `NativeAWDLSTM.load_roles` / `export_roles` in
`tools.frameworks.torch_native`, which transposes into PyTorch's layout):

    "embedding", "output_bias"                               the tied embedding and its bias
    "lstm{i}.kernel", ".recurrent_kernel", ".bias"           Keras layout (in, 4n), (n, 4n), (4n)
    "head.<variable name>"                                   the head's own weights
    "var:<path without the model name>"                      anything else

The same architecture gives the same roles on every Keras backend.
"""

import keras
import numpy as np


def keras_roles(model):
    """role -> Keras variable for every trainable weight of a `zoo.AWDLSTM`."""
    roles = {"embedding": model.embedding.embeddings}
    if model.embedding.output_bias is not None:
        roles["output_bias"] = model.embedding.output_bias
    for i, lstm in enumerate(model.lstms):
        roles[f"lstm{i}.kernel"] = lstm.cell.kernel
        roles[f"lstm{i}.recurrent_kernel"] = lstm.cell.recurrent_kernel
        roles[f"lstm{i}.bias"] = lstm.cell.bias
    seen = {id(v) for v in roles.values()}
    for v in model.head.trainable_weights:
        if id(v) not in seen:
            roles[f"head.{v.name}"] = v
            seen.add(id(v))
    for v in model.trainable_weights:
        if id(v) not in seen:
            roles["var:" + v.path.split("/", 1)[-1]] = v
            seen.add(id(v))
    if len(roles) != len(model.trainable_weights):
        raise RuntimeError("role names collide; cannot map weights by role.")
    return roles


def export_keras_roles(model):
    """The model's trainable weights by role, as float32 NumPy arrays."""
    return {role: np.asarray(keras.ops.convert_to_numpy(v.value), dtype=np.float32)
            for role, v in keras_roles(model).items()}


def load_keras_roles(model, arrays):
    """Assign weights given by role (NumPy arrays) to the model's variables."""
    roles = keras_roles(model)
    missing, extra = sorted(set(roles) - set(arrays)), sorted(set(arrays) - set(roles))
    if missing or extra:
        raise RuntimeError(f"initial weights do not fit the model: missing {missing}, "
                           f"unexpected {extra}.")
    for role, var in roles.items():
        value = arrays[role]
        if tuple(value.shape) != tuple(var.shape):
            raise RuntimeError(f"{role}: saved shape {value.shape} != model {tuple(var.shape)}")
        var.assign(value.astype(np.float32))
