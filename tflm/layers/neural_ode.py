"""NeuralODELogits: the logits flow along a learned ODE before the softmax (Andonov 2019)."""

import keras
from keras import ops

from tflm import compat, ode
from tflm.layers.head import LogProbHead


@keras.saving.register_keras_serializable(package="tflm")
class NeuralODELogits(LogProbHead):
    """Output head: vocabulary projection, an ODE on the logits, log_softmax.

        l(t0) = h E^T + b  (tied)  or  h W_o + b  (untied)
        l(t1) = l(t0) + int_{t0}^{t1} f(l(t), t) dt,   f(l, t) = W softplus(W_f^T [l; t])
        log P(w | c) = log_softmax(l(t1))_w

    with W_f in R^{(V+1) x k}, W in R^{V x k}, no biases, k the bottleneck (default: the
    context size d, which is the embedding size of a tied AWD-LSTM: 400 on PTB, 8,000,400
    extra weights) and [t0, t1] = [0, 1]. The map is non-linear in the logits, so its
    log-probability matrix is not bounded by rank d + 2, but it is not full rank either
    (the thesis, §4.3, calls it unbounded): l(t1) - l(t0) = W int softplus(.) dt lies in
    the column space of W, so over N contexts

        Q = H E^T + 1 b^T + U W^T - lse 1^T,   rank(Q) <= d + k + 2

    (U the N x k integrals, lse the row normalisers): 2d + 2 = 802 on PTB with k = d = 400.
    A wider bottleneck k raises the bound; tested, and measured at exactly d + k + 2 on a
    trained model (bench/reproductions/results/flow_heads_synthetic.md).

    The solve is `tflm.ode.odeint` over the whole window at once (one adaptive step size
    for the batch, as torchdiffeq solves a batch), with dopri5 and rtol = atol = 1e-5 and
    adjoint gradients by default: the defaults of the reference CNF code (ffjord's
    `layers.CNF`, which the thesis' flows use); the thesis states none of them for this
    head. Each call stores its number of evaluations of f in the non-trainable variable
    `nfe`, which `tflm.LanguageModel` reports in its logs as `nfe` (`val_nfe` in
    validation): the last step's value, as torchdiffeq users read it.

    Initialisation (the thesis states none): W_f is Glorot-uniform (`init="keras"`) or
    PyTorch's `nn.Linear` default U(+-1/sqrt(V + 1)) (`init="pytorch"`); W starts at zero,
    so f = 0 and a head attached to a pre-trained model (`--init-from`) starts at that
    model's distribution exactly, and W_f's gradient, a^T W softplus'(.), grows from W's.
    A random W would move every logit by O(1) at the start and throw the pre-trained
    perplexity away (V = 10,000 terms in each W_f^T l).

    Args:
        embedding: `TiedEmbedding` to tie the projection to, or None.
        vocab_size: V for an untied projection.
        bottleneck: k; None (default) uses the context size d.
        method, rtol, atol, step_size, max_steps, adjoint: as in `tflm.ode.odeint`
            (defaults "dopri5", 1e-5, 1e-5, None, 1000, True).
        t1: end time (default 1.0; t0 = 0).
        init: "keras" (default) or "pytorch", W_f's initialiser (see above).

    Input shape: `(batch, time, d)`. Output shape: `(batch, time, V)`, float32. The layer
    computes in float32 whatever the dtype policy (a mixed policy casts its input up).

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = NeuralODELogits(embedding=emb)
    >>> head(np.zeros((2, 5, 16), "float32")).shape
    (2, 5, 100)

    Reference: Andonov 2019 (thesis), §4.3 (eq. 4.3-4.5) and §7.3.2 (f, k, Table 7.3);
    Chen et al. 2018, "Neural Ordinary Differential Equations".
    """

    reported_variables = ("nfe",)

    def __init__(self, embedding=None, vocab_size=None, bottleneck=None, method="dopri5",
                 rtol=1e-5, atol=1e-5, step_size=None, max_steps=1000, adjoint=True, t1=1.0,
                 init="keras", **kwargs):
        # float32 under a mixed dtype policy too: an adaptive solve in 16 bits would take
        # tiny steps or stop at max_steps (its inputs are cast up on the way in)
        kwargs["dtype"] = "float32"
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        if bottleneck is not None and (int(bottleneck) != bottleneck or int(bottleneck) < 1):
            raise ValueError(f"NeuralODELogits: bottleneck must be a positive integer or "
                             f"None (the context size); got {bottleneck!r}.")
        if init not in ("keras", "pytorch"):
            raise ValueError(f"NeuralODELogits: init must be 'keras' or 'pytorch'; got "
                             f"{init!r}.")
        self.bottleneck = None if bottleneck is None else int(bottleneck)
        self.solver = dict(method=method, rtol=float(rtol), atol=float(atol),
                           step_size=None if step_size is None else float(step_size),
                           max_steps=int(max_steps), adjoint=bool(adjoint))
        self.t1 = float(t1)
        self.init = init
        # Every solver argument is checked now, not at the first call inside a traced step.
        ode.check_options(0.0, self.t1, **self.solver)

    def build(self, input_shape):
        self.build_projection(input_shape[-1])
        k = self.bottleneck or int(input_shape[-1])
        v = self.vocab_size
        w_f_init = ("glorot_uniform" if self.init == "keras" else
                    keras.initializers.RandomUniform(-(v + 1) ** -0.5, (v + 1) ** -0.5))
        self.w_f = self.add_weight(shape=(v + 1, k), name="w_f", initializer=w_f_init)
        self.w = self.add_weight(shape=(v, k), name="w", initializer="zeros")
        # autocast=False: a count, never cast; and under a mixed policy Keras 3.15's PyTorch
        # `assign` writes into the autocast copy, losing the count (tests/zoo/models/
        # test_precision.py)
        self.nfe = self.add_weight(shape=(), name="nfe", initializer="zeros", dtype="float32",
                                   trainable=False, aggregation="only_first_replica",
                                   autocast=False)
        self.built = True

    @staticmethod
    def vector_field(t, logits, params):
        """f(l, t) = W softplus(W_f^T [l; t]) for logits `(..., V)` (params = [W_f, W])."""
        w_f, w = params
        v = ops.shape(w)[0]
        pre = ops.matmul(logits, w_f[:v]) + t * w_f[v]
        return ops.matmul(ops.softplus(pre), ops.transpose(w))

    def transform(self, logits):
        """(l(t1), NFE) for float32 logits l(t0)."""
        solution = ode.odeint(self.vector_field, logits, 0.0, self.t1, params=[self.w_f, self.w],
                              **self.solver)
        return solution.y, solution.nfe

    def call(self, h, training=False):
        logits = ops.cast(self.project(h), "float32")
        flowed, nfe = self.transform(logits)
        if not compat.in_symbolic_scope():
            self.nfe.assign(ops.cast(nfe, "float32"))
        return ops.log_softmax(flowed, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update(bottleneck=self.bottleneck, t1=self.t1, init=self.init, **self.solver)
        return config
