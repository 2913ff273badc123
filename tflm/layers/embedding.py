"""Tied input embedding / output projection."""

import keras
from keras import ops

from tflm import backends


@keras.saving.register_keras_serializable(package="tflm")
class TiedEmbedding(keras.layers.Layer):
    """Token embedding whose matrix is also the output projection.

    `call(ids)` looks rows up; `reverse(h)` maps context vectors back to logits with the
    same matrix and the layer's own output bias:

        logits = h E^T + b,   E in R^{V x d}, b in R^V (zero-initialized)

    Output layers take this layer as their `embedding` argument (weight tying is explicit,
    docs/design.md, contract 2).

    Args:
        vocab_size: number of tokens V.
        embed_dim: embedding size d.
        embeddings_initializer: default `RandomUniform(-0.1, 0.1)` as in AWD-LSTM.
        use_output_bias: whether `reverse` adds the bias b. Default True.
        embeddings_regularizer: a Keras regularizer of E (e.g.
            `tflm.regularizers.CosineSimilarityRegularizer`); its penalty joins
            `model.losses`. Default None.

    Input shape: integer `(batch, time)`. Output shape: `(batch, time, embed_dim)`.
    `reverse`: `(..., embed_dim)` -> `(..., vocab_size)`.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> h = emb(np.zeros((2, 5), "int32"))
    >>> emb.reverse(h).shape
    (2, 5, 100)

    Reference: Press & Wolf 2017, Inan et al. 2017 (weight tying); Merity et al. 2018 (AWD-LSTM).
    """

    def __init__(self, vocab_size, embed_dim, embeddings_initializer=None,
                 use_output_bias=True, embeddings_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        if int(vocab_size) < 1 or int(embed_dim) < 1:
            raise ValueError(
                "TiedEmbedding needs vocab_size >= 1 and embed_dim >= 1; got "
                f"vocab_size={vocab_size}, embed_dim={embed_dim}.")
        self.vocab_size = int(vocab_size)
        self.embed_dim = int(embed_dim)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer or keras.initializers.RandomUniform(-0.1, 0.1))
        self.use_output_bias = bool(use_output_bias)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)

    def build(self, input_shape=None):
        if self.built:
            return
        self.embeddings = self.add_weight(
            shape=(self.vocab_size, self.embed_dim), name="embeddings",
            initializer=self.embeddings_initializer, regularizer=self.embeddings_regularizer)
        self.output_bias = None
        if self.use_output_bias:
            self.output_bias = self.add_weight(
                shape=(self.vocab_size,), name="output_bias", initializer="zeros")
        self.built = True

    def call(self, ids):
        ids = ops.cast(ids, "int32")
        return ops.take(ops.cast(self.embeddings, self.compute_dtype), ids, axis=0)

    def target_vectors(self, ids):
        """Rows e_w of E for the int ids (any shape), float32: the output embedding of a
        target word (AdvSoft)."""
        if not self.built:
            self.build()
        return ops.take(ops.cast(self.embeddings, "float32"), ops.cast(ids, "int32"), axis=0)

    def reverse(self, h):
        """Logits h E^T + b, in the dtype of `h`."""
        if not self.built:
            self.build()
        bias = None if self.output_bias is None else ops.cast(self.output_bias, h.dtype)
        return backends.current().linear(h, ops.cast(self.embeddings, h.dtype), bias)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.embed_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, embed_dim=self.embed_dim,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            use_output_bias=self.use_output_bias,
            embeddings_regularizer=keras.regularizers.serialize(self.embeddings_regularizer))
        return config
