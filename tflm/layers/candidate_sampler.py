"""The candidate set of importance-sampled training: the target and k words drawn from Q."""

import keras
import numpy as np
from keras import ops

from tflm.layers.dropout import per_stream_uniform


def unigram_proposal(counts):
    """Proposal probabilities Q(w) from training-set counts, float64 `(V,)`.

    Q(w) = n'_w / sum_v n'_v with n'_w = n_w, or the smallest positive n_v where n_w = 0: a
    word never seen in training counts as seen as often as the rarest seen word (once, for
    counts), so its log Q (subtracted from its logit when it is a target) stays finite.
    Probabilities are accepted as counts."""
    counts = np.asarray(counts, dtype="float64")
    if counts.ndim != 1 or counts.size < 2:
        raise ValueError(f"unigram_proposal: counts must be a 1-D array over the vocabulary "
                         f"(V >= 2); got shape {counts.shape}.")
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("unigram_proposal: counts must be finite and >= 0; got min "
                         f"{counts.min()!r}.")
    if not np.any(counts > 0):
        raise ValueError("unigram_proposal: every count is 0; pass the training split's "
                         "unigram counts.")
    counts = np.where(counts > 0, counts, counts[counts > 0].min())
    return counts / counts.sum()


@keras.saving.register_keras_serializable(package="tflm")
class CandidateSampler(keras.layers.Layer):
    """Draws, for every position, the target plus `num_samples` noise words from Q (or k
    words shared by the whole batch, `shared()`).

        S_{b,t} = (y_{b,t}, w_1, ..., w_k),   w_i ~ Q i.i.d. (with replacement)

    one independent draw per position, as the reference CNF code's `sampled_targets` (one
    row of 1 + k ids per position). Sampling is by inverse CDF: a uniform number per noise
    word and a binary search in the cumulative Q (O(log V) each, never a V-wide tensor per
    position). The uniforms are drawn per stream (`tflm.layers.dropout.per_stream_uniform`),
    so under a `tf.distribute` strategy every replica's positions get their own words and a
    replicated step draws what one device draws for the same global batch.

    Q lives in two non-trainable weights (`log_proposal`, `cumulative`), saved with the
    model: uniform until `set_proposal(counts)` is called (`zoo.train` passes the training
    split's unigram counts, the reference's proposal).

    Args:
        vocab_size: V.
        num_samples: k, noise words per position (20 in Andonov 2019 §7.3.3). >= 1.
        proposal: optional `(V,)` counts or probabilities to start from (see
            `unigram_proposal`); not part of the config (the weights carry it).
        seed: int seed of the layer's `SeedGenerator`.

    Call: `sampler(targets)` with int `(batch, time)` targets returns `(ids, log_q)`, int32
    ids `(batch, time, 1 + k)` with the target in column 0 and float32 log Q of each id.
    `sampler.shared()` draws k words for the whole batch instead (`(k,)` ids and log Q).

    Reference: Jozefowicz et al. 2016, "Exploring the Limits of Language Modeling" §3.1;
    Bengio & Senecal 2008; Andonov 2019 (thesis), §6.6.3.
    """

    def __init__(self, vocab_size, num_samples=20, proposal=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        if int(vocab_size) != vocab_size or int(vocab_size) < 2:
            raise ValueError(f"CandidateSampler: vocab_size must be an integer >= 2; got "
                             f"{vocab_size!r}.")
        if int(num_samples) != num_samples or int(num_samples) < 1:
            raise ValueError(f"CandidateSampler: num_samples must be an integer >= 1; got "
                             f"{num_samples!r}.")
        self.vocab_size = int(vocab_size)
        self.num_samples = int(num_samples)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self._initial = None if proposal is None else self._checked(proposal)

    def _checked(self, counts):
        q = unigram_proposal(counts)
        if q.size != self.vocab_size:
            raise ValueError(f"CandidateSampler: the proposal has {q.size} entries for a "
                             f"vocabulary of {self.vocab_size}.")
        return q

    @staticmethod
    def _tables(q):
        cumulative = np.cumsum(q)
        cumulative /= cumulative[-1]
        return np.log(q).astype("float32"), cumulative.astype("float32")

    def build(self, input_shape=None):
        if self.built:
            return
        q = self._initial if self._initial is not None else np.full(self.vocab_size,
                                                                     1.0 / self.vocab_size)
        log_q, cumulative = self._tables(q)
        self.log_proposal = self.add_weight(
            shape=(self.vocab_size,), name="log_proposal", trainable=False,
            initializer=keras.initializers.Constant(log_q))
        self.cumulative = self.add_weight(
            shape=(self.vocab_size,), name="cumulative", trainable=False,
            initializer=keras.initializers.Constant(cumulative))
        self.built = True

    def set_proposal(self, counts):
        """Use Q from `counts` (training-set unigram counts, or probabilities)."""
        q = self._checked(counts)
        if not self.built:
            self._initial = q
            return
        log_q, cumulative = self._tables(q)
        self.log_proposal.assign(log_q)
        self.cumulative.assign(cumulative)

    def proposal(self):
        """Q as a NumPy float64 array `(V,)`."""
        if not self.built:
            self.build()
        return np.exp(ops.convert_to_numpy(self.log_proposal).astype("float64"))

    def _inverse_cdf(self, u):
        if not self.built:
            self.build()
        # keras' searchsorted on TensorFlow takes 1-D values only: flatten, search, restore.
        flat = ops.searchsorted(ops.cast(self.cumulative, "float32"), ops.reshape(u, (-1,)),
                                side="right")
        return ops.reshape(ops.minimum(ops.cast(flat, "int32"), self.vocab_size - 1),
                           ops.shape(u))

    def log_q(self, ids):
        """log Q of int `ids` (any shape), float32."""
        return ops.take(ops.cast(self.log_proposal, "float32"), ops.cast(ids, "int32"), axis=0)

    def call(self, targets):
        targets = ops.cast(targets, "int32")
        shape = tuple(ops.shape(targets))
        noise = self._inverse_cdf(per_stream_uniform(shape + (self.num_samples,),
                                                     self.seed_generator))
        ids = ops.concatenate([ops.expand_dims(targets, -1), noise], axis=-1)
        return ids, self.log_q(ids)

    def shared(self):
        """k noise words for the whole batch (the sampled softmax of Jozefowicz et al. and
        `tf.nn.sampled_softmax_loss`: every position is scored against the same k words,
        one (batch, time, d) x (d, k) matmul): `(ids, log_q)`, each `(k,)`. Every replica
        of a `tf.distribute` strategy draws the same words from its copy of the seed state,
        the words one device draws."""
        ids = self._inverse_cdf(keras.random.uniform((self.num_samples,),
                                                     seed=self.seed_generator))
        return ids, self.log_q(ids)

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape) + (1 + self.num_samples,)
        return shape, shape

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, num_samples=self.num_samples, seed=self.seed)
        return config
