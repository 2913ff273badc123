"""JAX: each stream's LSTM state in non-trainable variables of a fixed batch shape."""

import jax
import keras
from keras import ops

from tflm.backends.streams import EagerStreamState


def _is_tracer(value):
    return isinstance(value, jax.core.Tracer)


def stream_layout(batch_size):
    """The layout of `(batch_size, units)` state under `keras.distribution.DataParallel`:
    sharded by stream along the distribution's batch axis, as the batches are, so each
    device keeps its own streams' state (None, Keras' own choice, without one, or where
    the devices do not divide the streams)."""
    distribution = keras.distribution.distribution()
    if not isinstance(distribution, keras.distribution.DataParallel):
        return None
    mesh = distribution.device_mesh
    devices = mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]
    if batch_size % devices:
        return None
    return keras.distribution.TensorLayout([distribution.batch_dim_name, None], mesh)


class JaxStreamState(EagerStreamState):
    """Non-trainable Keras variables of a fixed batch shape, carried through `jit`.

    Keras' JAX trainer runs `train_step` / `test_step` statelessly under `jax.jit`; the state
    can only cross from one window to the next as part of the model's non-trainable
    variables. `ensure(batch_size)` creates them, shape (batch_size, units), float32, outside
    `jit` (`LanguageModel` asks for it when fit / evaluate / predict / *_on_batch start,
    from the data's batch size); `LanguageModel.variables` then lists them, so they travel
    in the trainer's `non_trainable` state and `stateless_call` reads and assigns them.
    They are not weights: not saved, not in `get_weights()`. Under
    `keras.distribution.DataParallel` they are sharded by stream (`stream_layout`).

    Without variables of the batch's size (a direct eager call, or a last partial batch)
    the store behaves as `EagerStreamState`: eager calls carry the state in Python; inside
    `jit` such a batch starts from zeros and its final state is dropped.
    """

    def __init__(self, sizes):
        super().__init__(sizes)
        self._vars = None

    def variables(self):
        if self._vars is None:
            return []
        return [v for pair in self._vars for v in pair]

    def batch_size(self):
        return None if self._vars is None else int(self._vars[0][0].shape[0])

    def ensure(self, batch_size):
        """Create zeroed state variables for `batch_size` streams (outside `jit`).

        Returns True when new variables were made (the variable list changed)."""
        batch_size = int(batch_size)
        if self._vars is not None and self.batch_size() == batch_size:
            return False
        layout = stream_layout(batch_size)
        self._vars = [
            tuple(keras.Variable(ops.zeros((batch_size, n), "float32"), trainable=False,
                                 dtype="float32", name=f"stream_state_{i}_{kind}",
                                 layout=layout)
                  for kind in ("h", "c"))
            for i, n in enumerate(self.sizes)]
        self._states = None
        return True

    def _fits(self, batch_size):
        return self._vars is not None and self.batch_size() == int(batch_size)

    def read(self, batch_size, dtype):
        if self._fits(batch_size):
            return [(ops.cast(h.value, dtype), ops.cast(c.value, dtype)) for h, c in self._vars]
        return super().read(batch_size, dtype)

    def write(self, states):
        batch_size = int(ops.shape(states[0][0])[0])
        if self._fits(batch_size):
            for (h_var, c_var), (h, c) in zip(self._vars, states):
                h_var.assign(ops.stop_gradient(ops.cast(h, "float32")))
                c_var.assign(ops.stop_gradient(ops.cast(c, "float32")))
            return
        if any(_is_tracer(t) for pair in states for t in pair):
            if self._vars is not None:
                return  # a batch of another size inside jit: not carried
            raise NotImplementedError(
                "Carrying LSTM state across windows inside a jitted JAX function needs "
                "the model's state variables, which model.fit / evaluate / predict and "
                "*_on_batch create from the first batch. In your own jitted function, "
                "build the model with carry_state=False, or call "
                "model.forward_with_state(tokens, states) and carry the states yourself.")
        super().write(states)

    def reset(self):
        super().reset()
        for var in self.variables():
            var.assign(ops.zeros(var.shape, "float32"))
