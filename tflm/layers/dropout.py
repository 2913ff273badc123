"""Dropout variants of AWD-LSTM: locked (variational) dropout and embedding (row) dropout.

Which masks are per stream and which are shared, as in the reference code
(salesforce/awd-lstm-lm), and what that means under data parallelism:

- per stream: `LockedDropout` (the dropouts on the embedding output, between layers, on the
  last layer's output, and the latent dropout of MoS / DOC / MixTape) draws one mask per
  sequence of the batch, shared over time (reference `LockedDropout`: a `(1, batch, d)`
  mask). Under `tf.distribute` every replica holds a copy of the same `SeedGenerator` state,
  so each replica draws the masks of the *global* batch and keeps its own block of rows
  (`Backend.global_batch_block`): streams b and b + B / R get different masks, and a
  replicated step draws exactly the masks one device draws for the same global batch.
- shared: `EmbeddingDropout` draws one row mask over the vocabulary per forward (reference
  `embedded_dropout`), and `tflm.layers.WeightDropLSTM` one DropConnect mask on the
  recurrent matrix per forward (reference `WeightDrop`); both are the same for every
  sequence of the global batch, so every replica draws the same mask from its copy of the
  seed state.
"""

import keras
from keras import ops

from tflm import backends


def _check_rate(layer, rate):
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{layer}: rate must be in [0, 1); got rate={rate}.")
    return rate


def _per_stream(draw, shape):
    """`draw(shape)` for a batch-major `shape` whose rows are this replica's streams: under a
    `tf.distribute` strategy, the rows of the global batch's draw that belong to the calling
    replica; elsewhere the plain draw."""
    block, blocks = backends.current().global_batch_block()
    if blocks == 1:
        return draw(shape)
    rows = shape[0]
    full = draw((blocks * rows,) + tuple(shape[1:]))
    return ops.slice(full, (block * rows,) + (0,) * (len(shape) - 1), shape)


def per_stream_uniform(shape, seed):
    """Uniforms in [0, 1) (`Backend.uniform`: `keras.random.uniform(shape, seed=seed)`, or
    JAX's faster Threefry) for a batch-major `shape` whose rows are this replica's streams:
    under a `tf.distribute` strategy, the rows of the global batch's draw that belong to the
    calling replica; elsewhere the plain draw (same numbers as before).

    Needs the same batch size on every replica (tflm's stream datasets ensure it).
    """
    return _per_stream(lambda s: backends.current().uniform(s, seed), shape)


def per_stream_normal(shape, seed, dtype="float32"):
    """Standard normals (`Backend.normal`: `keras.random.normal(shape, seed=seed)`), per
    stream as `per_stream_uniform`."""
    return _per_stream(lambda s: backends.current().normal(s, seed, dtype), shape)


class _StreamMaskDropout(keras.layers.Layer):
    """Inverted dropout with a Bernoulli(1 - p) mask of `mask_shape(x.shape)` (broadcast over
    the input), drawn per stream (`per_stream_uniform`); identity at inference."""

    def __init__(self, rate=0.5, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = _check_rate(type(self).__name__, rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True  # a Keras mask passes through, as keras.layers.Dropout

    def mask_shape(self, shape):
        raise NotImplementedError

    def call(self, x, training=False):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask_shape = self.mask_shape(tuple(ops.shape(x)))
        mask = ops.cast(per_stream_uniform(mask_shape, self.seed_generator) < keep,
                        x.dtype) / backends.current().constant(keep, x)
        return x * mask

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class LockedDropout(_StreamMaskDropout):
    """Variational dropout: one mask per sequence, shared over time.

        y[b, t, :] = x[b, t, :] * m[b, :] / (1 - p),   m[b, j] ~ Bernoulli(1 - p)

    A fresh mask is drawn at every call (every BPTT window) in training; identity at
    inference. The mask has the input's shape with time set to 1, so a `(batch, time, K,
    units)` input gets an independent mask per slice k (MoS latent dropout).

    The mask is per stream (the reference draws one per sequence of the batch): under a
    `tf.distribute` strategy each replica draws the global batch's masks and keeps its own
    rows, so no two streams share a mask and the masks equal those of one device on the
    same global batch (see `per_stream_uniform`).

    Args:
        rate: drop probability p in [0, 1). Default 0.5.
        seed: int seed for the layer's `SeedGenerator`.

    Input shape: `(batch, time, ...)`. Output shape: the same (with the input's Keras mask).

    Reference: Gal & Ghahramani 2016; Merity et al. 2018 (AWD-LSTM, "LockedDropout").
    """

    def mask_shape(self, shape):
        return (shape[0], 1) + tuple(shape[2:])


@keras.saving.register_keras_serializable(package="tflm")
class StreamDropout(_StreamMaskDropout):
    """Standard dropout, a fresh mask per element and time step, drawn per stream.

        y = x * m / (1 - p),   m ~ Bernoulli(1 - p) elementwise,  same shape as x

    What `keras.layers.Dropout` computes on one device; under a `tf.distribute` strategy
    each replica keeps its own rows of the global batch's draw (`per_stream_uniform`), so the
    replicas' masks differ and equal one device's on the same global batch
    (`keras.layers.Dropout` draws the same mask on every replica: its seed state is mirrored).

    Args:
        rate: drop probability p in [0, 1). Default 0.5.
        seed: int seed for the layer's `SeedGenerator` (None: nondeterministic).

    Input shape: `(batch, ...)`. Output shape: the same.

    Reference: Srivastava et al. 2014; Zaremba et al. 2014 (dropout on the non-recurrent
    connections).
    """

    def mask_shape(self, shape):
        return tuple(shape)


@keras.saving.register_keras_serializable(package="tflm")
class EmbeddingDropout(keras.layers.Layer):
    """Drops whole rows (words) of the embedding matrix, scaled by 1 / (1 - p).

        e(w) -> e(w) * z_w / (1 - p),   z ~ Bernoulli(1 - p) in {0,1}^V, one draw per call

    Every occurrence of a dropped word in the window gets a zero vector. Applied after the
    lookup by gathering the row mask, which equals masking the matrix (as the reference does)
    without touching all V rows.

    The row mask is shared by every sequence of the batch (the reference masks the matrix
    once per forward); under a `tf.distribute` strategy every replica draws the same mask
    from its copy of the seed state, so a word dropped in one replica's streams is dropped
    in all of them.

    Args:
        vocab_size: V.
        rate: drop probability p in [0, 1). Default 0.1.
        seed: int seed.

    Call: `layer(ids, embedded, training=...)` with ids `(batch, time)` and embedded
    `(batch, time, d)`; returns `(batch, time, d)`.

    Reference: Gal & Ghahramani 2016; Merity et al. 2018 (AWD-LSTM, embedded_dropout).
    """

    def __init__(self, vocab_size, rate=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.rate = _check_rate("EmbeddingDropout", rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def row_mask(self):
        """A `(V, 1)` mask of 0 and 1/(1-p) entries for one forward call."""
        keep = 1.0 - self.rate
        kept = backends.current().uniform((self.vocab_size, 1), self.seed_generator) < keep
        return ops.cast(kept, "float32") / keep

    def call(self, ids, embedded, training=False):
        if not training or self.rate == 0.0:
            return embedded
        per_token = ops.take(self.row_mask(), ops.cast(ids, "int32"), axis=0)
        return embedded * ops.cast(per_token, embedded.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, rate=self.rate, seed=self.seed)
        return config
