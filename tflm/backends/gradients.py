"""The gradient logic every backend's train step shares (one place, not one per backend).

Reference: salesforce/awd-lstm-lm main.py `train`. After the backend has differentiated

    loss  = mean NLL over the window's tokens + sum(model.losses)      (AR, TAR, DOC's CV, ...)
            (loss_reduction="sum_over_time": the NLL summed over time, averaged over streams)

and summed the gradients over replicas, `process_gradients` does, in this order:

    g = g / loss_scale                      (mixed precision: unscale before clipping)
    g = g * sign(L - b)                     (flooding at level b, Ishida et al. 2020, with the
                                             global window loss L)
    g = g * min(1, clip_norm / (||g||_2 + 1e-6))
                                            (global norm, after the replica all-reduce; the
                                             1e-6 is torch.nn.utils.clip_grad_norm_'s)
    g = g + weight_decay * theta            (L2 decay as torch.optim.SGD's weight_decay:
                                             added after clipping, scaled with the step)
    g = g * T / bptt                        (the reference scales the learning rate of a window
                                             of T real positions by T / bptt; for SGD and
                                             averaged SGD scaling the clipped gradient is the
                                             same update. Once `AveragedSGD` averages, the
                                             factor is the previous window's, T(k-1) / bptt,
                                             as torch.optim.ASGD applies its stored eta:
                                             `AveragedSGD.lagged_window_scale`). For
                                             Adam the factor scales its step size
                                             instead (`tflm.optimizers.Adam`): g is left
                                             unscaled here)
    g = g * loss_scale                      (the LossScaleOptimizer checks and unscales again)

and the backend hands g to `optimizer.apply`.

This module sits below the backends, the model and the optimizers and imports none of them:
the backend passes itself in, T / bptt comes from the model (`LanguageModel.window_scale`),
and the optimizer brings its own hooks, found on it or on the optimizer a loss-scale wrapper
holds (`inner_optimizer`): `lagged_window_scale(scale)` (`AveragedSGD`) and, with
`scales_learning_rate` true, `set_window_scale(scale)` (`Adam`).
"""

from keras import ops

from tflm.flooding import flood_sign


def clip_and_scale(backend, grads, clip_norm, scale, variables=None, weight_decay=0.0):
    """Clip `grads` to global norm `clip_norm` (None: no clipping) as
    `torch.nn.utils.clip_grad_norm_` does (factor clip_norm / (norm + 1e-6), at most 1), add
    `weight_decay * variable`, multiply by `scale`, with the ops of `backend` (a
    `tflm.backends.base.Backend`). Returns (new grads, norm before clipping)."""
    norm = backend.global_norm([g for g in grads if g is not None])
    factor = scale
    if clip_norm is not None and clip_norm > 0:
        factor = ops.minimum(backend.constant(1.0, norm), clip_norm / (norm + 1e-6)) * scale
    decay = weight_decay * scale if weight_decay else None
    return backend.scale_and_decay(grads, factor, decay, variables), norm


def loss_scale(optimizer):
    """The dynamic loss scale of a `LossScaleOptimizer` (mixed precision), else None."""
    return getattr(optimizer, "dynamic_scale", None)


def _times(grads, factor):
    return [None if g is None else g * ops.cast(factor, g.dtype) for g in grads]


def _optimizer_with(optimizer, hook):
    """`optimizer`, or the optimizer its loss-scale wrappers hold, whose attribute `hook` is
    set (a method, or a true flag); None when there is none."""
    for _ in range(4):
        if getattr(optimizer, hook, None):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None


def process_gradients(backend, model, grads, variables, x, loss, num_replicas=1):
    """Unscale, flood, clip, L2 and window-scale the (already all-reduced) gradients of one
    window `x` with the ops of `backend`; `loss` is the global window loss. Returns
    (gradients, norm before clipping).

    `num_replicas`: the optimizer sums the replicas' updates again under tf.distribute, so
    each replica applies 1 / R of the global step."""
    scale = loss_scale(model.optimizer)
    if scale is not None:
        grads = [None if g is None else g / ops.cast(scale, g.dtype) for g in grads]
    if model.flooding_level is not None:
        grads = _times(grads, flood_sign(loss, model.flooding_level))
    step = model.window_scale(x)
    averaged = _optimizer_with(model.optimizer, "lagged_window_scale")
    if averaged is not None and model.scale_by_window:
        step = averaged.lagged_window_scale(step)
    scaler = _optimizer_with(model.optimizer, "scales_learning_rate")
    if scaler is not None:  # Adam: the factor goes into the step size, not the gradient
        scaler.set_window_scale(step)
        step = 1.0
    grads, norm = clip_and_scale(backend, grads, model.clip_norm, step / float(num_replicas),
                                 variables, model.weight_decay)
    if scale is not None:
        grads = _times(grads, scale)
    return grads, norm
