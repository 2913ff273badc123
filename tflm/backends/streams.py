"""Where a language model keeps each stream's LSTM state between BPTT windows.

The state is data (docs/design.md, contract 3): the model reads it as the initial state of
the next window and writes the final (gradient-stopped) state back. Nothing here is a Keras
weight, so it is neither trained nor saved. A store is empty after `reset()`; reading an
empty store, or one holding a batch of another size, gives zeros (a new pass over a split,
or a new batch size, starts fresh).

Every store has the same five methods:

    read(batch_size, dtype) -> [(h, c)] per layer     write([(h, c)] per layer)
    reset()                                           ensure(batch_size)   (size it ahead)
    variables()                                       Keras variables a compiled step carries

`EagerStreamState` keeps the state in Python (PyTorch, and any eager backend); TensorFlow
and JAX keep it in variables (`tensorflow_streams`, `jax_streams`).
"""

from keras import ops


class EagerStreamState:
    """Python-held state, for eager backends."""

    def __init__(self, sizes):
        self.sizes = [int(s) for s in sizes]
        self._states = None

    def read(self, batch_size, dtype):
        states = self._states
        if states is None or int(ops.shape(states[0][0])[0]) != int(batch_size):
            return [(ops.zeros((batch_size, n), dtype), ops.zeros((batch_size, n), dtype))
                    for n in self.sizes]
        return [(ops.cast(h, dtype), ops.cast(c, dtype)) for h, c in states]

    def write(self, states):
        self._states = [(ops.stop_gradient(h), ops.stop_gradient(c)) for h, c in states]

    def ensure(self, batch_size):
        """Hold zeros for `batch_size` streams unless it holds that many (what `read`
        would give): a compiled step then always finds a state (`torch.compile` guards on
        whether there is one). Returns True when it made them."""
        states = self._states
        if states is not None and int(ops.shape(states[0][0])[0]) == int(batch_size):
            return False
        self._states = [(ops.zeros((batch_size, n), "float32"),
                         ops.zeros((batch_size, n), "float32")) for n in self.sizes]
        return True

    def variables(self):
        return []

    def reset(self):
        self._states = None
