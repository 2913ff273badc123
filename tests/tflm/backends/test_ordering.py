"""`tflm.backends.ordering.after`: the value unchanged (and its gradient), ordered after its
dependencies: a control dependency on TensorFlow, an optimization barrier on JAX."""

import json

from tests.backends import run_in_backend


def test_jax_after_is_an_optimization_barrier_with_the_same_value_and_gradient():
    out = run_in_backend("jax", """
        import json
        import jax, jax.numpy as jnp
        from tflm.backends.ordering import after

        def f(x, y):
            total = jnp.sum(y ** 2)
            return jnp.sum(after(x * 2.0, [total]) * x) + total

        x, y = jnp.arange(3.0), jnp.ones(2)
        jaxpr = str(jax.make_jaxpr(f)(x, y))
        g = jax.grad(f, argnums=(0, 1))(x, y)
        print(json.dumps(["optimization_barrier" in jaxpr, float(f(x, y)),
                          [float(v) for v in g[0]], [float(v) for v in g[1]]]))
    """)
    barrier, value, gx, gy = json.loads(out.strip().splitlines()[-1])
    assert barrier
    assert value == 2 * (0 + 1 + 4) + 2
    assert gx == [0.0, 4.0, 8.0] and gy == [2.0, 2.0]


def test_tensorflow_after_adds_a_control_dependency_in_a_graph():
    import tensorflow as tf

    from tflm.backends.ordering import after

    @tf.function
    def f(x, y):
        total = tf.reduce_sum(y)
        return after(x, [total])

    graph = f.get_concrete_function(tf.TensorSpec([3]), tf.TensorSpec([2])).graph
    identity = [op for op in graph.get_operations() if op.type == "Identity"
                and any(c.type == "Sum" for c in op.control_inputs)]
    assert identity
    assert f(tf.constant([1.0, 2.0, 3.0]), tf.ones(2)).numpy().tolist() == [1.0, 2.0, 3.0]
