"""Flooding: keep the training loss around a flood level b instead of driving it to zero.

    flooded(L) = |L - b| + b

Above the level the gradient is that of L (descent); below it, it is -grad L (ascent), so the
loss hovers around b. Equivalently grad flooded(L) = sign(L - b) * grad L, which is how a
train step applies it when the loss it floods is not the one it differentiates (see
`flood_sign`).

How a train step uses it (the `LanguageModel` train step owns the wiring; a `flooding_level`
argument there is the intended switch):

    loss = mean NLL of the window + sum(model.losses)     # the whole training objective
    loss = flood(loss, level)                             # per mini-batch (per window),
    grads = grad(loss) -> all-reduce -> clip -> + L2 -> * T / bptt -> optimizer.apply

Flood the objective of the mini-batch, never per token: |mean - b| differs from
mean |l_t - b|. Under `tf.distribute` each replica only sees its share of the global batch,
and |mean_r L_r - b| is not mean_r |L_r - b|; to flood the global batch, differentiate the
unflooded loss, all-reduce the gradients and the loss, and multiply the reduced gradients by
`flood_sign(global_loss, level)` before clipping (the global norm is unchanged by the sign).

Reference: Ishida, Yamane, Sakai, Niu & Sugiyama 2020, "Do We Need Zero Training Loss After
Achieving Zero Training Error?" (ICML 2020, arXiv:2002.08709); Parthiban 2020 thesis
§2.1.8.4 (flooding) and §5 (flood level 1.0 to compare MoS models at equal training loss).
"""

import math

from keras import ops


def _check_level(level):
    try:
        value = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"flooding level must be a number >= 0 or None; got {level!r}.") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"flooding level must be a finite number >= 0 or None; got {level!r}.")
    return value


def flood(loss, level):
    """Flooded loss `|loss - level| + level` (`loss` itself when `level` is None).

    Args:
        loss: scalar training objective of one mini-batch (any backend tensor).
        level: the flood level b >= 0 (same units as the loss, e.g. nats per token), or
            None for no flooding.

    Returns:
        A tensor of the loss's shape and dtype. Its value equals `loss` whenever
        `loss >= level`; its gradient is `sign(loss - level) * grad(loss)`.

    Example:

    >>> from keras import ops
    >>> float(flood(ops.convert_to_tensor(0.5), 1.0))  # below the level: 2b - L
    1.5
    >>> float(flood(ops.convert_to_tensor(3.0), 1.0))  # above: unchanged
    3.0

    Reference: Ishida et al. 2020; Parthiban 2020 thesis §2.1.8.4.
    """
    if level is None:
        return loss
    b = ops.cast(_check_level(level), ops.dtype(loss) if hasattr(loss, "dtype") else "float32")
    return ops.add(ops.abs(ops.subtract(loss, b)), b)


def flood_sign(loss, level):
    """`sign(loss - level)`: the factor flooding puts on the gradient of `loss`.

    +1 above the level (descent), -1 below (ascent), 0 exactly at it (the subgradient of
    |x| at 0 that TensorFlow, PyTorch and JAX use). With `level` None it is 1.

    Args:
        loss: scalar loss (for distributed training: the all-reduced global loss).
        level: flood level b >= 0 or None.
    """
    if level is None:
        return ops.ones_like(loss)
    b = ops.cast(_check_level(level), ops.dtype(loss) if hasattr(loss, "dtype") else "float32")
    return ops.sign(ops.subtract(loss, b))
