"""Generalized SigSoftmax (GSS) and SigSoftmax: pointwise logit maps before the softmax."""

import math

import keras
from keras import ops

from tflm import activations
from tflm.layers.head import LogProbHead


def _check_finite(layer, name, value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: {name} must be a real number; got {name}={value!r}.") from None
    if not math.isfinite(value):
        raise ValueError(f"{layer}: {name} must be finite; got {name}={value}.")
    return value


class _GSSParams:
    """Mixin: (c, k) either fixed Python floats or trainable scalar weights."""

    def _init_params(self, c, k, trainable_params):
        name = type(self).__name__
        self.c = _check_finite(name, "c", c)
        self.k = _check_finite(name, "k", k)
        self.trainable_params = bool(trainable_params)

    def _build_params(self):
        if self.trainable_params:
            self.c_weight = self.add_weight(
                shape=(), name="c", initializer=keras.initializers.Constant(self.c))
            self.k_weight = self.add_weight(
                shape=(), name="k", initializer=keras.initializers.Constant(self.k))

    def _current_params(self):
        if self.trainable_params:
            return ops.cast(self.c_weight, "float32"), ops.cast(self.k_weight, "float32")
        return self.c, self.k


@keras.saving.register_keras_serializable(package="tflm")
class GSSActivation(_GSSParams, keras.layers.Layer):
    """Generalized SigSoftmax applied to logits, returning log-probabilities.

        PL~(l; c, k) = k (l - c) + c - (k - 1) softplus(l - c)
        log P = log_softmax(PL~(l; c, k))

    Put it after your own vocabulary projection. GSS(c, 1) is the plain softmax (exactly),
    GSS(0, 2) is SigSoftmax. The thesis picks (c, k) = (-1.5, 2.5) on PTB and (-1.5, 3.0) on
    WikiText-2. With `trainable_params=True`, c and k become scalar weights initialized to
    the given values.

    Args:
        c: breakpoint of the two linear pieces. Default 0.0.
        k: slope of the left piece (the right piece has slope 1). Default 2.0.
        trainable_params: learn c and k. Default False.
        return_probs: return probabilities instead of log-probabilities. Default False.

    Input shape: logits `(batch, time, V)`. Output shape: the same, float32.

    Example:
    >>> layer = GSSActivation(c=-1.5, k=2.5)
    >>> layer(np.zeros((2, 5, 100), "float32")).shape
    (2, 5, 100)

    Reference: Parthiban 2020 (thesis), §4.2.2, eq 4.15/4.16.
    """

    def __init__(self, c=0.0, k=2.0, trainable_params=False, return_probs=False, **kwargs):
        super().__init__(**kwargs)
        self._init_params(c, k, trainable_params)
        self.return_probs = bool(return_probs)

    def build(self, input_shape=None):
        self._build_params()
        self.built = True

    def call(self, logits):
        c, k = self._current_params()
        return activations.gss(logits, c, k, return_probs=self.return_probs)

    def compute_output_shape(self, input_shape):
        return input_shape


    def get_config(self):
        config = super().get_config()
        config.update(c=self.c, k=self.k, trainable_params=self.trainable_params,
                      return_probs=self.return_probs)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class SigSoftmax(keras.layers.Layer):
    """SigSoftmax applied to logits, returning log-probabilities (= GSS with c=0, k=2).

        SS(l)_w = exp(l_w) sigmoid(l_w) / sum_v exp(l_v) sigmoid(l_v) = softmax(2l - softplus(l))_w

    Args:
        return_probs: return probabilities instead of log-probabilities. Default False.

    Input shape: logits `(batch, time, V)`. Output shape: the same, float32.

    Example:
    >>> SigSoftmax()(np.zeros((2, 5, 100), "float32")).shape
    (2, 5, 100)

    Reference: Kanai et al. 2018; Parthiban 2020 (thesis), §3.1.3 and §4.2.1.
    """

    def __init__(self, return_probs=False, **kwargs):
        super().__init__(**kwargs)
        self.return_probs = bool(return_probs)

    def call(self, logits):
        return activations.sigsoftmax(logits, return_probs=self.return_probs)

    def compute_output_shape(self, input_shape):
        return input_shape


    def get_config(self):
        config = super().get_config()
        config.update(return_probs=self.return_probs)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class GSSHead(_GSSParams, LogProbHead):
    """Output head: vocabulary projection followed by the Generalized SigSoftmax.

        l = h E^T + b  (tied)  or  h W + b  (untied)
        PL~(l; c, k) = k (l - c) + c - (k - 1) softplus(l - c)
        log P(w | c) = log_softmax(PL~(l; c, k))_w

    Args:
        embedding: `TiedEmbedding` to tie the projection to, or None.
        vocab_size: V for an untied projection.
        c: breakpoint. Default 0.0.
        k: left slope. Default 2.0 (SigSoftmax). Thesis: PTB (-1.5, 2.5), WT2 (-1.5, 3.0).
        trainable_params: learn c and k (scalar weights initialized to c, k). Default False.

    Input shape: `(batch, time, d)`. Output shape: `(batch, time, V)`, float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = GSSHead(embedding=emb, c=-1.5, k=2.5)
    >>> head(np.zeros((2, 5, 16), "float32")).shape
    (2, 5, 100)

    Reference: Parthiban 2020 (thesis), §4.2.2, eq 4.15/4.16.
    """

    def __init__(self, embedding=None, vocab_size=None, c=0.0, k=2.0, trainable_params=False,
                 **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        self._init_params(c, k, trainable_params)

    def build(self, input_shape):
        self.build_projection(input_shape[-1])
        self._build_params()
        self.built = True

    def call(self, h, training=False):
        c, k = self._current_params()
        return activations.gss(self.project(h), c, k)


    def get_config(self):
        config = super().get_config()
        config.update(c=self.c, k=self.k, trainable_params=self.trainable_params)
        return config
