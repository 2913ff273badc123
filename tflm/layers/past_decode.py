"""Past Decode Regularization (PDR): decode the last token of the context from the predicted
distribution of the next one, with the model's own embedding and decoder.

Brahma 2019 (ACL), "Improved Language Modeling by Decoding the Past" (arXiv 1808.05908).
The paper publishes no code. At position t of a window (input w_t, target w_{t+1}):

    p_t         = P(. | w_1 .. w_t)                  the head's next-word distribution, (V,)
    e~_t        = E^T p_t = sum_w p_t(w) e_w          the expected embedding of the next word
    h~_t        = tanh(W_PDR e~_t + b_PDR)            a stateless layer: its weights are PDR's
                                                      only parameters, d_E x d_D + d_D
    P_PDR(. | p_t) = softmax(D h~_t + b)              the model's own decoder (weights D, bias
                                                      b; tied: D = E), the softmax of a
                                                      linear decoder
    L_PDR       = -(1 / N) sum_t log P_PDR(w_t | p_t)  over the window's N real positions
    L           = L_CE + lambda_PDR * L_PDR           in training only

A "language model in reverse" on the predicted next word: the soft next word is embedded with
the input embedding E, passed through one stateless layer instead of the LSTM, and decoded
with the decoder to the previous word, w_t, the input token of the same position. The
gradient reaches p_t (hence the whole network: the prediction must keep information about
the last word), E, the decoder and W_PDR, b_PDR; nothing is stopped. No dropout applies
inside PDR here.

What this module takes from the paper and what it chooses (the paper's method section could
not be consulted when this was written: the choices below are to be checked against it):

- from the abstract and summaries of the paper: the last token is decoded from the
  predicted next-token distribution, reusing the model's token embedding and linear decoder,
  through a stateless nonlinear layer whose parameters are PDR's only new ones; a
  cross-entropy term against the actual last token is added to the loss with weight
  lambda_PDR;
- chosen here: tanh as the nonlinearity (configurable), the decoder's bias shared with the
  decoder (it is part of the linear decoder), the token mean of the cross-entropy (the same
  reduction as the main loss), no dropout inside PDR, Glorot-uniform / zero initialisation
  (PyTorch's nn.Linear one with `init="pytorch"`).

Heads (`LogProbHead.supports_past_decode`): those that return the full next-word
distribution in training and whose decoder is a linear projection followed by a softmax:
`SoftmaxLayer` (tied or untied, factorized or not; not with importance sampling, which gives
no full distribution), `MoSLayer` and `MoCLayer` (p_t is the mixture; the reverse decode is
one softmax of the shared projection, `head.project`). Other heads are refused with an error.

Evaluation is unchanged: the layer adds its loss only when `training=True` and returns its
input untouched.
"""

import keras
from keras import ops

from tflm import backends
from tflm.layers.init import check_init, torch_uniform


def decoder_input_dim(head):
    """The size of the vectors `head.project` maps to logits: the tied embedding's size, or
    the input size of the untied (possibly factorized) kernel. The head must be built when
    it is untied."""
    if head.tied:
        return int(head.embedding.embed_dim)
    if not head.built:
        raise ValueError(f"{type(head).__name__} is untied and not built yet: call it once "
                         "(or build it) before building PastDecode on it.")
    if getattr(head, "factorized", None) is not None:
        return int(head.factorized.input_factor.shape[-1])
    return int(head.kernel.shape[0])


def past_decode_log_probs(next_log_probs, embeddings, kernel, bias, decode,
                          activation=ops.tanh):
    """log P_PDR(. | p_t), `(..., V)` float32, from the next-word log-probabilities.

    Args:
        next_log_probs: `(..., V)` log p_t (a head's output).
        embeddings: `(V, d_E)` the input embedding E.
        kernel, bias: `(d_E, d_D)`, `(d_D,)` the stateless layer's W_PDR and b_PDR.
        decode: callable `(..., d_D)` -> `(..., V)` logits D h + b (`head.project`).
        activation: the stateless layer's nonlinearity (tanh).
    """
    probs = ops.exp(ops.cast(next_log_probs, "float32"))
    expected = ops.matmul(probs, ops.cast(embeddings, "float32"))            # e~ = E^T p
    hidden = activation(ops.matmul(expected, ops.cast(kernel, "float32"))
                        + ops.cast(bias, "float32"))                         # h~
    return ops.log_softmax(ops.cast(decode(hidden), "float32"), axis=-1)


def past_decode_loss(next_log_probs, past_tokens, embeddings, kernel, bias, decode,
                     activation=ops.tanh):
    """L_PDR: the mean over real positions of -log P_PDR(w_t | p_t), a float32 scalar.

    `past_tokens` `(...)` int: w_t, the input token of each position (negative ids,
    `tflm.data.PAD_ID`, are padding: no weight). Other arguments: `past_decode_log_probs`.
    """
    log_probs = past_decode_log_probs(next_log_probs, embeddings, kernel, bias, decode,
                                      activation)
    tokens = ops.cast(past_tokens, "int32")
    weights = ops.cast(tokens >= 0, "float32")
    zero = backends.current().constant(0, tokens)
    picked = ops.take_along_axis(log_probs, ops.expand_dims(ops.maximum(tokens, zero), -1),
                                 axis=-1)
    nll = -ops.squeeze(picked, -1)
    total = ops.sum(weights)
    return ops.sum(nll * weights) / ops.maximum(total, backends.current().constant(1.0, total))


def check_past_decode_head(head):
    """Raise a ValueError unless `head` gives PDR what it needs (see the module docstring)."""
    name = type(head).__name__
    if not getattr(head, "supports_past_decode", False):
        raise ValueError(
            f"Past Decode Regularization needs a head whose training output is the full "
            f"next-word distribution and whose decoder is a linear projection + softmax: "
            f"SoftmaxLayer, MoSLayer or MoCLayer; {name} is not supported.")
    if getattr(head, "num_samples", None) is not None:
        raise ValueError(
            f"Past Decode Regularization needs the full next-word distribution in training; "
            f"{name} with num_samples={head.num_samples} trains on sampled candidates. Drop "
            "num_samples or PDR.")


@keras.saving.register_keras_serializable(package="tflm")
class PastDecode(keras.layers.Layer):
    """Past Decode Regularization (Brahma 2019): adds lambda_PDR * L_PDR in training.

        e~_t = E^T p_t,  h~_t = tanh(W_PDR e~_t + b_PDR),  P_PDR = softmax(D h~_t + b)
        loss += lambda_PDR * mean_t -log P_PDR(w_t)

    with p_t the head's next-word distribution at position t, w_t that position's input
    token (the last word of the context), E the input embedding and D, b the head's decoder
    (`head.project`; the tied E and output bias for a tied head). Details, and what the
    paper does not say that this layer chooses: `tflm.layers.past_decode`.

    `call(log_probs, tokens, training=False)` returns `log_probs` unchanged; with
    `training=True` it adds the loss (`self.add_loss`, hence `model.losses` and the
    training loss of `tflm.LanguageModel` on every backend). Evaluation never includes it.

    Args:
        coefficient: lambda_PDR, > 0. No public code gives a value, and the paper's was
            not read yet (no zoo preset uses PDR until it is).
        embedding: the model's `TiedEmbedding` (its matrix is E).
        head: the output head (`supports_past_decode`: `SoftmaxLayer`, `MoSLayer`,
            `MoCLayer`), already tied to `embedding` or untied.
        activation: the stateless layer's nonlinearity, a Keras activation name. Default
            "tanh".
        init: "keras" (default: Glorot-uniform kernel, zero bias) or "pytorch" (nn.Linear's
            U(+-1/sqrt(d_E)) for both).

    Weights: `kernel` `(d_E, d_D)` and `bias` `(d_D,)`, d_E the embedding size and d_D the
    decoder's input size (= d_E for a tied head).

    A model that holds this layer rebuilds it from its own arguments when loaded
    (`zoo.AWDLSTM(past_decode=...)`); its config keeps only the coefficient, activation
    and init (the embedding and head are the model's).

    Reference: Brahma 2019 (ACL), "Improved Language Modeling by Decoding the Past",
    arXiv 1808.05908 (no public code).
    """

    def __init__(self, coefficient, embedding=None, head=None, activation="tanh",
                 init="keras", **kwargs):
        kwargs.setdefault("autocast", False)  # log-probabilities stay float32
        super().__init__(**kwargs)
        coefficient = float(coefficient)
        if not coefficient > 0.0:
            raise ValueError(f"PastDecode: coefficient (lambda_PDR) must be > 0; got "
                             f"{coefficient!r}. Leave the layer out to turn PDR off.")
        if embedding is None or head is None:
            raise ValueError("PastDecode needs the model's embedding and head "
                             "(PastDecode(coefficient, embedding=..., head=...)); a model "
                             "holding it rebuilds it with them when loaded.")
        check_past_decode_head(head)
        self.coefficient = coefficient
        self.embedding = embedding
        self.head = head
        self.activation_name = activation
        self.activation = keras.activations.get(activation)
        self.init = check_init("PastDecode", init)

    def build(self, input_shape=None):
        if self.built:
            return
        if not self.embedding.built:
            self.embedding.build()
        d_in, d_out = int(self.embedding.embed_dim), decoder_input_dim(self.head)
        torch_init = self.init == "pytorch"
        self.kernel = self.add_weight(
            shape=(d_in, d_out), name="kernel",
            initializer=torch_uniform(d_in) if torch_init else "glorot_uniform")
        self.bias = self.add_weight(
            shape=(d_out,), name="bias",
            initializer=torch_uniform(d_in) if torch_init else "zeros")
        self.built = True

    def past_log_probs(self, log_probs):
        """log P_PDR(. | p_t) `(batch, time, V)` for the head's `log_probs` (for analysis)."""
        return past_decode_log_probs(log_probs, self.embedding.embeddings, self.kernel,
                                     self.bias, self.head.project, self.activation)

    def loss(self, log_probs, tokens):
        """L_PDR (without the coefficient) for the head's `log_probs` `(batch, time, V)` and
        the window's input `tokens` `(batch, time)` (PAD_ID positions left out)."""
        if not self.built:
            self.build()
        return past_decode_loss(log_probs, tokens, self.embedding.embeddings, self.kernel,
                                self.bias, self.head.project, self.activation)

    def call(self, log_probs, tokens, training=False):
        if training:
            self.add_loss(self.coefficient * self.loss(log_probs, tokens))
        return log_probs

    def compute_output_shape(self, input_shape, tokens_shape=None):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.pop("autocast", None)
        config.update(coefficient=self.coefficient, activation=self.activation_name,
                      init=self.init)
        return config
