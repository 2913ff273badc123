"""Gaussian noise on the looked-up embeddings (AdvSoft's and lmkit's "embedding noise")."""

import keras
from keras import ops

from tflm import backends
from tflm.layers.dropout import per_stream_normal


@keras.saving.register_keras_serializable(package="tflm")
class EmbeddingNoise(keras.layers.Layer):
    """Adds N(0, 1) * scale to every entry of the embedded window, in training only.

        e'[b, t, j] = e[b, t, j] + scale * z[b, t, j],   z ~ N(0, 1) i.i.d.

    AWD-LSTM places it after embedding dropout and before the input locked dropout (the
    AdvSoft code's `--gaussian`, lmkit's `--noisy_emb --emb_noise_scale`). A fresh draw at
    every call; identity at inference.

    Keras' `GaussianNoise` would draw the same numbers on every replica of a
    `tf.distribute` strategy (each holds a copy of the seed state); this layer draws the
    global batch's noise and keeps the replica's rows (`per_stream_normal`), so every
    stream gets its own noise and a replicated step draws what one device draws.

    Args:
        scale: standard deviation of the noise (0.15: lmkit's and the AdvSoft code's
            default; 0.175 in its WikiText-2 command). Must be >= 0.
        seed: int seed for the layer's `SeedGenerator`.

    Input shape: `(batch, time, d)`. Output shape: the same.

    Reference: Wang, Gong & Liu 2019 (ICML), "Improving Neural Language Modeling via
    Adversarial Training" (ChengyueGongR/advsoft `model.py`); thesis 000 Appendix .1.
    """

    def __init__(self, scale=0.15, seed=None, **kwargs):
        super().__init__(**kwargs)
        scale = float(scale)
        if not scale >= 0.0:
            raise ValueError(f"EmbeddingNoise: scale must be >= 0; got scale={scale!r}.")
        self.scale = scale
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def call(self, x, training=False):
        if not training or self.scale == 0.0:
            return x
        noise = per_stream_normal(tuple(ops.shape(x)), self.seed_generator, dtype=x.dtype)
        return x + backends.current().constant(self.scale, x) * noise

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(scale=self.scale, seed=self.seed)
        return config
