"""TensorFlow: each stream's LSTM state in `tf.Variable`s, one copy per replica."""

import tensorflow as tf


class TensorFlowStreamState:
    """`tf.Variable`s of shape (None, units), one copy per replica (ON_READ).

    Create the model under `strategy.scope()`: each replica then carries the state of its
    own slice of the global batch (MirroredStrategy splits the batch the same way at every
    step, so replica r always sees the same streams).

    XLA (`jit_compile=True`) cannot change a variable's shape inside a compiled step, so the
    shape changes only outside one: `ensure(batch_size)` sizes the variables before a pass
    (`LanguageModel` asks for it when fit / evaluate / predict start, from the data's batch
    size) and `reset()` zeros them in place. Inside a graph a batch of another size (a last
    partial batch) still resizes them, which plain `tf.function` allows.
    """

    def __init__(self, sizes):
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
        for (h_var, c_var), (h, c) in zip(self._vars, states):
            h_var.assign(tf.stop_gradient(tf.cast(h, tf.float32)))
            c_var.assign(tf.stop_gradient(tf.cast(c, tf.float32)))

    def variables(self):
        return []  # tf.function reads and assigns them in place; nothing to carry

    @staticmethod
    def _rows(var):
        """Current number of rows (of the first replica's copy when distributed)."""
        components = getattr(var, "values", None)
        return int(tf.shape(components[0] if components else var)[0])

    def ensure(self, batch_size):
        """Give the variables `batch_size` zeroed rows unless they have that many (eager)."""
        changed = False
        for pair, n in zip(self._vars, self.sizes):
            for var in pair:
                if self._rows(var) != int(batch_size):
                    var.assign(tf.zeros([int(batch_size), n], tf.float32))
                    changed = True
        return changed

    def reset(self):
        for pair, n in zip(self._vars, self.sizes):
            for var in pair:
                var.assign(tf.zeros([self._rows(var), n], tf.float32))
