"""The language-model train step, one implementation per backend.

Every backend does the same thing (reference: salesforce/awd-lstm-lm main.py `train`):

    loss  = mean NLL over the window's tokens + sum(model.losses)      (AR, TAR, DOC's CV, ...)
    g     = grad(loss)                      (summed over replicas when distributed)
    g     = g * min(1, clip_norm / ||g||_2)    (global norm, after the replica all-reduce)
    g     = g + weight_decay * theta            (L2 decay as torch.optim.SGD's weight_decay:
                                             added after clipping, scaled with the step)
    g     = g * T / bptt                    (the reference scales the learning rate of a window
                                             of length T by T / bptt; for SGD and averaged SGD
                                             scaling the clipped gradient is the same update)
    optimizer.apply(g)

Flooding (Ishida et al. 2020), when `model.flooding_level` b is set, multiplies the gradient
by sign(L - b) of the *global* window loss L (the gradient of |L - b| + b), after the replica
all-reduce. Under mixed_float16 the loss is multiplied by the optimizer's loss scale before
differentiation and the gradients are unscaled before clipping, then rescaled for the
`LossScaleOptimizer`, which checks them for overflow and unscales them again.
"""

import keras
from keras import ops

from tflm.padding import real_position_weights


def clip_and_scale(grads, clip_norm, scale, variables=None, weight_decay=0.0):
    """Clip `grads` to global norm `clip_norm` (None: no clipping), add `weight_decay *
    variable`, multiply by `scale`. Returns (new grads, norm before clipping)."""
    squares = [ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads if g is not None]
    norm = ops.sqrt(ops.sum(ops.stack(squares)))
    factor = scale
    if clip_norm is not None and clip_norm > 0:
        factor = ops.minimum(1.0, clip_norm / ops.maximum(norm, 1e-12)) * scale
    out = []
    for i, g in enumerate(grads):
        if g is None:
            out.append(None)
            continue
        g = g * ops.cast(factor, g.dtype)
        if weight_decay:
            g = g + ops.cast(weight_decay * scale, g.dtype) * ops.cast(variables[i], g.dtype)
        out.append(g)
    return out, norm


def _loss_scale(optimizer):
    """The dynamic loss scale of a `LossScaleOptimizer`, else None."""
    return getattr(optimizer, "dynamic_scale", None)


def _processed(model, grads, variables, x, loss, num_replicas=1):
    """Unscale, flood, clip, L2 and window-scale the (already all-reduced) gradients."""
    scale = _loss_scale(model.optimizer)
    if scale is not None:
        grads = [None if g is None else g / ops.cast(scale, g.dtype) for g in grads]
    if model.flooding_level is not None:
        from tflm.flooding import flood_sign
        sign = flood_sign(loss, model.flooding_level)
        grads = [None if g is None else g * ops.cast(sign, g.dtype) for g in grads]
    grads, norm = clip_and_scale(grads, model.clip_norm,
                                 window_scale(model, x) / float(num_replicas),
                                 variables, model.weight_decay)
    if scale is not None:
        grads = [None if g is None else g * ops.cast(scale, g.dtype) for g in grads]
    return grads, norm


def window_scale(model, x):
    """T / bptt for a window of T real positions (padding left out; 1.0 when the model does
    not scale)."""
    if not model.scale_by_window:
        return 1.0
    real = ops.sum(real_position_weights(x)) / ops.cast(ops.shape(x)[0], "float32")
    return real / float(model.bptt)


def tensorflow_train_step(model, data):
    import tensorflow as tf
    from keras.src.losses.loss import scale_loss_for_distribution
    from keras.src.trainers.data_adapters import data_adapter_utils

    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        log_probs = model(x, training=True)
        loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight, inputs=x)
        replica_loss = scale_loss_for_distribution(loss)
        if _loss_scale(model.optimizer) is not None:
            replica_loss = model.optimizer.scale_loss(replica_loss)
    variables = model.trainable_variables
    grads = tape.gradient(replica_loss, variables)
    replica_ctx = tf.distribute.get_replica_context()
    num_replicas = 1 if replica_ctx is None else replica_ctx.num_replicas_in_sync
    global_loss = loss
    if num_replicas > 1:
        # Clip on the all-reduced (global) gradient; the optimizer sums again, hence / R.
        present = [i for i, g in enumerate(grads) if g is not None]
        reduced = replica_ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                         [grads[i] for i in present] + [replica_loss])
        for i, g in zip(present, reduced[:-1]):
            grads[i] = g
        global_loss = reduced[-1]
        if _loss_scale(model.optimizer) is not None:
            global_loss = global_loss / model.optimizer.dynamic_scale
    grads, norm = _processed(model, grads, variables, x, global_loss, num_replicas)
    model.optimizer.apply(grads, variables)
    return model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=norm)


def torch_train_step(model, data):
    import torch
    from keras.src.trainers.data_adapters import data_adapter_utils

    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    model.zero_grad()
    log_probs = model(x, training=True)
    loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight, inputs=x)
    scaled = loss if _loss_scale(model.optimizer) is None else model.optimizer.scale_loss(loss)
    scaled.backward()
    variables = model.trainable_variables
    grads = [v.value.grad for v in variables]
    with torch.no_grad():
        grads, norm = _processed(model, grads, variables, x, loss.detach())
        model.optimizer.apply(grads, variables)
    return model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=norm)


def lm_train_step(model, *args):
    """`lm_train_step(model, data)` (TensorFlow, PyTorch) or `lm_train_step(model, state,
    data)` (JAX, stateless: see `tflm.backends.jax_step`)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return tensorflow_train_step(model, *args)
    if backend == "torch":
        return torch_train_step(model, *args)
    if backend == "jax":
        from tflm.backends.jax_step import jax_train_step
        return jax_train_step(model, *args)
    raise NotImplementedError(
        f"The language-model train step is implemented for the TensorFlow, JAX and PyTorch "
        f"backends; KERAS_BACKEND={backend!r} can run the model forward "
        "(model.forward_with_state) but not model.fit.")
