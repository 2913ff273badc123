"""Direct Output Connection (DOC): a mixture of softmaxes fed by several layers."""

import keras
import numpy as np
from keras import ops

from tflm import backends
from tflm.layers.dropout import LockedDropout
from tflm.layers.head import LogProbHead, tanh_components
from tflm.layers.init import check_init, torch_uniform
from tflm.layers.mos import mixture_log_probs


def prior_cv_squared(pi, mask=None):
    """Squared coefficient of variation of the summed priors, as the DOC reference computes it.

        S_{b,r} = sum_t pi_{b,t,r}                                   (B, R)
        mean    = (1 / (B R)) sum_{b,r} S_{b,r}
        var     = (1 / (B R - 1)) sum_{b,r} (S_{b,r} - mean)^2        (unbiased, all B*R entries)
        cv^2    = (R - 1) * var / mean^2

    (nttcslab-nlp/doc_lm main.py: `prior.sum(0)` over time, `.var()` over all entries, times
    `size(1) - 1` = R - 1.) With B = 1 this is sum_r (S_r - mean)^2 / mean^2. Computed in
    float32; the denominator B R - 1 is floored at 1.

    Args:
        pi: `(batch, time, R)` mixture weights.
        mask: optional boolean `(batch, time)`: only these positions enter the sums
            (padded windows, `tflm.padding`).

    Returns:
        scalar float32 tensor.
    """
    pi = ops.cast(pi, "float32")
    if mask is not None:
        pi = pi * ops.expand_dims(ops.cast(mask, "float32"), -1)
    summed = ops.sum(pi, axis=1)                                             # (B, R)
    # B R counted on the device (B is unknown in a traced step): a Python number given to
    # an op is a copy to the device on PyTorch, and on a GPU a wait for the queued work
    count = ops.sum(ops.ones_like(summed))
    num = pi.shape[-1]  # R, fixed when the head is built
    mean = ops.mean(summed)
    var = ops.sum(ops.square(summed - mean)) / ops.maximum(
        count - 1.0, backends.current().constant(1.0, count))
    return (num - 1.0) * var / ops.square(mean)


@keras.saving.register_keras_serializable(package="tflm")
class DOCLayer(LogProbHead):
    """Direct Output Connection head: a mixture of softmaxes fed by several layers.

    `call` takes a list [o_1, ..., o_L] of layer outputs (each `(batch, time, d_l)`, bottom to
    top, e.g. [h^2, h^3] of a 3-layer AWD-LSTM) and `num_components_per_layer` = (v_1, ..., v_L)
    says how many components each gives (0 for none):

        g_{c,r}    = tanh(W_{r,l} o_{c,l} + b_{r,l})    v_l of them from o_l: Dense(d_l -> v_l L)
        pi_c       = softmax(U o_{c,L})                 R = sum_l v_l; prior from the LAST input
        log P(w|c) = logsumexp_r [ log pi_{c,r} + log_softmax(g_{c,r} E^T + b)_w ]

    With one input and v = (K,) it is `MoSLayer(K)`. Reference PTB: [h^2, h^3] with (5, 15),
    latent size 280. Components are ordered as the inputs. Locked dropout (`latent_dropout`)
    draws one mask per sequence, shared by every component and time step: the reference
    (nttcslab-nlp/doc_lm model.py) stacks the components along time before its
    `LockedDropout`. (MoS masks each component apart: there the latent is one wide layer.)

    `init="pytorch"` initialises as the reference: kernels (nn.Linear weights) ~
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), latent biases 0 (its `init_weights` zeroes them);
    `init="keras"` (default): glorot-uniform kernels, zero biases.

    Regularizer (training only, `cv_regularization` = lambda > 0): adds
    lambda * cv^2 (see `prior_cv_squared`) with S = the priors summed over time,
    cv^2 = (R - 1) * var_unbiased(S over all batch x component entries) / mean(S)^2, as the
    reference computes it (lambda = 0.001 there), through `add_loss`.

    Memory: as `MoSLayer` with K = R, about 2 * B*T*R*V floats at the forward peak.

    Args:
        num_components_per_layer: components per input, aligned with the input list.
            Default (5, 15) (second and last LSTM layer of the PTB reference).
        embedding: `TiedEmbedding` (tied decoder with its bias), or None.
        vocab_size: V for an untied decoder.
        latent_dim: L, size of each component. Default: embedding size (tied) or the last
            input's size (untied). Must equal the embedding size when tied.
        latent_dropout: locked dropout on the (B, T, R, L) components, in [0, 1). Default 0.0.
        cv_regularization: lambda of the coefficient-of-variation penalty; 0 disables it.
            Default 0.001.
        seed: int seed for the latent dropout. Default None.
        init: "keras" (default) or "pytorch" (the reference's initialisation).

    Input shape: list of `(batch, time, d_l)`. Output shape: `(batch, time, V)`, float32.
    `zoo.AWDLSTM` passes every layer's (dropped) output, bottom to top, because the class
    sets `takes_all_layers = True`: use (0, 5, 15) for the 3-layer reference.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = DOCLayer((2, 3), embedding=emb)
    >>> head([np.zeros((2, 5, 40), "float32"), np.zeros((2, 5, 24), "float32")]).shape
    (2, 5, 100)

    Reference: Takase, Suzuki & Nagata 2018 (EMNLP), "Direct Output Connection for a High-Rank
    Language Model"; Parthiban 2020 (thesis), §3.1.6, eq 3.14-3.16.
    """

    takes_all_layers = True  # models hand it every layer's output, not only the last
    takes_mask = True  # a (batch, time) mask of real positions keeps padding out of the CV

    def __init__(self, num_components_per_layer=(5, 15), embedding=None, vocab_size=None,
                 latent_dim=None, latent_dropout=0.0, cv_regularization=0.001, seed=None,
                 init="keras", **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        counts = num_components_per_layer
        if isinstance(counts, (int, np.integer)):
            counts = [counts]
        try:
            counts = list(counts)
        except TypeError:
            counts = None
        if not counts or not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool)
                                 and c >= 0 for c in counts) or sum(counts) < 1:
            raise ValueError(
                "DOCLayer: num_components_per_layer must be a sequence of non-negative "
                "integers (one per input layer) with a positive sum; got "
                f"num_components_per_layer={num_components_per_layer!r}.")
        counts = tuple(int(c) for c in counts)
        self.num_components_per_layer = counts
        self.num_components = sum(counts)
        if latent_dim is not None and not (isinstance(latent_dim, int) and latent_dim >= 1):
            raise ValueError(f"DOCLayer: latent_dim must be a positive integer or None; "
                             f"got latent_dim={latent_dim!r}.")
        if self.tied and latent_dim is not None and latent_dim != self.embedding.embed_dim:
            raise ValueError(f"DOCLayer: a tied decoder needs latent_dim == embed_dim "
                             f"({self.embedding.embed_dim}); got latent_dim={latent_dim}.")
        self.latent_dim = latent_dim
        latent_dropout = float(latent_dropout)
        if not 0.0 <= latent_dropout < 1.0:
            raise ValueError(f"DOCLayer: latent_dropout must be in [0, 1); "
                             f"got latent_dropout={latent_dropout}.")
        self.latent_dropout = latent_dropout
        cv_regularization = float(cv_regularization)
        if not cv_regularization >= 0.0:
            raise ValueError(f"DOCLayer: cv_regularization must be >= 0 (0 disables it); "
                             f"got cv_regularization={cv_regularization}.")
        self.cv_regularization = cv_regularization
        self.seed = seed
        self.init = check_init("DOCLayer", init)
        self.dropout = LockedDropout(latent_dropout, seed=seed, name="latent_dropout")

    def _kernel_initializer(self, fan_in):
        return torch_uniform(fan_in) if self.init == "pytorch" else "glorot_uniform"

    def _check_inputs(self, shapes):
        if not isinstance(shapes, (list, tuple)) or (shapes and isinstance(shapes[0], int)) or (
                len(shapes) != len(self.num_components_per_layer)):
            got = len(shapes) if isinstance(shapes, (list, tuple)) and shapes and not isinstance(
                shapes[0], int) else "a single tensor"
            raise ValueError(
                "DOCLayer expects a list of layer outputs, one per entry of "
                f"num_components_per_layer={self.num_components_per_layer}; got {got}.")

    def build(self, input_shape):
        self._check_inputs(input_shape)
        last_dim = int(input_shape[-1][-1])
        size = self.latent_dim or (self.embedding.embed_dim if self.tied else last_dim)
        self._latent_units = size
        self.latent_kernels, self.latent_biases = [], []    # one pair per input with count > 0
        for i, (shape, count) in enumerate(zip(input_shape, self.num_components_per_layer)):
            if count == 0:
                continue
            self.latent_kernels.append(self.add_weight(
                shape=(int(shape[-1]), count * size), name=f"latent_kernel_{i}",
                initializer=self._kernel_initializer(int(shape[-1]))))
            self.latent_biases.append(self.add_weight(
                shape=(count * size,), name=f"latent_bias_{i}", initializer="zeros"))
        self.prior_kernel = self.add_weight(shape=(last_dim, self.num_components),
                                            name="prior_kernel",
                                            initializer=self._kernel_initializer(last_dim))
        self.build_projection(size)
        self.built = True

    def components(self, inputs, training=False):
        """g_{c,r} for all R components, `(batch, time, R, L)` in input order."""
        used = [(o, c) for o, c in zip(inputs, self.num_components_per_layer) if c > 0]
        parts = [tanh_components(o, kernel, bias, count, self._latent_units)
                 for (o, count), kernel, bias in zip(used, self.latent_kernels,
                                                      self.latent_biases)]
        comps = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=2)
        if not training or self.latent_dropout == 0.0:
            return comps
        # (B, T, R, L) -> (B, T R, L): the locked mask (B, 1, L) is shared over T and R.
        shape = ops.shape(comps)
        flat = ops.reshape(comps, (shape[0], -1, self._latent_units))
        return ops.reshape(self.dropout(flat, training=training), shape)

    def prior_logits(self, inputs):
        last = inputs[-1]
        return ops.cast(ops.matmul(last, ops.cast(self.prior_kernel, last.dtype)), "float32")

    def mixture_weights(self, inputs):
        """pi = softmax(U o_L), `(batch, time, R)`, float32."""
        if not self.built:
            self.build([x.shape for x in inputs])
        inputs = [ops.cast(x, self.compute_dtype) for x in inputs]
        return ops.softmax(self.prior_logits(inputs), axis=-1)

    def call(self, inputs, training=False, mask=None):
        if isinstance(mask, (list, tuple)):  # Keras' per-input masks, when not passed
            mask = next((m for m in reversed(mask) if m is not None), None)
        self._check_inputs([x.shape for x in inputs] if isinstance(inputs, (list, tuple))
                           else inputs.shape)
        logits = self.project(self.components(inputs, training=training))   # (B, T, R, V)
        prior_logits = self.prior_logits(inputs)
        log_prior = ops.log_softmax(prior_logits, axis=-1)
        if training and self.cv_regularization > 0.0:
            self.add_loss(self.cv_regularization
                          * prior_cv_squared(ops.softmax(prior_logits, axis=-1), mask))
        return mixture_log_probs(logits, log_prior)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[-1][:-1]) + (self.vocab_size,)

    def get_config(self):
        config = super().get_config()
        config.update(num_components_per_layer=list(self.num_components_per_layer),
                      latent_dim=self.latent_dim, latent_dropout=self.latent_dropout,
                      cv_regularization=self.cv_regularization, seed=self.seed,
                      init=self.init)
        return config
