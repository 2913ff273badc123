"""LMS-PLIF: a learnable piecewise-linear increasing map applied to the logits before softmax."""

import math

import keras
from keras import ops

from tflm import compat
from tflm.layers.head import LogProbHead

# softplus(LOG_E_MINUS_1) == 1: slopes start at 1 (f ~ identity + constant).
LOG_E_MINUS_1 = math.log(math.e - 1.0)


def _split_width(width, num_intervals):
    """D = d_hi + d_lo (Python floats) with d_hi so short that i * d_hi is exact in float32.

    d_hi keeps b = 24 - bit_length(K) significant bits of D, so i * d_hi needs at most 24 bits
    for every index i < K; |d_lo| <= 2^-b D carries the rest, so no float32 rounding of D is
    ever scaled up by i ~ K.
    """
    bits = max(1, 24 - int(num_intervals).bit_length())
    mantissa, exponent = math.frexp(width)
    d_hi = math.ldexp(round(mantissa * 2 ** bits), exponent - bits)
    return d_hi, width - d_hi


def _split_on_grid(x, grid):
    """x = n * grid + r with integer-valued n (no gradient) and |r| <= grid / 2 (float32)."""
    n = ops.stop_gradient(ops.round(x / grid))
    return n, x - n * grid


def _power_of_two_above(x):
    """2^ceil(log2 x) for x > 0 (a float32 scalar, no gradient)."""
    return ops.power(2.0, ops.ceil(ops.log2(x)))


def _accurate_cumsum(x):
    """Inclusive cumulative sum of a float32 vector, off by about one float32 rounding.

    A float32 running sum of K terms drifts by up to K/2 roundings of its partial sums: the
    PLIF knots at K = 100,000 (total ~45) came out 1e-4 to 4e-4 off. Instead each term is split
    twice on a power-of-two grid,

        x_j = n_j q_1 + m_j q_2 + r_j,   q_1 >= 2^-22 sum_j |x_j|,   q_2 >= 2^-24 K q_1,

    with integers n_j, m_j. Every partial sum of the n_j (|.| <= 2^23 + K/2) and of the m_j
    (|.| <= 2^23) is an integer below 2^24, exact in float32 in any summation order; the split
    and the products with q_1, q_2 are exact too, and |sum_{j<=i} r_j| <= K q_2 / 2 (~1e-6 of
    the total at K = 100,000), so its rounding is negligible. Only the final sum
    q_1 cumsum(n) + (q_2 cumsum(m) + cumsum(r)) rounds at full size (were ops.power not to
    return exact powers of two, a few more roundings would enter). Gradients flow through
    r (d/dx_j = 1); n, m and the grids carry none. All of it is vectorised (three cumsums).
    """
    k = int(x.shape[0])
    q1 = _power_of_two_above(ops.maximum(ops.stop_gradient(ops.sum(ops.abs(x))), 1e-20)
                             * 2.0 ** -22)
    q2 = q1 * 2.0 ** (k.bit_length() - 24)                       # 2^-24 K q_1 <= q_2
    n, rest = _split_on_grid(x, q1)
    m, r = _split_on_grid(rest, q2)
    return q1 * ops.cumsum(n) + (q2 * ops.cumsum(m) + ops.cumsum(r))


def _interval_and_offset(l, num_intervals, bound):
    """i = clamp(floor((l + T) / D), 0, K - 1) and u = l - x_i with x_i = -T + i D, float32.

    u = (l - (i d_hi - T)) - i d_lo (`_split_width`): i d_hi - T is exact (for T = 20,
    K = 100,000; else rounded once at |x_i| <= T) and l - x_i is then exact near the knot, so
    u is not off by a rounding of l + T (~2e-6, times s_i in f). The first guess of i, from the
    rounded (l + T) / D, can be one off within ~4e-6 of a knot; one step by floor(u / D) fixes it.
    """
    width = 2.0 * bound / num_intervals
    d_hi, d_lo = _split_width(width, num_intervals)
    last = float(num_intervals - 1)
    guess = ops.stop_gradient(ops.clip(ops.floor((l + bound) / width), 0.0, last))
    u = (l - (guess * d_hi - bound)) - guess * d_lo
    idx = ops.stop_gradient(ops.clip(guess + ops.floor(u / width), 0.0, last))
    return idx, u - (idx - guess) * width


def _plif_transform(logits, pre_slopes, num_intervals, bound):
    """f(l) = C_i + s_i u of LMS-PLIF in float32 (see `PLIFLayer`).

    The knot values C_i = D sum_{j<i} s_j come from `_accurate_cumsum` of D s_j (D applied as
    d_hi + d_lo, `_split_width`, so D's own float32 rounding is not scaled up by sum s_j), and
    u = l - x_i from `_interval_and_offset`; see "Precision" in `PLIFLayer`.
    """
    l = ops.cast(logits, "float32")
    d_hi, d_lo = _split_width(2.0 * bound / num_intervals, num_intervals)
    slopes = ops.softplus(ops.cast(pre_slopes, "float32"))                     # s_j > 0, (K,)
    steps = slopes[:-1] * d_hi + slopes[:-1] * d_lo                            # D s_j, j < K-1
    knots = ops.concatenate([ops.zeros((1,), "float32"), _accurate_cumsum(steps)], axis=0)
    idx, u = _interval_and_offset(l, num_intervals, bound)
    table = ops.stack([slopes, knots], axis=-1)                                  # (K, 2)
    picked = ops.take(table, ops.cast(idx, "int32"), axis=0)     # (..., 2): the one gather
    return u * picked[..., 0] + picked[..., 1]


def _check_plif_args(name, num_intervals, bound, init_scale, learning_rate_multiplier):
    if int(num_intervals) != num_intervals or int(num_intervals) < 1:
        raise ValueError(f"{name}: num_intervals must be a positive integer; "
                         f"got num_intervals={num_intervals!r}.")
    if not (float(bound) > 0 and math.isfinite(float(bound))):
        raise ValueError(f"{name}: bound T must be a positive finite number (intervals cover "
                         f"[-T, T]); got bound={bound!r}.")
    if not (float(init_scale) >= 0 and math.isfinite(float(init_scale))):
        raise ValueError(f"{name}: init_scale must be >= 0; got init_scale={init_scale!r}.")
    if learning_rate_multiplier is not None and not float(learning_rate_multiplier) > 0:
        raise ValueError(f"{name}: learning_rate_multiplier must be > 0 or None; got "
                         f"learning_rate_multiplier={learning_rate_multiplier!r}.")


@keras.saving.register_keras_serializable(package="tflm")
class PLIFLayer(keras.layers.Layer):
    """Piecewise Linear Increasing Function on the logits, then log_softmax (LMS-PLIF).

    K equal intervals cover [-T, T] with width D = 2T / K. For a logit l,

        i    = clamp(floor((l + T) / D), 0, K - 1)          (no gradient through i)
        s_j  = softplus(v_j) > 0                             (learned slopes)
        f(l) = (l - (-T + i D)) s_i + D sum_{j<i} s_j
        log P = log_softmax(f(l))

    f is continuous (the value at knot -T + iD is D sum_{j<i} s_j from both sides) and
    strictly increasing. Beyond [-T, T] the clamped index extends the first and last pieces
    linearly (slopes s_0 and s_{K-1}), which keeps both properties for every real l. Cost:
    three cumulative sums over K and one gather of (B, T, V) indices, O(batch*time*V) memory,
    no loop over intervals. The additive constants of the thesis' b_i do not change the
    softmax and are left out.

    Precision (float32 on every backend): the knot values D sum_{j<i} s_j are summed exactly
    on a power-of-two grid plus a small residual (`_accurate_cumsum`), and l - (-T + i D) is
    formed without rounding l + T (`_interval_and_offset`). At K = 100,000, T = 20 a float32
    running sum left the knots 1e-4 to 4e-4 off and the log-probs ~1.6e-4 off (TensorFlow on
    CPU); now f is within a few float32 roundings and the log-probs within ~1e-5 of a float64
    evaluation of the formula (5e-6 to 9e-6 measured on TensorFlow, JAX, PyTorch).

    Init: v ~ N(log(e - 1), init_scale^2), so the slopes start near 1 and f near the
    identity plus a constant. `frozen=True` makes the slopes non-trainable (the "LMS-PLIF
    dagger" ablation of the thesis, which still perturbs the logits by the fixed random map).

    Learning rate: the reference trains the PLIF slopes with their own learning rate (0.02
    while the model uses SGD lr 20-30, i.e. a multiplier of ~1e-3). Set
    `learning_rate_multiplier` and pass `learning_rate_multipliers(model)` (variable path ->
    multiplier) to an optimizer that honours per-variable rates
    (`tflm.optimizers.SGD(lr, learning_rate_multipliers=...)`). Scaling
    the gradient instead is not equivalent under global-norm clipping, so this layer does not
    do that; with a plain Keras optimizer the attribute has no effect.

    Args:
        num_intervals: K. Default 100_000 (the reference).
        bound: T; intervals cover [-T, T]. Default 20.0.
        init_scale: standard deviation of the pre-slopes' initial noise. Default 0.1.
        frozen: keep the slopes fixed at their random init. Default False.
        return_logits: return f(l) instead of log_softmax(f(l)). Default False.
        learning_rate_multiplier: per-layer learning-rate factor for an optimizer that reads
            it, or None. Default None.
        seed: int seed of the slope initializer. Default None.

    Input shape: logits `(batch, time, V)`. Output shape: the same, float32.

    Example:
    >>> plif = PLIFLayer(num_intervals=1000, bound=20.0)
    >>> plif(np.zeros((2, 5, 100), "float32")).shape
    (2, 5, 100)

    Reference: Ganea et al. 2019 (Breaking the softmax bottleneck via learnable monotonic
    pointwise non-linearities); Parthiban 2020 (thesis), §3.1.4 eq 3.6/3.7, §4.3.2.1, §5.7.1.
    """

    def __init__(self, num_intervals=100_000, bound=20.0, init_scale=0.1, frozen=False,
                 return_logits=False, learning_rate_multiplier=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        _check_plif_args("PLIFLayer", num_intervals, bound, init_scale, learning_rate_multiplier)
        self.num_intervals = int(num_intervals)
        self.bound = float(bound)
        self.init_scale = float(init_scale)
        self.frozen = bool(frozen)
        self.return_logits = bool(return_logits)
        self.learning_rate_multiplier = (None if learning_rate_multiplier is None
                                         else float(learning_rate_multiplier))
        self.seed = seed

    @property
    def interval_width(self):
        return 2.0 * self.bound / self.num_intervals

    def build(self, input_shape=None):
        self.pre_slopes = self.add_weight(
            shape=(self.num_intervals,), name="pre_slopes", trainable=not self.frozen,
            initializer=keras.initializers.RandomNormal(
                mean=LOG_E_MINUS_1, stddev=self.init_scale, seed=self.seed))
        self.built = True

    def slopes(self):
        """The current slopes s = softplus(v), shape (K,), float32."""
        return ops.softplus(ops.cast(self.pre_slopes, "float32"))

    def transform(self, logits):
        """f(logits) in float32 (no softmax)."""
        return _plif_transform(logits, self.pre_slopes, self.num_intervals, self.bound)

    def call(self, logits):
        f = self.transform(logits)
        return f if self.return_logits else ops.log_softmax(f, axis=-1)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_intervals=self.num_intervals, bound=self.bound,
                      init_scale=self.init_scale, frozen=self.frozen,
                      return_logits=self.return_logits,
                      learning_rate_multiplier=self.learning_rate_multiplier, seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class PLIFHead(LogProbHead):
    """Output head: vocabulary projection, PLIF on the logits, log_softmax (LMS-PLIF).

        l = h E^T + b  (tied)  or  h W + b  (untied)
        log P(w | c) = log_softmax(f(l))_w,   f = PLIF (see `PLIFLayer`)

    Args:
        embedding: `TiedEmbedding` to tie the projection to, or None.
        vocab_size: V for an untied projection.
        num_intervals, bound, init_scale, frozen, learning_rate_multiplier, seed: as in
            `PLIFLayer` (defaults 100_000, 20.0, 0.1, False, None, None). The multiplier applies
            to the PLIF slopes only, not to an untied projection.

    Input shape: `(batch, time, d)`. Output shape: `(batch, time, V)`, float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = PLIFHead(embedding=emb, num_intervals=1000)
    >>> head(np.zeros((2, 5, 16), "float32")).shape
    (2, 5, 100)

    Reference: Ganea et al. 2019; Parthiban 2020 (thesis), §3.1.4, §4.3.2.1, §5.7.1.
    """

    def __init__(self, embedding=None, vocab_size=None, num_intervals=100_000, bound=20.0,
                 init_scale=0.1, frozen=False, learning_rate_multiplier=None, seed=None,
                 **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        self.plif = PLIFLayer(num_intervals=num_intervals, bound=bound, init_scale=init_scale,
                              frozen=frozen, return_logits=True,
                              learning_rate_multiplier=learning_rate_multiplier, seed=seed,
                              name="plif")

    def build(self, input_shape):
        self.build_projection(input_shape[-1])
        self.plif.build()
        self.built = True

    def call(self, h, training=False):
        return ops.log_softmax(self.plif(self.project(h)), axis=-1)

    def get_config(self):
        config = super().get_config()
        p = self.plif
        config.update(num_intervals=p.num_intervals, bound=p.bound, init_scale=p.init_scale,
                      frozen=p.frozen, learning_rate_multiplier=p.learning_rate_multiplier,
                      seed=p.seed)
        return config


def learning_rate_multipliers(model):
    """Map variable path -> learning-rate multiplier for every layer inside `model` that sets one.

    Collects the trainable variables of every (nested) layer whose `learning_rate_multiplier`
    attribute is not None (e.g. `PLIFLayer(learning_rate_multiplier=1e-3)`, also inside a
    `PLIFHead`). Variables not listed use the optimizer's learning rate. `tflm.optimizers`
    consumes this mapping; the effective rate of a listed variable is `lr * multiplier`.

    Example:
    >>> multipliers = learning_rate_multipliers(model)   # {"plif_head/plif/pre_slopes": 0.001}
    >>> model.compile(optimizer=tflm.optimizers.SGD(20.0, learning_rate_multipliers=multipliers
    ...                                              or None), loss=tflm.losses.NLL())
    """
    out = {}
    for layer in compat.nested_layers(model):
        mult = getattr(layer, "learning_rate_multiplier", None)
        if mult is None:
            continue
        for v in layer.trainable_variables:
            out[v.path] = float(mult)
    return out
