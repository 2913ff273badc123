"""AWD-LSTM language model: the AWD-LSTM backbone + a pluggable output head (the task)."""

import keras
from keras import ops

from tflm.layers.frage import frage_settings, make_frage
from tflm.layers.past_decode import PastDecode
from tflm.padding import masked_mean
from zoo.models.awd_lstm.awd_lstm_backbone import AWDLSTMBackbone
from zoo.models.backbone_head_model import BackboneHeadModel

# Constructor arguments that belong to the backbone (the rest configure the task).
BACKBONE_ARGS = ("embed_dim", "hidden_dim", "num_layers", "last_dim", "tie_weights", "dropout",
                 "dropout_h", "dropout_i", "dropout_e", "weight_dropout", "use_cudnn", "seed",
                 "init", "lstm_biases", "embedding_noise", "cosine_regularization",
                 "spectrum_control")


@keras.saving.register_keras_serializable(package="zoo")
class AWDLSTM(BackboneHeadModel):
    """AWD-LSTM language model: `AWDLSTMBackbone` + any head mapping hidden states to
    log-probabilities, trained with AR / TAR.

        g, layers = AWDLSTMBackbone(w);   log P(. | c) = head(g)   (DOC: head(layers))
        extra loss (training): alpha * mean(g^2) + beta * mean((r_L[t+1] - r_L[t])^2)
                               [+ past_decode * L_PDR] [+ FRAGE's term on E]

    with g the last layer's dropped output and r_L its raw (undropped) output. The backbone
    (`model.backbone`) returns every layer's hidden states; its parts are also reachable as
    `model.embedding` and `model.lstms`.

    Args:
        vocab_size: V.
        embed_dim, hidden_dim, num_layers, last_dim, tie_weights, dropout, dropout_h,
            dropout_i, dropout_e, weight_dropout, use_cudnn, seed, init, lstm_biases: the
            backbone's (`zoo.AWDLSTMBackbone`; reference defaults 400, 1150, 3, None, True,
            0.4, 0.3, 0.65, 0.1, 0.5, "auto", None, "keras", 1).
        embedding_noise, cosine_regularization, spectrum_control: the backbone's
            regularizers of the embedding (Gaussian embedding noise, MLE-CosReg, spectrum
            control; default off). AdvSoft is the head's (`{"type": "softmax",
            "adversarial_alpha": 0.005}`). `tie_weights` also ties the
            head to the embedding. `init="pytorch"` also initialises a head given by name
            that has an `init` option (MoS, MoC, DOC) as the reference code does, and
            `lstm_biases=2` trains PyTorch's two LSTM biases: with both, the model is
            parametrized and initialised as the reference implementations.
        alpha, beta: AR and TAR coefficients (2.0, 1.0).
        past_decode: lambda_PDR of Past Decode Regularization (Brahma 2019,
            `tflm.layers.PastDecode`: the last input word decoded from the predicted
            next-word distribution through E, a stateless tanh layer and the head's decoder;
            its cross-entropy, times lambda_PDR, joins the training loss). Heads: softmax,
            MoS, MoC. Default 0 (off; the layer and its weights exist only when on).
        frage: FRAGE (Gong et al. 2018, `tflm.layers.frage`), any head: None (default, off:
            no layer, no weights), True, or a dict: {"method": "adversarial"} (a linear
            discriminator stepped each training step, the embeddings trained to fool it;
            options popular, coefficient, discriminator_lr, discriminator_weight_decay,
            adversary_words) or {"method": "moments"} (the four moments of popular and rare
            embeddings matched; popular, coefficient). `python -m zoo.train` sets the
            popular / rare split from the training split's counts.
        freeze_base: train the head's own weights only (a NeuralODE or flow head put on a
            pre-trained model, the "freeze" rows of Andonov 2019 Tables 7.3-7.10): the
            backbone, with the tied embedding and output bias, and a flow's base head
            (`CNFHead.base`: MoS, DOC) are not trainable. Needs tied weights. Default False.
        head: a head name, a dict {"type": name, ...} or a head layer. Default "softmax".
        bptt, clip_norm, weight_decay, scale_by_window, carry_state, flooding_level: see
            `tflm.LanguageModel`.

    Input: int tokens `(batch, time)`; positions holding `tflm.data.PAD_ID` (padded windows)
    are absent: the LSTMs hold their state through them and AR / TAR leave them out (see
    `tflm.padding`). Output: log-probabilities `(batch, time, V)`.

    Reference: Merity, Keskar & Socher 2018, "Regularizing and Optimizing LSTM Language
    Models" (salesforce/awd-lstm-lm).
    """

    preset_kind = "awd_lstm"  # a preset's model.kind for this family (from_preset)

    def __init__(self, vocab_size, embed_dim=400, hidden_dim=1150, num_layers=3,
                 last_dim=None, tie_weights=True, dropout=0.4, dropout_h=0.3, dropout_i=0.65,
                 dropout_e=0.1, weight_dropout=0.5, alpha=2.0, beta=1.0, head="softmax",
                 use_cudnn="auto", seed=None, init="keras", lstm_biases=1, embedding_noise=0.0,
                 cosine_regularization=0.0, spectrum_control=None, freeze_base=False,
                 past_decode=0.0, frage=None, **kwargs):
        super().__init__(**kwargs)
        with self.own_dtype_policy():
            self.backbone = AWDLSTMBackbone(
                vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim, num_layers=num_layers,
                last_dim=last_dim, tie_weights=tie_weights, dropout=dropout,
                dropout_h=dropout_h, dropout_i=dropout_i, dropout_e=dropout_e,
                weight_dropout=weight_dropout, use_cudnn=use_cudnn, seed=seed, init=init,
                lstm_biases=lstm_biases, embedding_noise=embedding_noise,
                cosine_regularization=cosine_regularization,
                spectrum_control=spectrum_control, name="backbone")
            self.vocab_size = self.backbone.vocab_size
            self.tie_weights = self.backbone.tie_weights
            self.head = self._build_head(head, init=self.backbone.init)
            self.past_decode = float(past_decode)
            if not self.past_decode >= 0.0:
                raise ValueError(f"past_decode (lambda_PDR) must be >= 0; got {past_decode!r}.")
            # Made only when on: a model without it has the variables of earlier releases.
            self.past_decode_layer = (
                PastDecode(self.past_decode, embedding=self.embedding, head=self.head,
                           init=self.backbone.init, name="past_decode")
                if self.past_decode else None)
            self.frage = frage_settings(frage)  # None when off: no layer, no weights
            self.frage_layer = (
                make_frage(self.frage, self.vocab_size, self.backbone.embed_dim,
                           init=self.backbone.init)
                if self.frage is not None else None)
        self.alpha, self.beta = float(alpha), float(beta)
        self.freeze_base = bool(freeze_base)
        if self.freeze_base and not self.tie_weights:
            raise ValueError("freeze_base=True freezes the backbone, which holds the tied "
                             "output embedding; with tie_weights=False the head's own "
                             "projection would still train. Tie the weights, or freeze "
                             "nothing.")

    def build(self, input_shape=None):
        if self.built:
            return
        self.trace_shapes()
        if self.past_decode_layer is not None:
            with self.own_dtype_policy():
                self.past_decode_layer.build()
        if self.frage_layer is not None:
            with self.own_dtype_policy():
                self.frage_layer.build()
        if self.freeze_base:
            self.backbone.trainable = False  # with it the tied embedding the head uses
            if getattr(self.head, "base", None) is not None:
                self.head.base.trainable = False  # a flow's base head (MoS, DOC) is "base" too
            if not self.head.trainable_variables:
                raise ValueError(f"freeze_base=True leaves nothing to train: the "
                                 f"{type(self.head).__name__} head has no weights of its own.")
        self.built = True

    @property
    def picks_targets_in_training(self):
        # PDR reads the whole next-word distribution: the head must give all of it.
        return self.past_decode_layer is None and super().picks_targets_in_training

    def _forward(self, tokens, states=None, training=False, targets=None):
        log_probs, new_states = super()._forward(tokens, states, training, targets)
        if training and self.past_decode_layer is not None:
            self.past_decode_layer(log_probs, tokens, training=True)  # adds lambda L_PDR
        if training and self.frage_layer is not None:  # steps D (adversarial), adds its term
            self.frage_layer(self.embedding.embeddings, training=True)
        return log_probs, new_states

    def _add_training_losses(self, out):
        self._add_activation_regularization(out["raw_layer_outputs"][-1],
                                            out["sequence_output"], out.get("padding_mask"))

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
        backbone = self.backbone.get_config()
        config.update({key: backbone[key] for key in BACKBONE_ARGS})
        config.update(vocab_size=self.vocab_size, alpha=self.alpha, beta=self.beta,
                      head=self._head_config(), freeze_base=self.freeze_base)
        if self.past_decode:  # only when on: earlier saved configs stay as they were
            config["past_decode"] = self.past_decode
        if self.frage is not None:  # likewise
            config["frage"] = dict(self.frage)
        return config
