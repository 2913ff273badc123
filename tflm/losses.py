"""Negative log-likelihood on log-probabilities, and importance-sampled training (sampled
softmax with a proposal Q) for heads whose full vocabulary is too costly in training."""

import keras
from keras import ops

from tflm import backends


def token_nll(y_true, log_probs):
    """Per-token NLL: -log_probs[..., y_true], float32, shape of `y_true`."""
    y_true = ops.cast(y_true, "int32")
    log_probs = ops.cast(log_probs, "float32")
    return -backends.current().pick_targets(log_probs, y_true)


@keras.saving.register_keras_serializable(package="tflm")
class NLL(keras.losses.Loss):
    """Mean negative log-likelihood over tokens, for heads that return log-probabilities.

        NLL = -(1 / sum_t m_t) sum_t m_t log P(y_t | c_t)

    `sample_weight` (e.g. a padding mask of shape `(batch, time)`) weights tokens; the mean
    is over the weighted token count, so windows of different lengths are token-weighted.
    Use it with any tflm output layer: `model.compile(loss=tflm.losses.NLL(), ...)`.
    """

    def __init__(self, name="nll", reduction="sum_over_batch_size", **kwargs):
        super().__init__(name=name, reduction=reduction, **kwargs)

    def call(self, y_true, y_pred):
        return token_nll(y_true, y_pred)


def importance_sampled_log_probs(candidate_logits, candidate_log_proposal):
    """Log-probabilities of importance-sampled training over a candidate set, float32.

        P(Y = j | S, c) = softmax_j(l_{w_j, c} - log Q(w_j)),   S = {w_0 = target, w_1..w_k}

    with w_1..w_k drawn from the proposal Q (Jozefowicz et al. 2016 §3.1; Andonov 2019
    §6.6.3, eqs. 6.12-6.17). Training maximises log P(Y = 0 | S, c), the target's entry
    (`sampled_token_nll`); its gradient, -grad l_w + sum_j P(Y = j | S, c) grad l_{w_j}, is
    a self-normalised importance-sampling estimate of the full softmax's
    -grad l_w + E_{w' ~ P_theta}[grad l_{w'}]. Every column, the target's included, has
    log Q subtracted (as the reference CNF code does); a noise word equal to the target is
    kept (no "accidental hit" removal).

    Args:
        candidate_logits: `(..., 1 + k)` logits of the candidates, target first.
        candidate_log_proposal: `(..., 1 + k)` log Q of the same ids.

    Returns:
        `(..., 1 + k)` log-probabilities over the candidate set; rows normalise.
    """
    corrected = ops.cast(candidate_logits, "float32") - ops.cast(candidate_log_proposal,
                                                                 "float32")
    return ops.log_softmax(corrected, axis=-1)


def sampled_token_nll(sampled_log_probs):
    """Per-token NLL of importance-sampled training: -log P(Y = 0 | S, c), the target's
    column of `importance_sampled_log_probs`, shape `(...)`.

    It estimates the full NLL up to a constant: for k -> infinity,
    sampled NLL - log(k Q(w)) -> -log softmax(l)_w (tested), so the training loss and
    perplexity a sampled head reports are those of the sampled objective, not the model's
    perplexity; evaluate with the full softmax (the heads do, outside training)."""
    return -ops.cast(sampled_log_probs[..., 0], "float32")
