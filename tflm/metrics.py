"""Perplexity over a whole pass: exp(total NLL / total tokens)."""

import keras
from keras import ops

from tflm import backends
from tflm.losses import token_nll


def totals_dtype():
    """The dtype of a pass's totals: float64, so that a count past 2**24 tokens stays exact,
    except on JAX without `jax_enable_x64`, which has no float64 (Keras would make float64
    variables float32 there anyway, with a warning at each). A float32 total's relative
    rounding is about 1e-7, far below a perplexity's last printed digit."""
    if keras.backend.backend() == "jax":
        import jax  # deferred: the JAX backend only
        if not jax.config.jax_enable_x64:
            return "float32"
    return "float64"


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
        dtype = totals_dtype()
        self.total_nll = self.add_variable(shape=(), initializer="zeros", name="total_nll",
                                           aggregation="sum", dtype=dtype)
        self.total_tokens = self.add_variable(shape=(), initializer="zeros",
                                              name="total_tokens", aggregation="sum",
                                              dtype=dtype)

    def update_state(self, y_true, y_pred, sample_weight=None):
        nll = token_nll(y_true, y_pred)
        if sample_weight is None:
            sample_weight = ops.ones_like(nll)
        sample_weight = ops.cast(sample_weight, "float32")
        self.update_from_totals(ops.sum(nll * sample_weight), ops.sum(sample_weight))

    def update_from_totals(self, nll_sum, token_count):
        """Add a precomputed NLL sum and token count (used by the LM train step)."""
        backend = backends.current()
        backend.assign_add(self.total_nll, ops.cast(nll_sum, self.total_nll.dtype))
        backend.assign_add(self.total_tokens, ops.cast(token_count, self.total_tokens.dtype))

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
