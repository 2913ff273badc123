"""Host copies of small device values on PyTorch (dropout seeds, step counts), read from the
device only after an outside write.

`keras.random.uniform(shape, seed=generator)` on PyTorch turns the `SeedGenerator`'s state
`(a, b)` into a `torch.Generator` seed, `int(a + b) & 0xFFFFFFFF`, and advances the state by
`(0, 1)` (Keras 3.15, `keras/src/backend/torch/random.py`). Where the state lives on a GPU,
`int(...)` copies it back to the host and the `(0, 1)` increment is copied from a NumPy
array to the device: two stream synchronisations per mask, eight a step for an AWD-LSTM
(embedding, input, hidden and output dropouts, three DropConnect masks). Each stops the host
from queueing the step's later kernels while the GPU works.

`HostCopies.next_seed` keeps a host copy of each generator's state, read once from the
device and then advanced on the host beside the device's own update (`state + (0, 1)`,
with an increment kept on the device). The copy is used only while the device state is the
one it was taken from: the same tensor, at the in-place version counter
(`compat.torch_tensor_version`) of the copy's own update. Anything else that writes the
state (loading weights, `assign`, a `keras.StatelessScope`'s value) changes that counter or
the tensor, and the next draw reads the device again. The seeds, the state's updates and so
the masks are Keras' own, bit for bit.

`HostCopies.value` does the same for an integer variable that host code reads at every step
(`tflm.optimizers.AveragedSGD`: its iteration count and averaging start, to know whether a
step is averaged): read once, then kept while the tensor is the one read, at the version
counter of the last read or of the caller's own reported write.
"""

import weakref

import torch

from tflm import compat

_MASK32 = 0xFFFFFFFF


def _int32(value):
    """`value` wrapped to a signed 32-bit integer, as int32 addition on the device wraps."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


class HostCopies:
    """Host copies of small variables' values (see the module docstring): a seed
    generator's state, an integer count. Keyed by the variable's identity (Keras variables
    are not hashable); an entry goes with its variable."""

    def __init__(self):
        # id(variable) -> (weakref to it, its tensor, that tensor's version, the value)
        self._copies = {}
        self._increments = {}  # (device, dtype) -> tensor (0, 1)

    def value(self, variable, read):
        """The host copy of `variable`'s value, or `read(tensor)` of its tensor (kept as
        the copy) where it was written since the last read or `written` report."""
        tensor = variable.value
        known = self._copies.get(id(variable))
        if (known is not None and known[0]() is variable and known[1] is tensor
                and known[2] == compat.torch_tensor_version(tensor)):
            return known[3]
        value = read(tensor)
        self.written(variable, value)
        return value

    def written(self, variable, value):
        """The caller's own write, just made: `variable` holds `value` now."""
        key, copies, tensor = id(variable), self._copies, variable.value

        def forget(ref):
            if copies.get(key, (None,))[0] is ref:
                del copies[key]

        copies[key] = (weakref.ref(variable, forget), tensor,
                       compat.torch_tensor_version(tensor), value)

    def next_seed(self, generator, assign_add):
        """The `torch.Generator` seed of `generator`'s next draw, `(a + b) & 0xFFFFFFFF`;
        advances its state by `(0, 1)` as `SeedGenerator.next` does, with
        `assign_add(variable, value)` (the backend's `Backend.assign_add`)."""
        state = generator.state
        first, second = self.value(state, lambda tensor: tuple(tensor.tolist()))
        assign_add(state, self._increment(state.value))
        self.written(state, (first, _int32(second + 1)))
        return (first + second) & _MASK32

    def _increment(self, like):
        """`(0, 1)` in `like`'s dtype on its device, made once per device and dtype."""
        key = (like.device, like.dtype)
        if key not in self._increments:
            self._increments[key] = torch.tensor([0, 1], dtype=like.dtype, device=like.device)
        return self._increments[key]
