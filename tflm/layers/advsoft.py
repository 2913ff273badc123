"""AdvSoft: the adversarial perturbation of the target word's output embedding, in closed form.

Wang, Gong & Liu 2019 (ICML), "Improving Neural Language Modeling via Adversarial Training"
(thesis 000 §3.2.3, eqs. 3.22-3.23): training maximises

    min_{|delta| <= eps} log P(w_z | c; e_z + delta)

whose minimiser for the logit h^T (e_z + delta) is delta* = -eps h / |h|. As the reference
code (ChengyueGongR/advsoft `model.py`, lmkit `top_models/adv_smax/adv_smax.py`) computes it:

    n_h = sqrt(|h|^2 + 1e-8),  n_w = sqrt(|e_z|^2 + 1e-8),  cos = h . e_z / (n_h n_w)
    eps = alpha * n_w * 1[cos > 0],   delta = stop_gradient(-eps h / n_h)
    logit_z <- logit_z + h . delta          (= -eps |h|^2 / n_h; no other logit changes)

delta is a constant: the extra term's gradient is delta, into h only (and through h into
the network). Only in training; evaluation reads the plain logits.

Per position: every position gets the delta of its own h. The reference scatters delta into
a V x d buffer by target id and gathers it back, so positions of a batch that share a
target word all use the delta written last; that is an artefact of the buffer, not of the
method (eq. 3.23 is per context), and we do not reproduce it.
"""

from keras import ops

DEFAULT_ALPHA = 0.005  # the reference's --adv_smax_alpha / --epsilon


def _align(targets, rank):
    """Add trailing axes to `targets` (B, T) until it has `rank` axes."""
    while len(targets.shape) < rank:
        targets = ops.expand_dims(targets, -1)
    return targets


def adversarial_target_shift(h, target_vectors, alpha):
    """The extra target logit h . delta, shape `h.shape[:-1]`, float32.

    Args:
        h: context vectors `(..., d)` (for MoS, one per component: `(B, T, K, d)`).
        target_vectors: e_z of each position's target, broadcastable to `h`.
        alpha: the AdvSoft coefficient (0.005 in the reference).
    """
    h = ops.cast(h, "float32")
    e = ops.cast(target_vectors, "float32")
    n_h = ops.sqrt(ops.sum(ops.square(h), axis=-1, keepdims=True) + 1e-8)
    n_w = ops.sqrt(ops.sum(ops.square(e), axis=-1, keepdims=True) + 1e-8)
    cos = ops.sum(h * e, axis=-1, keepdims=True) / (n_h * n_w)
    eps = alpha * n_w * ops.cast(cos > 0.0, "float32")
    delta = ops.stop_gradient(-eps * h / n_h)
    return ops.sum(h * delta, axis=-1)


def shift_target_logits(logits, targets, shift):
    """`logits (..., V)` with `shift` added at each position's target id only.

    `targets` (B, T) int ids broadcast over any axes between (B, T) and V (MoS's K); a
    negative id (`tflm.data.PAD_ID`) matches no column."""
    vocab = ops.shape(logits)[-1]
    targets = _align(ops.cast(targets, "int32"), len(logits.shape) - 1)
    is_target = ops.equal(ops.arange(vocab, dtype="int32"), ops.expand_dims(targets, -1))
    return logits + ops.where(is_target, ops.expand_dims(ops.cast(shift, logits.dtype), -1),
                              ops.zeros((), logits.dtype))


def adversarial_logits(logits, h, targets, target_vectors_of, alpha):
    """AdvSoft's logits: `logits` (..., V) from context vectors `h` (..., d), with the target
    logit of every position moved by `adversarial_target_shift`.

    Args:
        logits: `(B, T, [K,] V)` logits of `h`.
        h: `(B, T, [K,] d)` context vectors.
        targets: `(B, T)` int target ids (negative: padding, left alone).
        target_vectors_of: callable ids -> `(B, T, d)` output embeddings e_z.
        alpha: the coefficient.
    """
    targets = ops.cast(targets, "int32")
    vectors = target_vectors_of(ops.maximum(targets, 0))
    while len(vectors.shape) < len(h.shape):
        vectors = ops.expand_dims(vectors, -2)
    shift = adversarial_target_shift(h, vectors, alpha)
    return shift_target_logits(logits, targets, shift)
