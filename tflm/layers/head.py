"""Common base of the output layers: context vectors -> log-probabilities."""

import keras
from keras import ops

from tflm.layers.advsoft import adversarial_logits
from tflm.layers.candidate_sampler import CandidateSampler
from tflm.layers.embedding import TiedEmbedding
from tflm.layers.low_rank import LowRankProjection
from tflm.losses import importance_sampled_log_probs


def tanh_components(x, kernel, bias, num_components, units):
    """Mixture components h_k = tanh(W_k x + b_k), `(batch, time, K, L)`.

    One matmul for all K: `kernel` is `(d, K L)`, `bias` `(K L,)` (MoS / MoC / Mixtape latent
    vectors, DOC per input layer; Yang et al. 2018, eq. for h_{c,k})."""
    z = ops.matmul(x, ops.cast(kernel, x.dtype)) + ops.cast(bias, x.dtype)
    return ops.reshape(ops.tanh(z), tuple(ops.shape(x)[:-1]) + (num_components, units))


def head_from_config(serialized, embedding=None, vocab_size=None):
    """A head from its serialized form (`keras.saving.serialize_keras_object`, saved
    without its tied embedding), tied to `embedding` (or untied with `vocab_size` when
    `embedding` is None): how a model and a flow head rebuild the heads they hold."""
    cls = keras.saving.get_registered_object(serialized["registered_name"])
    if cls is None:
        raise ValueError(f"Unknown head class {serialized['registered_name']!r}; import the "
                         "module that defines it before loading the model.")
    config = dict(serialized["config"], embedding=embedding)
    if embedding is not None:
        config.pop("vocab_size", None)
    elif vocab_size is not None:
        config["vocab_size"] = vocab_size
    return cls.from_config(config)


class LogProbHead(keras.layers.Layer):
    """Base class of every output head (docs/design.md, contracts 1 and 2).

    A head maps context vectors `h` of shape `(batch, time, d)` to log-probabilities of shape
    `(batch, time, V)`, always float32 (even under mixed precision), with
    `logsumexp(row) == 0`. The vocabulary projection is either tied (pass the model's
    `TiedEmbedding` as `embedding`; logits = h E^T + b with the embedding's bias) or untied
    (pass `vocab_size`; the head owns a `(d, V)` kernel and a bias).

    Subclasses implement `call(h, training=False)` and use `self.project(h)` for logits.
    A head that supports AdvSoft (`supports_adversarial = True`: softmax, MoS) takes
    `adversarial_alpha` and `call(h, training=False, targets=None)`, and passes both to
    `self.project(h, targets=..., training=...)`; `takes_targets` tells the language model
    to hand it the window's targets in training (`tflm.layers.advsoft`).
    A head that supports importance-sampled training (`supports_sampling = True`: softmax,
    the conditional flow) takes `num_samples` (k) and `sampling_seed`; with k set, in
    training and given the targets, it returns `(batch, time, 1 + k)` log-probabilities
    over the target (column 0) and k words drawn from the proposal Q (`self.sampler`, a
    `tflm.layers.CandidateSampler`; `tflm.losses.importance_sampled_log_probs`), and
    `samples_in_training` tells the language model to take column 0 as the target's
    (`tflm.losses.sampled_token_nll`). Outside training it returns the full distribution.
    A head takes inputs that carry a Keras mask (padded windows) and passes no mask on: the
    language model weights the positions itself.

    Args:
        embedding: a `TiedEmbedding` to share weights with, or None.
        vocab_size: V for an untied projection (ignored when `embedding` is given, but
            must match it if both are given).
        adversarial_alpha: AdvSoft's alpha (0 = off; 0.005 in the reference), for heads
            that support it.
        num_samples: k noise words per position for importance-sampled training (None =
            full softmax in training), for heads that support it.
        sampling_seed: seed of the candidate sampler.
        shared_samples: True: the k noise words are drawn once per step and shared by
            every position (one matmul; the usual sampled softmax); False: k words per
            position (the reference CNF code's). None: the head's default
            (`shares_samples_by_default`).
        output_rank: r for an untied projection factorized as W = W1 W2 (V x r)(r x d)
            (`tflm.layers.LowRankProjection`, Zhang 2018 §7.3), for heads that support it
            (`supports_factorization`: softmax, MoS, MoC). None (default): a full (d, V)
            kernel.
    """

    supports_adversarial = False
    supports_sampling = False
    # Past Decode Regularization (`tflm.layers.PastDecode`) reads the full next-word
    # distribution in training and decodes with `project` + softmax: softmax, MoS, MoC.
    supports_past_decode = False
    supports_factorization = False
    shares_samples_by_default = True

    def __init__(self, embedding=None, vocab_size=None, adversarial_alpha=0.0,
                 num_samples=None, sampling_seed=None, shared_samples=None, output_rank=None,
                 **kwargs):
        super().__init__(**kwargs)
        adversarial_alpha = float(adversarial_alpha)
        if not adversarial_alpha >= 0.0:
            raise ValueError(f"{type(self).__name__}: adversarial_alpha must be >= 0; got "
                             f"{adversarial_alpha!r}.")
        if adversarial_alpha and not self.supports_adversarial:
            raise ValueError(f"{type(self).__name__} does not implement AdvSoft; "
                             "adversarial_alpha applies to SoftmaxLayer and MoSLayer.")
        self.adversarial_alpha = adversarial_alpha
        self.supports_masking = True
        if isinstance(embedding, dict):
            embedding = keras.saving.deserialize_keras_object(embedding)
        if embedding is not None and not isinstance(embedding, TiedEmbedding):
            raise TypeError(
                f"{type(self).__name__}: `embedding` must be a tflm TiedEmbedding (weight "
                f"tying) or None (untied, then pass vocab_size); got {type(embedding).__name__}.")
        if embedding is None and vocab_size is None:
            raise ValueError(
                f"{type(self).__name__} needs either `embedding=TiedEmbedding(...)` (tied "
                "projection) or `vocab_size=V` (untied projection); got neither.")
        if embedding is not None and vocab_size is not None and int(vocab_size) != embedding.vocab_size:
            raise ValueError(
                f"{type(self).__name__}: vocab_size={vocab_size} disagrees with the tied "
                f"embedding's vocab_size={embedding.vocab_size}; pass only one of them.")
        self.embedding = embedding
        self.vocab_size = embedding.vocab_size if embedding is not None else int(vocab_size)
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2; got {self.vocab_size}.")
        if num_samples is not None and not self.supports_sampling:
            raise ValueError(f"{type(self).__name__} does not implement importance-sampled "
                             "training; num_samples applies to SoftmaxLayer and "
                             "ConditionalCNFHead.")
        if num_samples is not None and adversarial_alpha:
            raise ValueError(f"{type(self).__name__}: AdvSoft (adversarial_alpha="
                             f"{adversarial_alpha}) and importance sampling (num_samples="
                             f"{num_samples}) do not combine; choose one.")
        self.num_samples = None if num_samples is None else int(num_samples)
        self.sampling_seed = sampling_seed
        self.shared_samples = bool(self.shares_samples_by_default if shared_samples is None
                                   else shared_samples)
        if output_rank is not None:
            if not self.supports_factorization:
                raise ValueError(f"{type(self).__name__} does not implement a factorized "
                                 "projection; output_rank applies to SoftmaxLayer, MoSLayer "
                                 "and MoCLayer.")
            if embedding is not None:
                raise ValueError(f"{type(self).__name__}: output_rank={output_rank} factorizes "
                                 "an untied projection; a tied head uses the embedding matrix. "
                                 "Untie the head (vocab_size=V) or drop output_rank.")
            if isinstance(output_rank, bool) or not isinstance(output_rank, int) \
                    or output_rank < 1:
                raise ValueError(f"{type(self).__name__}: output_rank must be a positive "
                                 f"integer (256 in Zhang 2018); got {output_rank!r}.")
        self.output_rank = output_rank
        self.factorized = None
        self.sampler = None
        if self.num_samples is not None:
            self.sampler = CandidateSampler(self.vocab_size, self.num_samples,
                                            seed=sampling_seed, name="sampler")

    @property
    def tied(self):
        return self.embedding is not None

    @property
    def takes_targets(self):
        """Whether `call` needs the targets in training (AdvSoft or sampling on)."""
        return self.adversarial_alpha > 0.0 or self.num_samples is not None

    @property
    def samples_in_training(self):
        """Whether training returns log-probabilities over sampled candidates (target in
        column 0) instead of the vocabulary."""
        return self.num_samples is not None

    def sampling(self, training, targets):
        """Whether this call trains on sampled candidates."""
        return bool(training) and targets is not None and self.num_samples is not None

    def bias_of(self, ids):
        """Output bias b_w of int `ids` (zeros without one), `ids.shape`, float32."""
        bias = self.embedding.output_bias if self.tied else self.bias
        if bias is None:
            return ops.zeros(ops.shape(ids), "float32")
        return ops.take(ops.cast(bias, "float32"), ops.cast(ids, "int32"), axis=0)

    def candidate_logits(self, h, ids):
        """Logits h . e_w + b_w of the candidate words `ids` `(batch, time, C)` for context
        vectors `h` `(batch, time, d)`: `(batch, time, C)`, float32, equal to the
        matching entries of `project(h)`."""
        vectors = self.target_vectors(ids)
        dots = ops.squeeze(ops.matmul(vectors, ops.expand_dims(ops.cast(h, "float32"), -1)),
                           -1)
        return dots + self.bias_of(ids)

    def sampled_log_probs(self, h, targets):
        """Importance-sampled log-probabilities `(batch, time, 1 + k)` of the plain
        projection (sampled softmax): the target and the sampler's noise words (shared by
        the batch, or per position), their logits, log Q."""
        if not self.shared_samples:
            ids, log_q = self.sampler(targets)
            return importance_sampled_log_probs(self.candidate_logits(h, ids), log_q)
        targets = ops.expand_dims(ops.cast(targets, "int32"), -1)
        noise, noise_log_q = self.sampler.shared()
        h = ops.cast(h, "float32")
        noise_logits = (ops.matmul(h, ops.transpose(self.target_vectors(noise)))
                        + self.bias_of(noise))
        logits = ops.concatenate([self.candidate_logits(h, targets), noise_logits], axis=-1)
        log_q = ops.concatenate([self.sampler.log_q(targets),
                                 ops.broadcast_to(noise_log_q, ops.shape(noise_logits))],
                                axis=-1)
        return importance_sampled_log_probs(logits, log_q)

    def target_vectors(self, ids):
        """Output embeddings e_w of int `ids`, `ids.shape + (d,)`, float32: rows of the tied
        matrix, or columns of the untied kernel."""
        if self.tied:
            return self.embedding.target_vectors(ids)
        if self.factorized is not None:
            return self.factorized.target_vectors(ids)
        return ops.take(ops.transpose(ops.cast(self.kernel, "float32")),
                        ops.cast(ids, "int32"), axis=0)

    def build_projection(self, input_dim):
        """Create the untied kernel/bias (no-op when tied) and the candidate sampler's
        proposal; call from `build`."""
        if self.sampler is not None:
            self.sampler.build()
        if self.tied:
            if not self.embedding.built:
                self.embedding.build()
            if int(input_dim) != self.embedding.embed_dim:
                raise ValueError(
                    f"{type(self).__name__}: tied projection needs context vectors of size "
                    f"embed_dim={self.embedding.embed_dim}; got {input_dim}. Make the last "
                    "layer's size equal to the embedding size, or untie the head.")
            return
        if self.output_rank is not None:
            self.factorized = LowRankProjection(self.vocab_size, self.output_rank,
                                                name="low_rank_projection")
            self.factorized.build((int(input_dim),))
            self.bias = self.factorized.bias
            return
        self.kernel = self.add_weight(shape=(int(input_dim), self.vocab_size), name="kernel",
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(shape=(self.vocab_size,), name="bias", initializer="zeros")

    def project(self, h, targets=None, training=False):
        """Logits h E^T + b (tied) or h W + b (untied), in h's dtype; with AdvSoft on, in
        training and given the `(batch, time)` targets, each target logit gets its
        adversarial term (`tflm.layers.advsoft.adversarial_logits`)."""
        if self.tied:
            logits = self.embedding.reverse(h)
        elif self.factorized is not None:
            logits = self.factorized(h)
        else:
            logits = ops.matmul(h, ops.cast(self.kernel, h.dtype)) + ops.cast(self.bias,
                                                                             h.dtype)
        if training and targets is not None and self.adversarial_alpha:
            logits = adversarial_logits(logits, h, targets, self.target_vectors,
                                        self.adversarial_alpha)
        return logits

    @property
    def projects_plainly(self):
        """Whether `project` is h E^T + b over a plain `TiedEmbedding` (not a subclass
        with its own reverse, e.g. FRAGE's) or h W + b over a full untied kernel: no
        factorization and no AdvSoft term, so `plain_projection` gives all of it."""
        plain_tie = not self.tied or type(self.embedding) is TiedEmbedding
        return plain_tie and not self.adversarial_alpha and self.output_rank is None

    def _ready_to_pick(self, x, needs):
        """Refuse `target_log_probs` where `picks_targets` is false (the error names what
        it `needs`), and build the layer from its input `x` where it is not built."""
        if not self.picks_targets:
            raise ValueError(f"{self.name}: target_log_probs needs {needs}.")
        if not self.built:
            self.build(tuple(x.shape))

    def plain_projection(self):
        """`(weight (V, d), bias (V,) or None)` as tensors, the layout
        `Backend.target_log_probs` reads: the tied embedding and its output bias, or the
        untied kernel transposed. Needs `projects_plainly`."""
        if self.tied:
            weight, bias = self.embedding.embeddings, self.embedding.output_bias
        else:
            weight, bias = ops.transpose(ops.convert_to_tensor(self.kernel)), self.bias
        return (ops.convert_to_tensor(weight),
                None if bias is None else ops.convert_to_tensor(bias))

    def projection_variables(self):
        """The float variables `project` reads (tied embedding, factors, or kernel and
        bias), for code that substitutes tensors for them (`keras.StatelessScope`)."""
        if self.tied:
            owner = self.embedding.variables
        elif getattr(self, "factorized", None) is not None:
            owner = self.factorized.variables
        else:
            owner = [self.kernel, self.bias]
        return [v for v in owner if "float" in str(v.dtype)]

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.vocab_size,)

    def get_config(self):
        config = super().get_config()
        config["vocab_size"] = self.vocab_size
        if self.supports_adversarial:
            config["adversarial_alpha"] = self.adversarial_alpha
        if self.output_rank is not None:
            config["output_rank"] = self.output_rank
        if self.supports_sampling:
            config.update(num_samples=self.num_samples, sampling_seed=self.sampling_seed,
                          shared_samples=self.shared_samples)
        config["embedding"] = (keras.saving.serialize_keras_object(self.embedding)
                               if self.tied else None)
        return config
