"""Zaremba et al. (2014) LSTM language model with any output head (Zhang 2018's study)."""

import keras

from zoo.models.backbone_head_model import BackboneHeadModel
from zoo.models.zaremba.zaremba_backbone import ZarembaBackbone, uniform_initializer

BACKBONE_ARGS = ("hidden_dim", "num_layers", "dropout", "init_scale", "use_cudnn", "seed")


@keras.saving.register_keras_serializable(package="zoo")
class ZarembaLSTM(BackboneHeadModel):
    """The PTB tutorial's LSTM language model: `ZarembaBackbone` + an output head, trained
    with the tutorial's objective.

        x_L, states = ZarembaBackbone(w);   log P(. | c) = head(x_L)
        loss = sum_t mean_b NLL          (loss_reduction="sum_over_time", the default)

    Every head weight (the softmax's W and b; MoS' latent, prior and decoder; a factorized
    decoder's W1, W2) is drawn from U(-init_scale, init_scale) like the backbone's, as the
    tutorial's variable-scope initializer draws every variable without its own initializer.
    Untied by default (the tutorial's `softmax_w`, `softmax_b`); `tie_weights=True` makes
    the head use the embedding as its output matrix (Zhang 2018 §7.2), with an output bias
    only when `output_bias` (the printed 17.503M of Table 7.2 has none).

    Args:
        vocab_size: V.
        hidden_dim, num_layers, dropout, init_scale, use_cudnn, seed: the backbone's
            (`zoo.ZarembaBackbone`; defaults 200, 2, 0.0, 0.1, "auto", None: the small
            configuration).
        tie_weights: share the embedding with the head. Default False.
        output_bias: the tied projection's output bias (untied heads always have one).
            Default True.
        head: a head name, a dict {"type": name, ...} or a head layer; e.g.
            {"type": "mos", "num_experts": 15, "prior_bias": true} for Zhang's MoS, with
            "output_rank": 256 for the factorized decoder. Default "softmax".
        bptt, clip_norm, weight_decay, scale_by_window, carry_state, flooding_level,
            loss_reduction: see `tflm.LanguageModel`; the defaults here are the tutorial's
            (20, 5.0, 0, False, True, None, "sum_over_time").

    Input: int tokens `(batch, time)`. Output: log-probabilities `(batch, time, V)`.

    Reference: Zaremba, Sutskever & Vinyals 2014; tensorflow/models
    tutorials/rnn/ptb/ptb_word_lm.py; Zhang 2018 (MSc thesis), §5-7 and Table A.1.
    """

    preset_kind = "zaremba"  # a preset's model.kind for this family (from_preset)

    def __init__(self, vocab_size, hidden_dim=200, num_layers=2, dropout=0.0, init_scale=0.1,
                 tie_weights=False, output_bias=True, head="softmax", use_cudnn="auto",
                 seed=None, bptt=20, clip_norm=5.0, scale_by_window=False,
                 loss_reduction="sum_over_time", **kwargs):
        super().__init__(bptt=bptt, clip_norm=clip_norm, scale_by_window=scale_by_window,
                         loss_reduction=loss_reduction, **kwargs)
        self.tie_weights = bool(tie_weights)
        self.output_bias = bool(output_bias)
        with self.own_dtype_policy():
            self.backbone = ZarembaBackbone(
                vocab_size, hidden_dim=hidden_dim, num_layers=num_layers, dropout=dropout,
                init_scale=init_scale, tied_output_bias=self.tie_weights and self.output_bias,
                use_cudnn=use_cudnn, seed=seed, name="backbone")
            self.vocab_size = self.backbone.vocab_size
            # MoS on these baselines (Zhang 2018 §6.3): the latent size is the hidden size
            # (the heads' default), as the printed parameter counts imply.
            self.head = self._build_head(head)
        self.freeze_base = False

    def build(self, input_shape=None):
        if self.built:
            return
        self.trace_shapes()
        for variable in self.head.weights:
            uniform = uniform_initializer(self.backbone.init_scale)
            variable.assign(uniform(variable.shape, variable.dtype))
        self.built = True

    def get_config(self):
        config = super().get_config()
        backbone = self.backbone.get_config()
        config.update({key: backbone[key] for key in BACKBONE_ARGS})
        config.update(vocab_size=self.vocab_size, tie_weights=self.tie_weights,
                      output_bias=self.output_bias, head=self._head_config())
        return config
