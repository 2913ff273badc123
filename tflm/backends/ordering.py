"""Running one computation after another where the dataflow alone does not order them.

A TensorFlow graph (`tf.function`) runs ops without a data dependency concurrently: a loop
over K mixture components written in Python becomes K independent projections that may all
be alive at once, which defeats computing them one at a time to save memory. `after` adds
the missing edge (a control dependency). Eager PyTorch runs in program order and XLA (JAX)
schedules with memory in view, so elsewhere it returns the value unchanged.
"""

import keras


def after(value, dependencies):
    """`value`, made available only once every tensor in `dependencies` is computed."""
    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf
    if tf.executing_eagerly():
        return value
    with tf.control_dependencies(list(dependencies)):
        return tf.identity(value)
