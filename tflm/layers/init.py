"""Initialisation schemes the layers offer: Keras' defaults or PyTorch's (the reference code's).

    init="keras"    glorot-uniform input kernels, orthogonal recurrent kernels, zero biases
                    with a unit forget-gate bias (`keras.layers.LSTM`, `keras.layers.Dense`)
    init="pytorch"  what `torch.nn.LSTM` and `torch.nn.Linear` do, and so every reference
                    implementation of AWD-LSTM, MoS and DOC: each LSTM weight and bias
                    ~ U(-1/sqrt(H), 1/sqrt(H)) with H the hidden size; a Linear layer's weight
                    ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5))
                    and its bias likewise (unless the reference zeroes it)
"""

import math

import keras

INITS = ("keras", "pytorch")


def check_init(layer_name, init):
    """`init` if it names a scheme, else a ValueError that lists them."""
    if init not in INITS:
        raise ValueError(f"{layer_name}: init must be one of {', '.join(map(repr, INITS))}; "
                         f"got init={init!r}.")
    return init


def torch_uniform(fan):
    """U(-1/sqrt(fan), 1/sqrt(fan)): PyTorch's LSTM (fan = hidden size) and Linear (fan =
    fan_in) initialisation. Unseeded: draws follow `keras.utils.set_random_seed`."""
    bound = 1.0 / math.sqrt(float(fan))
    return keras.initializers.RandomUniform(-bound, bound)
