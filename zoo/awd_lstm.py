"""AWD-LSTM: the weight-dropped LSTM language model with a pluggable output head."""

import keras
from keras import ops

from tflm.language_model import LanguageModel
from tflm.layers import EmbeddingDropout, LockedDropout, TiedEmbedding, WeightDropLSTM
from tflm.padding import forget_keras_mask, masked_mean, padding_mask, without_padding
from zoo.heads import make_head


def _seed(seed, offset):
    return None if seed is None else int(seed) + offset


@keras.saving.register_keras_serializable(package="zoo")
class AWDLSTM(LanguageModel):
    """AWD-LSTM body with any head that maps hidden states to log-probabilities.

        e = EmbeddingDropout(E)[w];  x_0 = LockedDropout_i(e)
        x_l = LockedDropout_h(WeightDropLSTM_l(x_{l-1}))   (l < L; no dropout after the last)
        g = LockedDropout_o(x_L);   log P(. | c) = head(g)
        extra loss (training): alpha * mean(g^2) + beta * mean((x_L[t+1] - x_L[t])^2)

    Args:
        vocab_size: V.
        embed_dim: embedding size (400 in the reference).
        hidden_dim: size of the inner LSTM layers (1150).
        num_layers: number of LSTM layers (3).
        last_dim: size of the last LSTM layer; defaults to `embed_dim` when tied, else
            `hidden_dim`. The MoS reference uses 620 with an untied-size latent.
        tie_weights: share the embedding with the output projection. Default True.
        dropout: locked dropout on the last layer's output (0.4).
        dropout_h: locked dropout between LSTM layers (0.3; "dropouth").
        dropout_i: locked dropout on the embedding output (0.65; "dropouti").
        dropout_e: embedding row dropout (0.1; "dropoute").
        weight_dropout: DropConnect on the recurrent matrices (0.5; "wdrop").
        alpha, beta: AR and TAR coefficients (2.0, 1.0).
        head: a head name, a dict {"type": name, ...} or a head layer. Default "softmax".
        seed: seed of every dropout mask (None: nondeterministic).
        bptt, clip_norm, scale_by_window, carry_state: see `tflm.LanguageModel`.

    Input: int tokens `(batch, time)`; positions holding `tflm.data.PAD_ID` (padded windows)
    are absent: the LSTMs hold their state through them and AR / TAR leave them out (see
    `tflm.padding`). Output: log-probabilities `(batch, time, V)`.

    Reference: Merity, Keskar & Socher 2018, "Regularizing and Optimizing LSTM Language
    Models" (salesforce/awd-lstm-lm).
    """

    def __init__(self, vocab_size, embed_dim=400, hidden_dim=1150, num_layers=3,
                 last_dim=None, tie_weights=True, dropout=0.4, dropout_h=0.3, dropout_i=0.65,
                 dropout_e=0.1, weight_dropout=0.5, alpha=2.0, beta=1.0, head="softmax",
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}.")
        self.vocab_size = int(vocab_size)
        self.embed_dim = int(embed_dim)
        self.hidden_dim = int(hidden_dim)
        self.num_layers = int(num_layers)
        self.tie_weights = bool(tie_weights)
        self.last_dim = int(last_dim) if last_dim else (
            self.embed_dim if self.tie_weights else self.hidden_dim)
        self.dropout, self.dropout_h = float(dropout), float(dropout_h)
        self.dropout_i, self.dropout_e = float(dropout_i), float(dropout_e)
        self.weight_dropout = float(weight_dropout)
        self.alpha, self.beta = float(alpha), float(beta)
        self.seed = seed

        self.embedding = TiedEmbedding(self.vocab_size, self.embed_dim, name="embedding")
        self.embedding_dropout = EmbeddingDropout(self.vocab_size, self.dropout_e,
                                                  seed=_seed(seed, 1), name="dropout_e")
        self.input_dropout = LockedDropout(self.dropout_i, seed=_seed(seed, 2), name="dropout_i")
        self.lstms, self.hidden_dropouts = [], []
        for i in range(self.num_layers):
            units = self.last_dim if i == self.num_layers - 1 else self.hidden_dim
            self.lstms.append(WeightDropLSTM(
                units, weight_dropout=self.weight_dropout, seed=_seed(seed, 10 + i),
                return_sequences=True, return_state=True, name=f"lstm_{i}"))
            if i < self.num_layers - 1:
                self.hidden_dropouts.append(LockedDropout(
                    self.dropout_h, seed=_seed(seed, 20 + i), name=f"dropout_h_{i}"))
        self.output_dropout = LockedDropout(self.dropout, seed=_seed(seed, 3), name="dropout_o")
        self.head = self._build_head(head)
        self.head_takes_all_layers = bool(getattr(self.head, "takes_all_layers", False))

    def _build_head(self, head):
        embedding = self.embedding if self.tie_weights else None
        if isinstance(head, keras.layers.Layer):
            return head
        if isinstance(head, dict) and "registered_name" in head:  # from get_config
            cls = keras.saving.get_registered_object(head["registered_name"])
            if cls is None:
                raise ValueError(f"Unknown head class {head['registered_name']!r}; import "
                                 "the module that defines it before loading the model.")
            config = dict(head["config"], embedding=embedding)
            if embedding is not None:
                config.pop("vocab_size", None)
            return cls.from_config(config)
        return make_head(head, embedding=embedding, vocab_size=self.vocab_size)

    def state_sizes(self):
        return [lstm.units for lstm in self.lstms]

    def build(self, input_shape=None):
        if self.built:
            return
        dummy = ops.zeros((1, 2), "int32")
        self.forward_with_state(dummy, None, training=False)
        self.built = True

    def forward_with_state(self, tokens, states=None, training=False):
        """Pure forward pass: (log-probabilities, final [(h, c)] per layer)."""
        tokens = ops.cast(tokens, "int32")
        mask = padding_mask(tokens)
        if mask is not None:
            tokens = without_padding(tokens)
        x = self.embedding(tokens)
        x = self.embedding_dropout(tokens, x, training=training)
        x = self.input_dropout(x, training=training)
        new_states, dropped_outputs = [], []
        raw = x
        for i, lstm in enumerate(self.lstms):
            initial = None if states is None else list(states[i])
            raw, h, c = lstm(x, initial_state=initial, mask=mask, training=training)
            if mask is not None:
                raw = forget_keras_mask(raw)
            new_states.append((h, c))
            if i < self.num_layers - 1:
                x = self.hidden_dropouts[i](raw, training=training)
                dropped_outputs.append(x)
        last = self.output_dropout(raw, training=training)
        dropped_outputs.append(last)
        head_inputs = dropped_outputs if self.head_takes_all_layers else last
        if mask is not None and getattr(self.head, "takes_mask", False):
            log_probs = self.head(head_inputs, training=training, mask=mask)
        else:
            log_probs = self.head(head_inputs, training=training)
        if training:
            self._add_activation_regularization(raw, last, mask)
        return log_probs, new_states

    def _add_activation_regularization(self, raw_last, dropped_last, mask=None):
        """AR on the dropped last output, TAR on the undropped one (Merity et al. 2018 §4.6);
        means over the real positions (TAR: pairs of consecutive real positions)."""
        if self.alpha:
            self.add_loss(self.alpha * masked_mean(
                ops.square(ops.cast(dropped_last, "float32")), mask))
        if self.beta:
            diff = ops.cast(raw_last[:, 1:] - raw_last[:, :-1], "float32")
            pairs = None if mask is None else ops.logical_and(mask[:, 1:], mask[:, :-1])
            self.add_loss(self.beta * masked_mean(ops.square(diff), pairs))

    def get_config(self):
        config = super().get_config()
        head = keras.saving.serialize_keras_object(self.head)
        head["config"] = {k: v for k, v in head["config"].items() if k != "embedding"}
        config.update(
            vocab_size=self.vocab_size, embed_dim=self.embed_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, last_dim=self.last_dim, tie_weights=self.tie_weights,
            dropout=self.dropout, dropout_h=self.dropout_h, dropout_i=self.dropout_i,
            dropout_e=self.dropout_e, weight_dropout=self.weight_dropout, alpha=self.alpha,
            beta=self.beta, head=head, seed=self.seed)
        return config
