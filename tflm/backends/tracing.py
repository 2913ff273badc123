"""Whether a tensor's values are known now (eager) or only when a traced program runs."""

import keras


def is_concrete(tensor):
    """True for eager tensors (PyTorch, TensorFlow eager, JAX outside `jit`); False inside a
    TensorFlow graph or a JAX trace, where values exist only when the program runs."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.executing_eagerly()
    if backend == "jax":
        import jax
        return not isinstance(tensor, jax.core.Tracer)
    return True
