"""Perplexity over a whole pass: exp(total NLL / total tokens)."""

import keras
from keras import ops

from tflm import backends
from tflm.losses import token_nll


def _at_least_one(count):
    """max(count, 1) in `count`'s dtype: a pass without tokens divides by one. (Not
    `ops.maximum`: Keras' result type of two float64 operands is float32, so it would round
    a count above 2**24 tokens and copy both operands.)"""
    backend = backends.current()
    return ops.clip(count, backend.constant(1.0, count), backend.constant(float("inf"), count))


@keras.saving.register_keras_serializable(package="tflm")
class Perplexity(keras.metrics.Metric):
    """Corpus perplexity, token-weighted over every batch seen since the last reset.

        PPL = exp( sum_t -log P(y_t | c_t) / number of tokens )

    Not the mean of per-batch perplexities (which overweights short windows). Takes
    log-probabilities as `y_pred` and integer targets as `y_true`; `sample_weight` masks tokens.
    State is summed across replicas under tf.distribute.
    """

    def __init__(self, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total_nll = self.add_variable(shape=(), initializer="zeros", name="total_nll",
                                           aggregation="sum", dtype="float64")
        self.total_tokens = self.add_variable(shape=(), initializer="zeros",
                                              name="total_tokens", aggregation="sum",
                                              dtype="float64")

    def update_state(self, y_true, y_pred, sample_weight=None):
        nll = token_nll(y_true, y_pred)
        if sample_weight is None:
            sample_weight = ops.ones_like(nll)
        sample_weight = ops.cast(sample_weight, "float32")
        self.update_from_totals(ops.sum(nll * sample_weight), ops.sum(sample_weight))

    def update_from_totals(self, nll_sum, token_count):
        """Add a precomputed NLL sum and token count (used by the LM train step)."""
        backend = backends.current()
        backend.assign_add(self.total_nll, ops.cast(nll_sum, "float64"))
        backend.assign_add(self.total_tokens, ops.cast(token_count, "float64"))

    def result(self):
        mean = self.total_nll / _at_least_one(self.total_tokens)
        return ops.cast(ops.exp(mean), "float32")

    def reset_state(self):
        self.total_nll.assign(0.0)
        self.total_tokens.assign(0.0)


@keras.saving.register_keras_serializable(package="tflm")
class TokenMeanNLL(Perplexity):
    """Token-weighted mean NLL (nats per token) over the pass: log of `Perplexity`."""

    def __init__(self, name="nll", **kwargs):
        super().__init__(name=name, **kwargs)

    def result(self):
        return ops.cast(self.total_nll / _at_least_one(self.total_tokens), "float32")
