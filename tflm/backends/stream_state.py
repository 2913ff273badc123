"""Where a language model keeps each stream's LSTM state between BPTT windows.

The state is data: the model reads it as the initial state of the next window and writes the
final (gradient-stopped) state back. Nothing here is a Keras weight, so it is neither trained
nor saved. A store is empty after `reset()`; reading an empty store, or one holding a batch
of another size, gives zeros (a new pass over a split, or a new batch size, starts fresh).
"""

import keras
from keras import ops


def make_stream_state(sizes):
    """A store for layers with hidden sizes `sizes` (one (h, c) pair per layer)."""
    if keras.backend.backend() == "tensorflow":
        return TensorFlowStreamState(sizes)
    return EagerStreamState(sizes)


class EagerStreamState:
    """Python-held state for eager backends (PyTorch, NumPy, JAX outside `jit`)."""

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
        if keras.backend.backend() == "jax":
            import jax
            if any(isinstance(t, jax.core.Tracer) for pair in states for t in pair):
                raise NotImplementedError(
                    "Carrying LSTM state across windows inside a jitted JAX function is not "
                    "supported yet. Use the TensorFlow backend for model.fit/evaluate, build "
                    "the model with carry_state=False, or call "
                    "model.forward_with_state(tokens, states) "
                    "and carry the states yourself.")
        self._states = [(ops.stop_gradient(h), ops.stop_gradient(c)) for h, c in states]

    def reset(self):
        self._states = None


class TensorFlowStreamState:
    """`tf.Variable`s of shape (None, units), one copy per replica (ON_READ).

    Create the model under `strategy.scope()`: each replica then carries the state of its
    own slice of the global batch (MirroredStrategy splits the batch the same way at every
    step, so replica r always sees the same streams).
    """

    def __init__(self, sizes):
        import tensorflow as tf
        self._tf = tf
        self.sizes = [int(s) for s in sizes]
        self._vars = []
        for i, n in enumerate(self.sizes):
            pair = tuple(
                tf.Variable(tf.zeros([0, n], tf.float32), shape=tf.TensorShape([None, n]),
                            trainable=False, name=f"stream_state_{i}_{kind}",
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                for kind in ("h", "c"))
            self._vars.append(pair)

    def read(self, batch_size, dtype):
        tf = self._tf
        out = []
        for (h_var, c_var), n in zip(self._vars, self.sizes):
            pair = []
            for var in (h_var, c_var):
                value = var.read_value()
                fits = tf.equal(tf.shape(value)[0], batch_size)
                value = tf.cond(fits, lambda v=value: v,
                                lambda: tf.zeros(tf.stack([batch_size, n]), tf.float32))
                pair.append(tf.cast(value, dtype))
            out.append(tuple(pair))
        return out

    def write(self, states):
        tf = self._tf
        for (h_var, c_var), (h, c) in zip(self._vars, states):
            h_var.assign(tf.stop_gradient(tf.cast(h, tf.float32)))
            c_var.assign(tf.stop_gradient(tf.cast(c, tf.float32)))

    def reset(self):
        tf = self._tf
        for pair, n in zip(self._vars, self.sizes):
            for var in pair:
                var.assign(tf.zeros([0, n], tf.float32))
