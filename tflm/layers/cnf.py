"""CNFHead: a continuous normalizing flow over the output embeddings (Andonov 2019 §6.3)."""

import keras
from keras import ops

from tflm import compat, ode
from tflm.layers import flow_field
from tflm.layers.dropout import per_stream_normal
from tflm.layers.head import LogProbHead, head_from_config


def deserialize_base(base, embedding, vocab_size):
    """The base head of a flow head from a layer or its serialized config (saved without
    its tied embedding, which the flow head hands back)."""
    if isinstance(base, LogProbHead):
        return base
    if not isinstance(base, dict) or "registered_name" not in base:
        raise TypeError("CNFHead: `base` must be a tflm output head (a LogProbHead layer, "
                        f"e.g. SoftmaxLayer(embedding=emb)); got {type(base).__name__}.")
    return head_from_config(base, embedding, vocab_size)


class FlowHead(LogProbHead):
    """What the flow heads share: the weights of `tflm.layers.flow_field`'s f, the trace
    estimator and its noise (one draw per solve, held fixed through it, as ffjord), the
    solver options and the `nfe` metric. Not a head by itself."""

    reported_variables = ("nfe",)

    def __init__(self, embedding=None, vocab_size=None, hidden=None, trace="hutchinson",
                 eval_trace="exact", noise="gaussian", method="dopri5", rtol=1e-5, atol=1e-5, step_size=None,
                 max_steps=1000, adjoint=True, t1=1.0, init="keras", seed=None, **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        name = type(self).__name__
        if hidden is not None and (int(hidden) != hidden or int(hidden) < 1):
            raise ValueError(f"{name}: hidden must be a positive integer or None (the "
                             f"embedding size); got {hidden!r}.")
        for option, value in (("trace", trace), ("eval_trace", eval_trace)):
            if value not in flow_field.TRACES:
                raise ValueError(f"{name}: {option} must be one of {flow_field.TRACES}; got "
                                 f"{value!r}.")
        if noise not in flow_field.NOISES:
            raise ValueError(f"{name}: noise must be one of {flow_field.NOISES}; got "
                             f"{noise!r}.")
        if init not in ("keras", "pytorch"):
            raise ValueError(f"{name}: init must be 'keras' or 'pytorch'; got {init!r}.")
        self.hidden = None if hidden is None else int(hidden)
        self.trace, self.eval_trace = trace, eval_trace
        self.noise, self.init, self.seed = noise, init, seed
        self.solver = dict(method=method, rtol=float(rtol), atol=float(atol),
                           step_size=None if step_size is None else float(step_size),
                           max_steps=int(max_steps), adjoint=bool(adjoint))
        self.t1 = float(t1)
        ode.check_options(0.0, self.t1, **self.solver)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _uniform(self, fan_in):
        if self.init == "keras":
            return "glorot_uniform"
        return keras.initializers.RandomUniform(-fan_in ** -0.5, fan_in ** -0.5)

    def build_flow(self, d):
        """W_z (d, k), w_t, b_in (k,), W_out (k, d) = 0, b_out (d,) = 0, and `nfe`. W_out and
        b_out start at zero, so f = 0, the flow is the identity, its log-density change is
        0 and the head starts at its base's distribution (an inferred choice, as
        NeuralODELogits'; the gradient of W_out through the trace is not zero)."""
        k = self.hidden or int(d)
        self.flow_dim = int(d)
        self.w_z = self.add_weight(shape=(d, k), name="w_z", initializer=self._uniform(d + 1))
        self.w_t = self.add_weight(shape=(k,), name="w_t", initializer=self._uniform(d + 1))
        self.b_in = self.add_weight(shape=(k,), name="b_in", initializer="zeros")
        self.w_out = self.add_weight(shape=(k, d), name="w_out", initializer="zeros")
        self.b_out = self.add_weight(shape=(d,), name="b_out", initializer="zeros")
        # autocast=False: a count, never cast; and under a mixed policy Keras 3.15's PyTorch
        # `assign` writes into the autocast copy, losing the count (tests/zoo/models/
        # test_precision.py)
        self.nfe = self.add_weight(shape=(), name="nfe", initializer="zeros", dtype="float32",
                                   trainable=False, aggregation="only_first_replica",
                                   autocast=False)

    def flow_params(self):
        return [self.w_z, self.w_t, self.b_in, self.w_out, self.b_out]

    def draw_noise(self, shape, per_stream):
        """Hutchinson's eps for one solve: N(0, 1) or Rademacher entries; `per_stream`
        draws batch-major noise per stream (each replica its own rows)."""
        if per_stream:
            eps = per_stream_normal(shape, self.seed_generator)
        else:
            eps = keras.random.normal(shape, seed=self.seed_generator)
        if self.noise == "rademacher":
            eps = ops.where(eps >= 0, 1.0, -1.0)
        return eps

    def log_density_change(self, z0, context=None, per_stream=False, training=False):
        """Delta log p = int_{t0}^{t1} Tr(df/dz(t)) dt for every row of `z0` `(..., d)`
        (estimated with `trace` in training, `eval_trace` otherwise), and the solve's NFE."""
        trace = self.trace if training else self.eval_trace
        params = [ops.cast(p, "float32") for p in self.flow_params()]
        z0 = ops.cast(z0, "float32")
        if trace == "hutchinson":
            params.append(self.draw_noise(tuple(ops.shape(z0)), per_stream))
        if context is not None:
            params.append(ops.cast(context, "float32"))
        dynamics = flow_field.augmented_dynamics(trace, context is not None)
        start = (z0, ops.zeros(ops.shape(z0)[:-1], "float32"))
        solution = ode.odeint(dynamics, start, 0.0, self.t1, params=params, **self.solver)
        return solution.y[1], solution.nfe

    def record_nfe(self, nfe):
        if not compat.in_symbolic_scope():
            self.nfe.assign(ops.cast(nfe, "float32"))

    def get_config(self):
        config = super().get_config()
        config.update(hidden=self.hidden, trace=self.trace, eval_trace=self.eval_trace,
                      noise=self.noise, t1=self.t1,
                      init=self.init, seed=self.seed, **self.solver)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class CNFHead(FlowHead):
    """Output head: a base head's log-probabilities corrected by a flow of the embeddings.

        z(t0) = E (the V output embeddings),  log p(z(t0)) = log P_base(. | c)
        [z(t1); Delta] = int_{t0}^{t1} [f(z, t); Tr(df/dz)] dt,   Delta(t0) = 0
        log P(w | c) = log_softmax(log P_base(. | c) - Delta)_w

    with f of `tflm.layers.flow_field` (W_out^T softplus(W_z^T z + t w_t + b_in) + b_out,
    hidden width k = d by default). One flow per call: f does not see the context, so the
    flow only adds the word bias -Delta to the base and Q_theta's rank is at most the
    base's + 1 (thesis §6.3: it does not break the bottleneck; a test).

    The base is any tflm head (softmax for AWD-LSTM, MoS, DOC: the thesis' Tables 7.4-7.6);
    its log-probabilities are the base log-density (the reference code takes the decoder
    logits, equal up to a per-context constant, or log(mixture + 1e-8) for MoS / DOC; here
    the exact log-probabilities). In training the trace is Hutchinson's estimate with
    Gaussian noise by default, one draw per solve: the reference's ffjord defaults, like
    dopri5, rtol = atol = 1e-5, t in [0, 1] and adjoint gradients; `trace="exact"` is
    cheaper here and noise-free (see `tflm.layers.flow_field`), and unbiased: Delta enters
    log_softmax, so Hutchinson's noise biases the objective's gradient (see
    `ConditionalCNFHead`). Evaluation uses the exact
    trace by default (`eval_trace`), where the reference keeps Hutchinson's: the
    trajectory z(t) does not depend on the noise, so the exact Delta is the expectation of
    the reference's random one, and perplexities and Q_theta come out deterministic;
    `eval_trace="hutchinson"` evaluates as the reference does.

    Args:
        base: the base head: a `LogProbHead` built on the same `embedding` (or
            `vocab_size`), or its serialized config.
        embedding, vocab_size: the vocabulary projection the base uses (tied / untied).
        hidden: k (default: the embedding size d).
        trace: "hutchinson" (default) or "exact", in training.
        eval_trace: "exact" (default) or "hutchinson", outside training.
        noise: "gaussian" (default) or "rademacher", Hutchinson's eps.
        method, rtol, atol, step_size, max_steps, adjoint, t1: the solve (`tflm.ode.odeint`;
            defaults dopri5, 1e-5, 1e-5, None, 1000, True, 1.0).
        init: "keras" (Glorot) or "pytorch" (nn.Linear's U(+-1/sqrt(d + 1))) for W_z, w_t.
        seed: seed of the noise.

    Input: the base's (context vectors `(batch, time, d_h)`, or every layer's for DOC).
    Output shape: `(batch, time, V)`, float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = CNFHead(SoftmaxLayer(embedding=emb), embedding=emb)
    >>> head(np.zeros((2, 5, 16), "float32")).shape
    (2, 5, 100)

    Reference: Andonov 2019 (thesis), §5.2 and §6.3 (eqs. 6.3-6.6), §7.3.3; Grathwohl et
    al. 2019, "FFJORD"; Chen et al. 2018.
    """

    def __init__(self, base, embedding=None, vocab_size=None, **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        self.base = deserialize_base(base, embedding, self.vocab_size)
        if self.base.vocab_size != self.vocab_size or self.base.embedding is not embedding:
            raise ValueError("CNFHead: the base head must use the same vocabulary "
                             "projection as the flow head (the same TiedEmbedding, or "
                             "both untied with the same vocab_size).")
        self.takes_all_layers = bool(getattr(self.base, "takes_all_layers", False))
        self.takes_mask = bool(getattr(self.base, "takes_mask", False))

    def build(self, input_shape):
        if not self.base.built:
            self.base.build(input_shape)
        vectors = self.output_embeddings()
        self.build_flow(ops.shape(vectors)[-1])
        self.built = True

    def output_embeddings(self):
        """E, `(V, d)` float32: the base's output embedding of every word."""
        return self.base.target_vectors(ops.arange(self.vocab_size, dtype="int32"))

    def word_bias(self, training=False):
        """Delta `(V,)` (the flow's log-density change per word) and NFE."""
        return self.log_density_change(self.output_embeddings(), training=training)

    def call(self, inputs, training=False, mask=None):
        kwargs = {"mask": mask} if (mask is not None and self.takes_mask) else {}
        base = ops.cast(self.base(inputs, training=training, **kwargs), "float32")
        delta, nfe = self.word_bias(training)
        self.record_nfe(nfe)
        return ops.log_softmax(base - delta, axis=-1)

    def compute_output_shape(self, input_shape):
        return self.base.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        base = keras.saving.serialize_keras_object(self.base)
        base["config"] = {k: v for k, v in base["config"].items() if k != "embedding"}
        config["base"] = base
        return config
