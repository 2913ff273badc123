"""Running one computation after another where the dataflow alone does not order them.

A TensorFlow graph (`tf.function`) runs ops without a data dependency concurrently: a loop
over K mixture components written in Python becomes K independent projections that may all
be alive at once, which defeats computing them one at a time to save memory. `after` adds
the missing edge: a control dependency on TensorFlow, and on JAX an
`jax.lax.optimization_barrier` over the value and its dependencies, which XLA may not
compute across. XLA's own scheduling did keep several components alive: the sequential
MoS head held 2.17 B*T*K*V tensors in a JAX training step on an H200 without the barrier
(bench/analysis/results/gpu_rank_tools.md). Eager PyTorch runs in program order: the value is returned as is.
"""

import keras


def after(value, dependencies):
    """`value`, made available only once every tensor in `dependencies` is computed."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax  # deferred: only the running backend's framework
        value, _ = jax.lax.optimization_barrier((value, list(dependencies)))
        return value
    if backend != "tensorflow":
        return value
    import tensorflow as tf  # deferred: only the running backend's framework
    if tf.executing_eagerly():
        return value
    with tf.control_dependencies(list(dependencies)):
        return tf.identity(value)
