"""The baseline output head: projection + log_softmax."""

import keras
from keras import ops

from tflm import backends
from tflm.layers.head import LogProbHead


@keras.saving.register_keras_serializable(package="tflm")
class SoftmaxLayer(LogProbHead):
    """Softmax output layer returning log-probabilities.

        log P(w | c) = l_w - logsumexp(l),   l = h E^T + b

    With context vectors of size d and a bias, the log-probability matrix Q_theta it can
    produce has rank <= d + 2 (the softmax bottleneck, Yang et al. 2018).

    With `adversarial_alpha > 0` (AdvSoft, Wang et al. 2019) the target word's logit gets
    h . delta, delta = -alpha |e_z| 1[cos(h, e_z) > 0] h / |h| (a constant), in training
    when the targets are passed (`call(h, training=True, targets=y)`; `tflm.LanguageModel`
    passes them); evaluation is the plain softmax (`tflm.layers.advsoft`).

    Args:
        embedding: `TiedEmbedding` to tie the projection to, or None.
        vocab_size: V for an untied projection.
        adversarial_alpha: AdvSoft's alpha; 0 (default) turns it off, 0.005 is the
            reference's.
        num_samples: k for sampled-softmax training; None (default) trains on the full
            softmax.
        sampling_seed: seed of the candidate sampler.
        output_rank: r: an untied projection factorized as W1 W2 (V x r)(r x d), rank of
            the log-probabilities <= r + 2 (`tflm.layers.LowRankProjection`). Default None.

    Input shape: `(batch, time, d)`. Output shape: `(batch, time, V)`, float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = SoftmaxLayer(embedding=emb)
    >>> head(np.zeros((2, 5, 16), "float32")).shape
    (2, 5, 100)
    """

    supports_adversarial = True
    supports_sampling = True
    supports_factorization = True
    supports_past_decode = True

    def build(self, input_shape):
        self.build_projection(input_shape[-1])
        self.built = True

    @property
    def picks_targets(self):
        """Whether `target_log_probs` computes this layer's training objective: the plain
        softmax (no AdvSoft, no sampling) over a `TiedEmbedding` or a full untied kernel."""
        return self.projects_plainly and self.num_samples is None

    def target_log_probs(self, h, targets, mask=None):
        """log P(y | c) of the `(batch, time)` int `targets` alone, float32 `(batch, time)`
        (`Backend.target_log_probs`; `mask`: the real positions, or None). Needs
        `picks_targets`."""
        self._ready_to_pick(h, "the plain softmax over a plain projection (no AdvSoft, "
                               "sampling or factorization)")
        weight, bias = self.plain_projection()
        return backends.current().target_log_probs(h, weight, bias, targets, mask)

    def call(self, h, training=False, targets=None):
        if self.sampling(training, targets):
            return self.sampled_log_probs(h, targets)
        logits = ops.cast(self.project(h, targets=targets, training=training), "float32")
        return ops.log_softmax(logits, axis=-1)
