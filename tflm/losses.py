"""Negative log-likelihood on log-probabilities."""

import keras
from keras import ops


def token_nll(y_true, log_probs):
    """Per-token NLL: -log_probs[..., y_true], float32, shape of `y_true`."""
    y_true = ops.cast(y_true, "int32")
    log_probs = ops.cast(log_probs, "float32")
    picked = ops.take_along_axis(log_probs, ops.expand_dims(y_true, -1), axis=-1)
    return -ops.squeeze(picked, -1)


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
