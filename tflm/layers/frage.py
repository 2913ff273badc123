"""FRAGE (Gong et al. 2018): make popular and rare words' embeddings indistinguishable, as a
training-only regularizer of the (tied) embedding matrix E, with any output head.

Gong, He, Tan, Qin, Wang & Liu, "FRAGE: Frequency-Agnostic Word Representation", NeurIPS
2018 (arXiv 1809.06858): the min-max objective of its Eq. 3; code
ChengyueGongR/Frequency-Agnostic, read at commit cfb024a (2019-05-02): `lm/main.py`
(AWD-LSTM) and `mos-lm/main.py`, `mos-lm/model.py`, `mos-lm/data.py` (AWD-LSTM-MoS). What is
written here comes from the formulas; where the paper and the code differ, the code is
followed and the difference is named below. The paper gives the discriminator's settings for
language modelling in its supplement, which was not read: they come from the code.

The split. The vocabulary is ranked by frequency (the code's `data.py` re-numbers its
dictionary by descending count) and the `popular` most frequent words are "popular", the
rest "rare" (the code's `--adv_bias` / `--moment_split`: a rank threshold, 1000 and 2000 by
default). Here the split is a 0/1 mask over the ids, `popular_mask`, set from the training
split's counts (`set_word_counts`; `python -m zoo.train` does it) and saved with the model;
before that it assumes ids ranked by frequency (ids < `popular` are popular). The code counts
train + valid + test; we count what `set_word_counts` is given (zoo: the training split).
The discriminator sees the whole vocabulary every step, as the code does (`adv_hidden(
model.encoder.weight)`: all V rows, no sampled minibatch of words).

Method "adversarial" (the paper's method; `lm/main.py`), `FrageAdversary`:

    D(e)      = softmax(e W + c)                 a linear 2-way classifier, W (d, 2), c (2,):
                                                 class 0 = popular, class 1 = rare
                                                 (the code's `nn.Linear(emsize, 2)`; no hidden
                                                 layer, no dropout)
    L_D(E, D) = 1/2 [ mean_{w popular} -log D(e_w)_0 + mean_{w rare} -log D(e_w)_1 ]

L_D is the code's class-weighted cross-entropy over all V rows (weights (V - k) / V for the k
popular rows, k / V for the rare ones, PyTorch's weighted mean), which reduces exactly to the
balanced mean above; the paper's L_D (the two classes' mean log-likelihoods, which D
maximizes) is -2 L_D. Every training step, as the code's loop does:

  1. the discriminator takes one SGD step on L_D at the current embeddings (E held fixed):
         (W, c) <- (W, c) - eta_D (grad_{W,c} L_D(E, W, c) + wd_D (W, c))
     with its own learning rate eta_D and weight decay wd_D (the code's separate
     `torch.optim.SGD(adv_hidden.parameters(), lr=adv_lr, weight_decay=adv_wdecay)`;
     0.02 and 1.2e-6 in `lm/main.py`). The gradient of this linear classifier is written in
     closed form: dL_D / dz_w = a_w (softmax(z_w) - y_w), a_w = 1 / (2 k) for a popular row
     and 1 / (2 (V - k)) for a rare one, grad_W = E^T dZ, grad_c = sum_w dZ_w.
  2. the model's loss gets the fooling term with the updated D':
         L = L_task - lambda * L_fool(E, D'),
         L_fool = mean_{w rare} -log D'(e_w)_1        (adversary_words="rare", `lm/main.py`)
               or L_D(E, D')                          (adversary_words="all": the paper's
                                                       Eq. 3 with both classes, and the 2018
                                                       `mos-lm/main.py`)
     so the embeddings ascend the discriminator's loss (rare words are pushed to where D
     sees popular ones) while D descends it: the min-max of Eq. 3. lambda is the code's
     `--adv_lambda` (0.02 in `lm/main.py`).

How this is done with one Keras optimizer. D's weights are non-trainable variables of this
layer that its training call assigns (as BatchNormalization's statistics: TensorFlow assigns
them in the step, JAX returns them from the stateless call, PyTorch copies in place), so:
the model's optimizer never moves D (the code's model optimizer does not hold D either, and
`optimizer.zero_grad()` drops the gradient L_fool leaves on D); D's step is plain SGD at
eta_D, without the model's gradient clipping, window-length scaling of the learning rate,
weight averaging or learning-rate schedule (the code's adv_optimizer has none of them); D' is
taken with a stopped gradient, so the embeddings' gradient is only -lambda grad_E L_fool at
the updated D, as in the code (its D step is an in-place `.data` update outside the
graph). One D step per model step, as the code; the discriminator's loss before its step is
reported as `frage_discriminator_loss` in the training logs.

Method "moments" (what the code's AWD-LSTM-MoS PTB command runs: `mos-lm/main.py --moment
--adv`; `--adv` is a store_false flag, and main.py also sets `args.adv = False` before
training, so the discriminator never runs there), `FrageMoments`:

    L = L_task + lambda * sum_{j=1..4} || m_j(E_popular) - m_j(E_rare) ||_2

with per-dimension m_1 = mean, m_2 = variance (unbiased, n - 1: `torch.var`), m_3 =
skewness = mean((e - m_1)^3) / m_2^1.5, m_4 = kurtosis = mean((e - m_1)^4) / m_2^2 over the
rows of each group; the gradient reaches both groups (`--moment_split` 2000, `--moment_lambda`
0.01 by default). An empirical first-four-moments match of the two distributions, which the
README's "Further Work" lists among the alternatives to the discriminator.

Both act on the model's input embedding matrix; with tied weights that is also the output
embedding. Their weights are bookkeeping, not model parameters, but
`tflm.LanguageModel.parameter_count` counts them: V for the mask, and 2 d + 2 for D.
Evaluation never includes them: the layers add their loss (and D its step) only when called
with `training=True`, and return their input unchanged.
"""

import inspect

import numpy as np

import keras
from keras import ops

from tflm import backends
from tflm.layers.init import check_init, torch_uniform

METHODS = ("adversarial", "moments")
ADVERSARY_WORDS = ("rare", "all")


def popular_mask_from_counts(counts, popular):
    """float32 `(V,)`: 1 for the `popular` most frequent ids of `counts` (ties: lower id
    first), 0 for the others."""
    counts = np.asarray(counts, np.float64).reshape(-1)
    _check_popular(popular, counts.size)
    order = np.argsort(-counts, kind="stable")
    mask = np.zeros(counts.size, np.float32)
    mask[order[:popular]] = 1.0
    return mask


def ranked_popular_mask(vocab_size, popular):
    """The split of a vocabulary numbered by descending frequency (the code's data.py): ids
    below `popular` are popular."""
    _check_popular(popular, vocab_size)
    return (np.arange(vocab_size) < popular).astype(np.float32)


def _check_popular(popular, vocab_size):
    if not 0 < int(popular) < int(vocab_size):
        raise ValueError(f"FRAGE: popular (the number of most frequent words called popular) "
                         f"must be between 1 and V - 1 = {int(vocab_size) - 1}; got "
                         f"{popular!r}.")


def _groups(popular_mask):
    m = ops.cast(popular_mask, "float32")
    n_pop, n_rare = ops.sum(m), ops.sum(1.0 - m)
    one = backends.current().constant(1.0, n_pop)
    return m, ops.maximum(n_pop, one), ops.maximum(n_rare, one)


def discriminator_log_probs(embeddings, kernel, bias):
    """log D(e_w) `(V, 2)` float32 (column 0: popular, 1: rare) for the rows of
    `embeddings` `(V, d)`."""
    logits = (ops.matmul(ops.cast(embeddings, "float32"), ops.cast(kernel, "float32"))
              + ops.cast(bias, "float32"))
    return ops.log_softmax(logits, axis=-1)


def discriminator_loss(embeddings, popular_mask, kernel, bias):
    """L_D = 1/2 (mean over popular rows of -log D_0 + mean over rare rows of -log D_1),
    the discriminator's (balanced) cross-entropy, a float32 scalar."""
    m, n_pop, n_rare = _groups(popular_mask)
    log_d = discriminator_log_probs(embeddings, kernel, bias)
    return 0.5 * (ops.sum(-log_d[:, 0] * m) / n_pop + ops.sum(-log_d[:, 1] * (1.0 - m)) / n_rare)


def _discriminator_pass(embeddings, popular_mask, kernel, bias):
    """(L_D, dL_D / dW `(d, 2)`, dL_D / dc `(2,)`) from one pass of D over the rows, the
    gradients in closed form (module docstring)."""
    e = ops.cast(embeddings, "float32")
    m, n_pop, n_rare = _groups(popular_mask)
    log_d = discriminator_log_probs(e, kernel, bias)
    loss = 0.5 * (ops.sum(-log_d[:, 0] * m) / n_pop + ops.sum(-log_d[:, 1] * (1.0 - m)) / n_rare)
    targets = ops.stack([m, 1.0 - m], axis=-1)
    weights = m * (0.5 / n_pop) + (1.0 - m) * (0.5 / n_rare)
    dz = (ops.exp(log_d) - targets) * ops.expand_dims(weights, -1)
    return loss, ops.matmul(ops.transpose(e), dz), ops.sum(dz, axis=0)


def discriminator_gradients(embeddings, popular_mask, kernel, bias):
    """(dL_D / dW `(d, 2)`, dL_D / dc `(2,)`), in closed form (module docstring)."""
    return _discriminator_pass(embeddings, popular_mask, kernel, bias)[1:]


def _sgd_step(embeddings, popular_mask, kernel, bias, learning_rate, weight_decay):
    """(L_D before the step, new W, new c): PyTorch's SGD, p - lr (grad + weight_decay p),
    with `embeddings` held fixed, everything stopped."""
    e = ops.stop_gradient(ops.cast(embeddings, "float32"))
    kernel, bias = ops.cast(kernel, "float32"), ops.cast(bias, "float32")
    loss, grad_w, grad_c = _discriminator_pass(e, popular_mask, kernel, bias)
    new_w = kernel - learning_rate * (grad_w + weight_decay * kernel)
    new_c = bias - learning_rate * (grad_c + weight_decay * bias)
    return ops.stop_gradient(loss), ops.stop_gradient(new_w), ops.stop_gradient(new_c)


def discriminator_step(embeddings, popular_mask, kernel, bias, learning_rate, weight_decay):
    """One SGD step of the discriminator on L_D with `embeddings` held fixed (PyTorch's SGD:
    p - lr (grad + weight_decay p)); the new (W, c), gradients stopped."""
    return _sgd_step(embeddings, popular_mask, kernel, bias, learning_rate, weight_decay)[1:]


def fooling_loss(embeddings, popular_mask, kernel, bias, words="rare"):
    """L_fool, which the model's loss subtracts (times lambda): the discriminator's
    cross-entropy on the rare rows alone (`words="rare"`, the code) or its L_D on all rows
    (`words="all"`, the paper's Eq. 3)."""
    if words == "all":
        return discriminator_loss(embeddings, popular_mask, kernel, bias)
    m, _, n_rare = _groups(popular_mask)
    log_d = discriminator_log_probs(embeddings, kernel, bias)
    return ops.sum(-log_d[:, 1] * (1.0 - m)) / n_rare


def _safe_norm(x):
    """||x||_2 with a zero (not NaN) gradient where x = 0."""
    squares = ops.sum(ops.square(x))
    return ops.sqrt(ops.maximum(squares, backends.current().constant(1e-30, squares)))


def group_moments(embeddings, weights):
    """(mean, unbiased variance, skewness, kurtosis), each `(d,)`, of the rows of
    `embeddings` `(V, d)` that `weights` `(V,)` (0 / 1) selects."""
    e = ops.cast(embeddings, "float32")
    w = ops.expand_dims(ops.cast(weights, "float32"), -1)
    n = ops.sum(w)
    n = ops.maximum(n, backends.current().constant(2.0, n))
    mean = ops.sum(w * e, axis=0) / n
    c = e - mean
    var = ops.sum(w * ops.square(c), axis=0) / (n - 1.0)
    skew = ops.sum(w * c ** 3, axis=0) / n / var ** 1.5
    kurt = ops.sum(w * c ** 4, axis=0) / n / ops.square(var)
    return mean, var, skew, kurt


def moment_distance(embeddings, popular_mask):
    """sum_{j=1..4} || m_j(popular rows) - m_j(rare rows) ||_2 (module docstring), a float32
    scalar."""
    m = ops.cast(popular_mask, "float32")
    pop = group_moments(embeddings, m)
    rare = group_moments(embeddings, 1.0 - m)
    return sum(_safe_norm(a - b) for a, b in zip(pop, rare))


class _FrequencySplit(keras.layers.Layer):
    """What both FRAGE methods share: the vocabulary's popular / rare split, a saved 0/1
    `popular_mask` `(V,)` (non-trainable), and the coefficient lambda."""

    def __init__(self, vocab_size, popular, coefficient, **kwargs):
        kwargs.setdefault("autocast", False)  # the statistics stay float32
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.popular = int(popular)
        _check_popular(self.popular, self.vocab_size)
        self.coefficient = float(coefficient)
        if not self.coefficient > 0.0:
            raise ValueError(f"{type(self).__name__}: coefficient (lambda) must be > 0; got "
                             f"{coefficient!r}. Leave FRAGE out to turn it off.")
        self._pending_mask = None

    def build_split(self):
        mask = ranked_popular_mask(self.vocab_size, self.popular)
        self.popular_mask = self.add_weight(
            shape=(self.vocab_size,), name="popular_mask", trainable=False,
            initializer=lambda shape, dtype=None: ops.convert_to_tensor(mask, "float32"),
            dtype="float32", aggregation="only_first_replica")
        if self._pending_mask is not None:
            self.popular_mask.assign(self._pending_mask)
            self._pending_mask = None

    def set_word_counts(self, counts):
        """Call the `popular` most frequent words of `counts` `(V,)` (e.g. the training
        split's unigram counts) popular, the rest rare."""
        counts = np.asarray(counts).reshape(-1)
        if counts.size != self.vocab_size:
            raise ValueError(f"{type(self).__name__}.set_word_counts: {counts.size} counts "
                             f"for a vocabulary of {self.vocab_size}.")
        mask = popular_mask_from_counts(counts, self.popular)
        if self.built:
            self.popular_mask.assign(mask)
        else:
            self._pending_mask = mask

    def popular_ids(self):
        """The popular ids, ascending (NumPy)."""
        if not self.built:
            self.build()
        return np.flatnonzero(ops.convert_to_numpy(self.popular_mask) > 0.5)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.pop("autocast", None)
        config.update(vocab_size=self.vocab_size, popular=self.popular,
                      coefficient=self.coefficient)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class FrageAdversary(_FrequencySplit):
    """FRAGE's adversarial regularizer (Gong et al. 2018; ChengyueGongR/Frequency-Agnostic
    `lm/main.py`): a linear discriminator D tells popular from rare embeddings, the model's
    embeddings are trained to fool it.

        each training call:  D <- D - eta_D (grad_D L_D(E, D) + wd_D D)       (E fixed)
                             loss += -lambda * L_fool(E, D)                     (D fixed)
        L_D    = 1/2 (mean_popular -log D(e)_popular + mean_rare -log D(e)_rare)
        L_fool = mean_rare -log D(e)_rare   (adversary_words="rare")  or  L_D  ("all")

    Formulas, what the code does and how the min-max is carried out with one Keras
    optimizer: `tflm.layers.frage`.

    `call(embeddings, training=False)` takes the embedding matrix `(V, d)` and returns it
    unchanged; with `training=True` it steps D (assigning its non-trainable weights) and adds
    -lambda L_fool (`self.add_loss`, hence the training loss of `tflm.LanguageModel` on
    every backend).

    Args:
        vocab_size: V.
        embed_dim: d, the embedding size.
        popular: how many of the most frequent words are popular (the code's `--adv_bias`,
            default 1000).
        coefficient: lambda (`--adv_lambda`, default 0.02).
        discriminator_lr: eta_D, D's SGD learning rate (`--adv_lr`: 0.02 in `lm/main.py`).
        discriminator_weight_decay: wd_D (`--adv_wdecay`, 1.2e-6).
        adversary_words: "rare" (default: the code's fooling term on the rare rows) or
            "all" (the paper's Eq. 3: both groups, L_D).
        init: "pytorch" (default: the code's `weight.uniform_(-0.1, 0.1)` and nn.Linear's
            U(+-1/sqrt(d)) bias) or "keras" (Glorot-uniform kernel, zero bias).

    Weights (all non-trainable, none moved by the model's optimizer): `popular_mask` (V,),
    `kernel` (d, 2), `bias` (2,), `frage_discriminator_loss` (the last L_D before D's step).
    """

    reported_variables = ("frage_discriminator_loss",)

    def __init__(self, vocab_size, embed_dim, popular=1000, coefficient=0.02,
                 discriminator_lr=0.02, discriminator_weight_decay=1.2e-6,
                 adversary_words="rare", init="pytorch", **kwargs):
        super().__init__(vocab_size, popular, coefficient, **kwargs)
        self.embed_dim = int(embed_dim)
        self.discriminator_lr = float(discriminator_lr)
        self.discriminator_weight_decay = float(discriminator_weight_decay)
        if not self.discriminator_lr > 0.0 or self.discriminator_weight_decay < 0.0:
            raise ValueError(f"FrageAdversary: discriminator_lr must be > 0 and "
                             f"discriminator_weight_decay >= 0; got {discriminator_lr!r}, "
                             f"{discriminator_weight_decay!r}.")
        if adversary_words not in ADVERSARY_WORDS:
            raise ValueError(f"FrageAdversary: adversary_words must be one of "
                             f"{', '.join(map(repr, ADVERSARY_WORDS))}; got "
                             f"{adversary_words!r}.")
        self.adversary_words = adversary_words
        self.init = check_init("FrageAdversary", init)

    def build(self, input_shape=None):
        if self.built:
            return
        self.build_split()
        d = self.embed_dim
        torch_init = self.init == "pytorch"
        self.kernel = self.add_weight(
            shape=(d, 2), name="kernel", trainable=False, aggregation="only_first_replica",
            initializer=(keras.initializers.RandomUniform(-0.1, 0.1) if torch_init
                         else "glorot_uniform"))
        self.bias = self.add_weight(
            shape=(2,), name="bias", trainable=False, aggregation="only_first_replica",
            initializer=torch_uniform(d) if torch_init else "zeros")
        self.frage_discriminator_loss = self.add_weight(
            shape=(), name="frage_discriminator_loss", initializer="zeros", dtype="float32",
            trainable=False, aggregation="only_first_replica")
        self.built = True

    def discriminator_loss(self, embeddings):
        """L_D of the current discriminator on `embeddings` `(V, d)`."""
        if not self.built:
            self.build()
        return discriminator_loss(embeddings, self.popular_mask, self.kernel, self.bias)

    def fooling_loss(self, embeddings):
        """L_fool of the current discriminator on `embeddings` (without lambda)."""
        if not self.built:
            self.build()
        return fooling_loss(embeddings, self.popular_mask, self.kernel, self.bias,
                            self.adversary_words)

    def call(self, embeddings, training=False):
        if training:
            mask = self.popular_mask
            loss, kernel, bias = _sgd_step(embeddings, mask, self.kernel, self.bias,
                                           self.discriminator_lr,
                                           self.discriminator_weight_decay)
            self.frage_discriminator_loss.assign(loss)  # L_D before the step, one pass of D
            self.kernel.assign(kernel)
            self.bias.assign(bias)
            self.add_loss(-self.coefficient * fooling_loss(embeddings, mask, kernel, bias,
                                                           self.adversary_words))
        return embeddings

    def get_config(self):
        config = super().get_config()
        config.update(embed_dim=self.embed_dim, discriminator_lr=self.discriminator_lr,
                      discriminator_weight_decay=self.discriminator_weight_decay,
                      adversary_words=self.adversary_words, init=self.init)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class FrageMoments(_FrequencySplit):
    """FRAGE's moment-matching variant, what ChengyueGongR/Frequency-Agnostic's AWD-LSTM-MoS
    command runs (`mos-lm/main.py --moment`): in training,

        loss += lambda * sum_{j=1..4} || m_j(E_popular) - m_j(E_rare) ||_2

    with m_1..m_4 the per-dimension mean, unbiased variance, skewness and kurtosis of each
    group's rows (`tflm.layers.frage`). No weights but the `popular_mask`.

    `call(embeddings, training=False)` returns `embeddings` unchanged, adding the loss with
    `training=True`.

    Args:
        vocab_size: V.
        popular: how many of the most frequent words are popular (`--moment_split`, default
            2000).
        coefficient: lambda (`--moment_lambda`, default 0.01).
    """

    def __init__(self, vocab_size, popular=2000, coefficient=0.01, **kwargs):
        super().__init__(vocab_size, popular, coefficient, **kwargs)

    def build(self, input_shape=None):
        if self.built:
            return
        self.build_split()
        self.built = True

    def moment_distance(self, embeddings):
        """The sum of the four moment distances on `embeddings` `(V, d)` (without lambda)."""
        if not self.built:
            self.build()
        return moment_distance(embeddings, self.popular_mask)

    def call(self, embeddings, training=False):
        if training:
            self.add_loss(self.coefficient * moment_distance(embeddings, self.popular_mask))
        return embeddings


# The options of each method (and their defaults, the code's) that a model's `frage` dict
# may set; `frage_settings` fills the rest.
def _defaults(cls, names):
    parameters = inspect.signature(cls.__init__).parameters
    return {name: parameters[name].default for name in names}


# Each method's settings and defaults, as its layer's constructor has them.
FRAGE_DEFAULTS = {
    "adversarial": _defaults(FrageAdversary, ("popular", "coefficient", "discriminator_lr",
                                              "discriminator_weight_decay",
                                              "adversary_words")),
    "moments": _defaults(FrageMoments, ("popular", "coefficient")),
}


def frage_settings(frage):
    """A model's `frage` argument as a complete settings dict, or None when off: None /
    False -> None; True -> the adversarial defaults; a dict -> its `method` ("adversarial"
    by default) with the method's defaults filled in. Unknown keys raise a ValueError."""
    if frage is None or frage is False:
        return None
    if frage is True:
        frage = {}
    if not isinstance(frage, dict):
        raise ValueError(f"frage must be None, True or a dict of FRAGE settings; got "
                         f"{frage!r}.")
    method = frage.get("method", "adversarial")
    if method not in METHODS:
        raise ValueError(f"frage: method must be one of {', '.join(map(repr, METHODS))}; got "
                         f"{method!r}.")
    unknown = sorted(set(frage) - set(FRAGE_DEFAULTS[method]) - {"method"})
    if unknown:
        raise ValueError(f"frage: unknown settings {unknown} for method {method!r}; known: "
                         f"{sorted(FRAGE_DEFAULTS[method])}.")
    out = {"method": method, **FRAGE_DEFAULTS[method]}
    out.update({k: v for k, v in frage.items() if k != "method"})
    return out


def make_frage(settings, vocab_size, embed_dim, init="pytorch", name="frage"):
    """The FRAGE layer of `frage_settings(...)` output `settings`."""
    options = {k: v for k, v in settings.items() if k != "method"}
    if settings["method"] == "moments":
        return FrageMoments(vocab_size, name=name, **options)
    return FrageAdversary(vocab_size, embed_dim, init=init, name=name, **options)
