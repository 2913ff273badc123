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
    if keras.backend.backend() == "jax":
        return JaxStreamState(sizes)
    return EagerStreamState(sizes)


def _is_tracer(value):
    import jax
    return isinstance(value, jax.core.Tracer)


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

    def variables(self):
        """Keras variables the trainer must carry through a jitted step (none here)."""
        return []

    def write(self, states):
        if keras.backend.backend() == "jax":
            if any(_is_tracer(t) for pair in states for t in pair):
                raise NotImplementedError(
                    "Carrying LSTM state across windows inside a jitted JAX function needs "
                    "the model's state variables, which model.fit / evaluate / predict and "
                    "*_on_batch create from the first batch. In your own jitted function, "
                    "build the model with carry_state=False, or call "
                    "model.forward_with_state(tokens, states) and carry the states yourself.")
        self._states = [(ops.stop_gradient(h), ops.stop_gradient(c)) for h, c in states]

    def reset(self):
        self._states = None


class JaxStreamState(EagerStreamState):
    """JAX: non-trainable Keras variables of a fixed batch shape, carried through `jit`.

    Keras' JAX trainer runs `train_step` / `test_step` statelessly under `jax.jit`; the state
    can only cross from one window to the next as part of the model's non-trainable
    variables. `ensure(batch_size)` creates them, shape (batch_size, units), float32, outside
    `jit` (`LanguageModel` calls it when fit / evaluate / predict / *_on_batch start, from
    the first batch); `LanguageModel.variables` then lists them, so they travel in the
    trainer's `non_trainable` state and `stateless_call` reads and assigns them. They are not
    weights: not saved, not in `get_weights()`.

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
        self._vars = [
            tuple(keras.Variable(ops.zeros((batch_size, n), "float32"), trainable=False,
                                 dtype="float32", name=f"stream_state_{i}_{kind}")
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
            from keras.src.backend.common.symbolic_scope import in_symbolic_scope
            if self._vars is not None or in_symbolic_scope():
                return  # shape inference, or a batch of another size inside jit: not carried
        super().write(states)

    def reset(self):
        super().reset()
        for var in self.variables():
            if getattr(var, "_value", None) is not None:
                var.assign(ops.zeros(var.shape, "float32"))


class TensorFlowStreamState:
    """`tf.Variable`s of shape (None, units), one copy per replica (ON_READ).

    Create the model under `strategy.scope()`: each replica then carries the state of its
    own slice of the global batch (MirroredStrategy splits the batch the same way at every
    step, so replica r always sees the same streams).

    XLA (`jit_compile=True`) cannot change a variable's shape inside a compiled step, so the
    shape changes only outside one: `ensure(batch_size)` sizes the variables before a
    pass (`LanguageModel` calls it when fit / evaluate / predict start, from the data's batch
    size) and `reset()` zeros them in place. Inside a graph a batch of another size (a last
    partial batch) still resizes them, which plain `tf.function` allows.
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

    def _rows(self, var):
        """Current number of rows (of the first replica's copy when distributed)."""
        components = getattr(var, "values", None)
        return int(self._tf.shape(components[0] if components else var)[0])

    def ensure(self, batch_size):
        """Give the variables `batch_size` zeroed rows unless they have that many (eager)."""
        tf = self._tf
        for pair, n in zip(self._vars, self.sizes):
            for var in pair:
                if self._rows(var) != int(batch_size):
                    var.assign(tf.zeros([int(batch_size), n], tf.float32))

    def reset(self):
        tf = self._tf
        for pair, n in zip(self._vars, self.sizes):
            for var in pair:
                var.assign(tf.zeros([self._rows(var), n], tf.float32))
