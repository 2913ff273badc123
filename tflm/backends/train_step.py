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
"""

import keras
from keras import ops


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


def window_scale(model, x):
    """T / bptt for a window of length T (1.0 when the model does not scale)."""
    if not model.scale_by_window:
        return 1.0
    return ops.cast(ops.shape(x)[1], "float32") / float(model.bptt)


def tensorflow_train_step(model, data):
    import tensorflow as tf
    from keras.src.losses.loss import scale_loss_for_distribution
    from keras.src.trainers.data_adapters import data_adapter_utils

    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        log_probs = model(x, training=True)
        loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight)
        replica_loss = scale_loss_for_distribution(loss)
    variables = model.trainable_variables
    grads = tape.gradient(replica_loss, variables)
    replica_ctx = tf.distribute.get_replica_context()
    num_replicas = 1 if replica_ctx is None else replica_ctx.num_replicas_in_sync
    if num_replicas > 1:
        # Clip on the all-reduced (global) gradient; the optimizer sums again, hence / R.
        present = [i for i, g in enumerate(grads) if g is not None]
        reduced = replica_ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                         [grads[i] for i in present])
        for i, g in zip(present, reduced):
            grads[i] = g
    grads, norm = clip_and_scale(grads, model.clip_norm,
                                 window_scale(model, x) / float(num_replicas),
                                 variables, model.weight_decay)
    model.optimizer.apply(grads, variables)
    return model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=norm)


def torch_train_step(model, data):
    import torch
    from keras.src.trainers.data_adapters import data_adapter_utils

    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    model.zero_grad()
    log_probs = model(x, training=True)
    loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight)
    loss.backward()
    variables = model.trainable_variables
    grads = [v.value.grad for v in variables]
    with torch.no_grad():
        grads, norm = clip_and_scale(grads, model.clip_norm, window_scale(model, x),
                                     variables, model.weight_decay)
        model.optimizer.apply(grads, variables)
    return model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=norm)


def lm_train_step(model, data):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return tensorflow_train_step(model, data)
    if backend == "torch":
        return torch_train_step(model, data)
    raise NotImplementedError(
        f"The language-model train step is implemented for the TensorFlow and PyTorch "
        f"backends; KERAS_BACKEND={backend!r} can run the model forward and backward "
        "(model.forward_with_state) but not model.fit yet.")
