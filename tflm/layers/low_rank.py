"""A factorized (low-rank) output projection: W = W1 W2 (Zhang 2018 §7.3)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tflm")
class LowRankProjection(keras.layers.Layer):
    """Logits through a rank-r output matrix, W = W1 W2:

        logits = h W^T + b = (h W2^T) W1^T + b,   W1 (V x r), W2 (r x d), b (V,)

    (never forming the V x d product). V r + r d + V parameters instead of V d + V: at
    V = 10,000, d = 650, r = 256, 2.74M instead of 6.51M. Under a softmax the log-probability
    matrix then has rank <= r + 2; under a mixture of softmaxes (eq. 7.2,
    log sum_k pi_k exp(H_k (W1 W2)^T)) it is not rank-limited (Zhang 2018 §7.3). Heads use
    it through `output_rank` (`tflm.layers.LogProbHead`).

    Args:
        vocab_size: V.
        rank: r >= 1.
        use_bias: add the output bias b. Default True.
        initializer: of W1 and W2. Default "glorot_uniform" (b starts at zero).

    Input shape: `(..., d)`. Output shape: `(..., V)`, in the input's dtype.

    Example:
    >>> proj = LowRankProjection(100, rank=4)
    >>> proj(np.zeros((2, 5, 16), "float32")).shape
    (2, 5, 100)

    Reference: Zhang 2018 (MSc thesis, "TensorFlow neural language models"), §7.3 eq. 7.2
    (after Kuchaiev & Ginsburg 2017's factorized LSTM matrices, applied to the softmax).
    """

    def __init__(self, vocab_size, rank, use_bias=True, initializer="glorot_uniform",
                 **kwargs):
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LowRankProjection: {name} must be a positive integer; got "
                                 f"{name}={value!r}.")
        self.vocab_size, self.rank = int(vocab_size), int(rank)
        self.use_bias = bool(use_bias)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        d = int(input_shape[-1])
        self.output_factor = self.add_weight(shape=(self.vocab_size, self.rank),
                                             name="output_factor", initializer=self.initializer)
        self.input_factor = self.add_weight(shape=(self.rank, d), name="input_factor",
                                            initializer=self.initializer)
        self.bias = (self.add_weight(shape=(self.vocab_size,), name="bias",
                                     initializer="zeros") if self.use_bias else None)
        self.built = True

    def call(self, h):
        low = ops.matmul(h, ops.transpose(ops.cast(self.input_factor, h.dtype)))
        logits = ops.matmul(low, ops.transpose(ops.cast(self.output_factor, h.dtype)))
        if self.bias is not None:
            logits = logits + ops.cast(self.bias, h.dtype)
        return logits

    def target_vectors(self, ids):
        """Rows w_v of W = W1 W2 for the int `ids`, `ids.shape + (d,)`, float32."""
        rows = ops.take(ops.cast(self.output_factor, "float32"), ops.cast(ids, "int32"), axis=0)
        return ops.matmul(rows, ops.cast(self.input_factor, "float32"))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.vocab_size,)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, rank=self.rank, use_bias=self.use_bias,
                      initializer=keras.initializers.serialize(self.initializer))
        return config
