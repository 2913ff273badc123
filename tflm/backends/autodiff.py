"""What reverse-mode differentiation looks like on each backend, where `keras.ops` has no word
for it: a vector-Jacobian product, and whether a while loop can be differentiated.

    value_and_vjp(fn, primals, cotangents)
        -> (fn(primals), [sum_i c_i^T d fn_i / d p for p in primals])
    value_and_pullback(fn, primals)
        -> (fn(primals), cotangents -> the same VJP), for cotangents that need the outputs

    TensorFlow  tf.GradientTape (unconnected gradients as zeros)
    JAX         jax.vjp
    PyTorch     torch.autograd.grad on detached copies of the primals (grad mode on)

`while_loop_is_differentiable()` says whether `keras.ops.while_loop` may be
reverse-differentiated: TensorFlow's while_v2 keeps every iteration's intermediates and
PyTorch's loop is a Python loop under autograd, but `jax.lax.while_loop` has no
reverse-mode rule (only a bounded `jax.lax.scan` has one).

`tflm.ode` uses both: the adjoint method needs a^T df/dy and a^T df/dtheta inside its
backward solve, and an adaptive solve differentiated by backpropagation needs a loop that
reverse mode can pass through (docs/design.md, contract 6: backend-specific code lives in
tflm/backends/). Each framework is imported only when its backend is the running one.
"""

import keras

_DIFFERENTIABLE_WHILE = {"tensorflow": True, "torch": True}


def while_loop_is_differentiable():
    """True where reverse mode passes through `keras.ops.while_loop` (TensorFlow, PyTorch)."""
    return _DIFFERENTIABLE_WHILE.get(keras.backend.backend(), False)


def value_and_vjp(fn, primals, cotangents):
    """`fn(primals)` (a list of tensors) and its VJP with `cotangents` w.r.t. each primal.

    Args:
        fn: callable taking a list of tensors and returning a list of tensors.
        primals: list of tensors to differentiate with respect to.
        cotangents: list of tensors, one per output of `fn`, of the outputs' shapes.

    Returns:
        `(outputs, grads)`: the outputs (no gradient history) and one tensor per primal
        (zeros where an output does not depend on it).
    """
    outputs, pullback = value_and_pullback(fn, primals)
    return outputs, pullback(cotangents)


def value_and_pullback(fn, primals):
    """`fn(primals)` and a function mapping cotangents to its VJP (one use).

    As `value_and_vjp`, for cotangents computed from the outputs themselves: fn runs once.

    Returns:
        `(outputs, pullback)`: the outputs (no gradient history) and `pullback(cotangents)`
        -> one tensor per primal (zeros where an output does not depend on it).
    """
    name = keras.backend.backend()
    if name == "tensorflow":
        return _tensorflow_pullback(fn, primals)
    if name == "jax":
        return _jax_pullback(fn, primals)
    if name == "torch":
        return _torch_pullback(fn, primals)
    raise NotImplementedError(
        f"vector-Jacobian products are not available on the {name!r} Keras backend; "
        "use TensorFlow, JAX or PyTorch.")


def _tensorflow_pullback(fn, primals):
    import tensorflow as tf  # deferred: only the running backend's framework
    with tf.GradientTape(persistent=False) as tape:
        for p in primals:
            tape.watch(p)
        outputs = list(fn(list(primals)))

    def pullback(cotangents):
        return list(tape.gradient(outputs, list(primals), output_gradients=list(cotangents),
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO))

    return [tf.stop_gradient(o) for o in outputs], pullback


def _jax_pullback(fn, primals):
    import jax  # deferred: only the running backend's framework
    outputs, vjp = jax.vjp(lambda *p: list(fn(list(p))), *primals)
    return outputs, lambda cotangents: list(vjp(list(cotangents)))


def _torch_pullback(fn, primals):
    import torch  # deferred: only the running backend's framework
    with torch.enable_grad():
        leaves = [p.detach().requires_grad_(True) for p in primals]
        outputs = list(fn(leaves))

    def pullback(cotangents):
        grads = [None] * len(leaves)
        pairs = [(o, c) for o, c in zip(outputs, cotangents) if o.requires_grad]
        if pairs:
            with torch.enable_grad():
                grads = torch.autograd.grad([o for o, _ in pairs], leaves,
                                            grad_outputs=[c for _, c in pairs],
                                            allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, leaves)]

    return [o.detach() for o in outputs], pullback
