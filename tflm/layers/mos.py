"""Mixture of Softmaxes (high rank) and Mixture of Contexts (low-rank baseline) output heads."""

import keras
from keras import ops

from tflm import backends
from tflm.layers.dropout import LockedDropout
from tflm.layers.head import LogProbHead, tanh_components
from tflm.layers.init import check_init, torch_uniform
from tflm.layers.mos_recompute import recomputed_mixture_log_probs


def _check_positive_int(layer, name, value, allow_none=False):
    if value is None and allow_none:
        return None
    try:
        ok = int(value) == value and int(value) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{layer}: {name} must be a positive integer; got {name}={value!r}.")
    return int(value)


def mixture_log_probs(logits, log_prior):
    """log sum_k pi_k softmax(logits_k), combined in log space.

        log P = logsumexp_k (log pi_k + l_k - logsumexp_V(l_k))

    Args:
        logits: `(batch, time, K, V)`, cast to float32.
        log_prior: `(batch, time, K)` log mixture weights (float32).

    Returns:
        `(batch, time, V)` float32 log-probabilities.
    """
    logits = ops.cast(logits, "float32")
    lse = ops.logsumexp(logits, axis=-1, keepdims=True)                   # (B, T, K, 1), small
    shift = ops.expand_dims(ops.cast(log_prior, "float32"), -1) - lse     # (B, T, K, 1), small
    return ops.logsumexp(logits + shift, axis=2)


def sequential_mixture_log_probs(component_logits, log_prior, num_components):
    """`mixture_log_probs` one component at a time, with a running log-sum-exp:

        acc_1 = l_1 + log pi_1 - logsumexp_V(l_1)
        acc_k = logaddexp(acc_{k-1}, l_k + log pi_k - logsumexp_V(l_k))

    so no (B, T, K, V) tensor is formed (the backward pass still keeps every component's
    logits, O(B*T*K*V), as any MoS; measured peaks in `MoSLayer`'s docstring).

    Args:
        component_logits: callable k -> `(batch, time, V)` logits of component k.
        log_prior: `(batch, time, K)` log mixture weights.
        num_components: K.
    """
    log_prior = ops.cast(log_prior, "float32")
    total = None
    for k in range(num_components):
        logits = ops.cast(component_logits(k), "float32")
        term = logits + (log_prior[..., k:k + 1]
                         - ops.logsumexp(logits, axis=-1, keepdims=True))
        total = term if total is None else ops.logaddexp(total, term)
    return total


class _MixtureBase(LogProbHead):
    """Shared parameterization of MoS and MoC: latent Dense(K*L)+tanh and prior Dense(K)."""

    supports_factorization = True
    supports_past_decode = True

    def __init__(self, num_experts, embedding=None, vocab_size=None, latent_dim=None,
                 latent_dropout=0.0, seed=None, init="keras", prior_bias=False, **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        name = type(self).__name__
        self.prior_bias = bool(prior_bias)
        self.init = check_init(name, init)
        self.num_experts = _check_positive_int(name, "num_experts", num_experts)
        self.latent_dim = _check_positive_int(name, "latent_dim", latent_dim, allow_none=True)
        if (self.tied and self.latent_dim is not None
                and self.latent_dim != self.embedding.embed_dim):
            raise ValueError(
                f"{name}: a tied decoder needs latent_dim == embed_dim "
                f"({self.embedding.embed_dim}); got latent_dim={latent_dim}. Leave latent_dim "
                "as None to use the embedding size.")
        latent_dropout = float(latent_dropout)
        if not 0.0 <= latent_dropout < 1.0:
            raise ValueError(f"{name}: latent_dropout must be in [0, 1); "
                             f"got latent_dropout={latent_dropout}.")
        self.latent_dropout = latent_dropout
        self.seed = seed
        self.dropout = LockedDropout(latent_dropout, seed=seed, name="latent_dropout")

    def _latent_size(self, input_dim):
        if self.latent_dim is not None:
            return self.latent_dim
        return self.embedding.embed_dim if self.tied else int(input_dim)

    def build(self, input_shape):
        input_dim = int(input_shape[-1])
        size = self._latent_size(input_dim)
        self._latent_units = size
        # init="pytorch": nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the latent
        # weight and bias (zihangdai/mos keeps nn.Linear's bias init) and the prior weight.
        torch_init = self.init == "pytorch"
        kernel_init = torch_uniform(input_dim) if torch_init else "glorot_uniform"
        self.latent_kernel = self.add_weight(
            shape=(input_dim, self.num_experts * size), name="latent_kernel",
            initializer=kernel_init)
        self.latent_bias = self.add_weight(
            shape=(self.num_experts * size,), name="latent_bias",
            initializer=torch_uniform(input_dim) if torch_init else "zeros")
        self.prior_kernel = self.add_weight(
            shape=(input_dim, self.num_experts), name="prior_kernel", initializer=kernel_init)
        self.prior_bias_weight = (self.add_weight(shape=(self.num_experts,), name="prior_bias",
                                                  initializer="zeros")
                                  if self.prior_bias else None)
        self.build_projection(size)
        self.built = True

    def latent(self, g, training=False):
        """Component context vectors h_k = tanh(W_k g + b_k), `(batch, time, K, L)`."""
        h = tanh_components(g, self.latent_kernel, self.latent_bias, self.num_experts,
                            self._latent_units)
        return self.dropout(h, training=training)

    def prior_logits(self, g):
        """Unnormalized mixture weights g W_pi (+ b_pi with `prior_bias`), `(batch, time,
        K)`, float32."""
        logits = ops.cast(ops.matmul(g, ops.cast(self.prior_kernel, g.dtype)), "float32")
        if self.prior_bias_weight is not None:
            logits = logits + ops.cast(self.prior_bias_weight, "float32")
        return logits

    def mixture_weights(self, g):
        """pi = softmax(g W_pi [+ b_pi]), `(batch, time, K)`, float32 (for analysis)."""
        if not self.built:
            self.build(g.shape)
        g = ops.cast(g, self.compute_dtype)
        return ops.softmax(self.prior_logits(g), axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update(num_experts=self.num_experts, latent_dim=self.latent_dim,
                      latent_dropout=self.latent_dropout, seed=self.seed, init=self.init)
        if self.prior_bias:  # only when on: earlier saved configs stay as they were
            config["prior_bias"] = True
        return config


@keras.saving.register_keras_serializable(package="tflm")
class MoSLayer(_MixtureBase):
    """Mixture of Softmaxes output head (log-probabilities).

        pi_{c,k}  = softmax_k(w_{pi,k}^T g_c)                  (no bias)
        h_{c,k}   = tanh(W_{h,k} g_c + b_k)                    (one Dense(K*L) then reshape)
        log P(w|c) = logsumexp_k [ log pi_{c,k} + log_softmax(h_{c,k} E^T + b)_w ]

    The mixture is combined in log space (never log(sum p + eps)); with K = 1 it is exactly
    the softmax head on tanh(W g + b). `latent_dropout` is locked dropout on the (B, T, K, L)
    latent with an independent mask per sequence and component (the reference's dropoutl).

    Memory: all K component logits are formed as one (B, T, K, V) tensor (one batched matmul,
    fast on accelerators). Forward peak is that tensor plus one elementwise temporary of the
    same size inside each logsumexp, i.e. about 2 * B*T*K*V floats (plus another B*T*K*V when
    the matmul runs in bfloat16 and is cast to float32); the per-component normalizers are
    (B, T, K) only. The backward pass keeps O(B*T*K*V) as in any MoS. Reference PTB sizes
    (B=12, T=70, K=15, V=10,000): 126M floats = 504 MB per (B, T, K, V) tensor.
    `mixture="sequential"` forms one component's (B, T, V) logits at a time and keeps a
    running log-sum-exp; its gradient recomputes each component in the backward pass
    instead of keeping them (`tflm.layers.mos_recompute`; under AdvSoft in training, plain
    autodiff of `sequential_mixture_log_probs`). Values and gradients equal the batched
    ones to float32 rounding. Measured (bench/heads/results/mos_memory.md, TensorFlow, PTB head
    size): the forward pass peaks at 0.85 instead of 2.2 B*T*K*V tensors (1.4x the time),
    a training step at 1.07 instead of 3.5 tensors (2.0x the time: one more projection
    per component, and the components no longer run concurrently).

    Args:
        num_experts: K, the number of softmax components (15 in the reference).
        embedding: `TiedEmbedding` (tied decoder with its bias), or None.
        vocab_size: V for an untied decoder.
        latent_dim: L, size of each component's context vector. Default: the embedding size
            (tied) or the input size (untied). Must equal the embedding size when tied.
        latent_dropout: locked-dropout rate on the latent, in [0, 1). Default 0.0.
        seed: int seed for the latent dropout. Default None.
        init: "keras" (default: glorot-uniform kernels, zero bias) or "pytorch" (the
            reference's nn.Linear initialisation, `tflm.layers.init`).
        mixture: "batched" (default: all components in one (B, T, K, V) tensor) or
            "sequential" (one component at a time, recomputed in the backward pass: about
            a third of the memory in training, twice the time).
        prior_bias: pi = softmax(W_pi g + b_pi), a trained prior bias (Zhang 2018's MoS on
            the Zaremba baselines, whose parameter counts include it). Default False (the
            reference MoS code's prior has none).
        output_rank: r: an untied decoder factorized as W1 W2 (V x r)(r x L), shared by
            the K components (Zhang 2018 eq. 7.2; `tflm.layers.LowRankProjection`).
            Default None.
        adversarial_alpha: AdvSoft's alpha (0 = off), applied to every component's target
            logit with that component's h_{c,k}, as the AdvSoft MoS code does (its
            `--epsilon`, 0.005; 0.028 in its finetuning commands); training only, given
            the targets (`call(g, training=True, targets=y)`).

    Input shape: `(batch, time, d)` (last-layer output g). Output shape: `(batch, time, V)`,
    float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = MoSLayer(num_experts=4, embedding=emb, latent_dropout=0.29)
    >>> head(np.zeros((2, 5, 32), "float32")).shape
    (2, 5, 100)

    Reference: Yang et al. 2018 (ICLR), "Breaking the Softmax Bottleneck", §2.4.
    """

    supports_adversarial = True

    def __init__(self, num_experts, embedding=None, vocab_size=None, latent_dim=None,
                 latent_dropout=0.0, seed=None, init="keras", mixture="batched", **kwargs):
        super().__init__(num_experts, embedding=embedding, vocab_size=vocab_size,
                         latent_dim=latent_dim, latent_dropout=latent_dropout, seed=seed,
                         init=init, **kwargs)
        if mixture not in ("batched", "sequential"):
            raise ValueError(f"MoSLayer: mixture must be 'batched' or 'sequential'; got "
                             f"{mixture!r}.")
        self.mixture = mixture

    @property
    def picks_targets(self):
        """Whether `target_log_probs` computes this layer's training objective: the
        batched mixture over a plain projection (no AdvSoft, no factorization)."""
        return self.mixture == "batched" and self.projects_plainly

    def target_log_probs(self, g, targets, mask=None):
        """The training objective's log P(y | c) of the `(batch, time)` int `targets`
        alone, float32 `(batch, time)`, the latent dropped as in training
        (`Backend.mixture_target_log_probs`: on JAX chunk by chunk, without the `(batch,
        time, K, V)` tensor; `mask`: the real positions, or None). Needs `picks_targets`."""
        self._ready_to_pick(g, "the batched mixture over a plain projection (no AdvSoft "
                               "or factorization)")
        g = ops.cast(g, self.compute_dtype)
        h = self.latent(g, training=True)                                  # (B, T, K, L)
        log_prior = ops.log_softmax(self.prior_logits(g), axis=-1)        # (B, T, K)
        weight, bias = self.plain_projection()
        return backends.current().mixture_target_log_probs(h, log_prior, weight, bias,
                                                           targets, mask)

    def call(self, g, training=False, targets=None):
        h = self.latent(g, training=training)                              # (B, T, K, L)
        log_prior = ops.log_softmax(self.prior_logits(g), axis=-1)        # (B, T, K)
        adversarial = training and targets is not None and self.adversarial_alpha
        if self.mixture == "sequential" and not adversarial:
            return recomputed_mixture_log_probs(self.project, self.projection_variables(),
                                                h, log_prior)
        if self.mixture == "sequential":  # AdvSoft's target terms: plain autodiff
            return sequential_mixture_log_probs(
                lambda k: self.project(h[:, :, k], targets=targets, training=training),
                log_prior, self.num_experts)
        logits = self.project(h, targets=targets, training=training)       # (B, T, K, V)
        return mixture_log_probs(logits, log_prior)

    def get_config(self):
        config = super().get_config()
        config["mixture"] = self.mixture
        return config


@keras.saving.register_keras_serializable(package="tflm")
class MoCLayer(_MixtureBase):
    """Mixture of Contexts output head: mix the context vectors, then one softmax.

        h_c = sum_k pi_{c,k} tanh(W_{h,k} g_c + b_k),   pi_c = softmax(W_pi g_c)
        log P(w|c) = log_softmax(h_c E^T + b)_w

    Same parameters as `MoSLayer`, but the log-probability matrix keeps the softmax
    bottleneck: rank <= L + 2 (L = latent size; +1 for the bias, +1 for normalization).
    Memory is that of a softmax head (the mixture is (B, T, K, L)).

    Args:
        num_experts: K. embedding, vocab_size, latent_dim, latent_dropout, seed: as `MoSLayer`.

    Input shape: `(batch, time, d)`. Output shape: `(batch, time, V)`, float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> MoCLayer(num_experts=4, embedding=emb)(np.zeros((2, 5, 32), "float32")).shape
    (2, 5, 100)

    Reference: Yang et al. 2018 (ICLR), §2.5.
    """

    @property
    def picks_targets(self):
        """Whether `target_log_probs` computes this layer's training objective: one softmax
        over a plain projection (no factorization)."""
        return self.projects_plainly

    def target_log_probs(self, g, targets, mask=None):
        """The training objective's log P(y | c) of the `(batch, time)` int `targets`
        alone, float32 `(batch, time)`, the latent dropped as in training: the softmax's
        (`Backend.target_log_probs`, on JAX chunk by chunk) over the mixed contexts.
        Needs `picks_targets`."""
        self._ready_to_pick(g, "a plain projection (no factorization)")
        weight, bias = self.plain_projection()
        return backends.current().target_log_probs(
            self._mixed_contexts(ops.cast(g, self.compute_dtype), training=True), weight,
            bias, targets, mask)

    def _mixed_contexts(self, g, training):
        """h_c = sum_k pi_{c,k} h_{c,k}, `(batch, time, L)`."""
        h = self.latent(g, training=training)                             # (B, T, K, L)
        pi = ops.softmax(self.prior_logits(g), axis=-1)                   # (B, T, K)
        return ops.sum(h * ops.cast(ops.expand_dims(pi, -1), h.dtype), axis=2)

    def call(self, g, training=False):
        mixed = self._mixed_contexts(g, training)
        return ops.log_softmax(ops.cast(self.project(mixed), "float32"), axis=-1)
