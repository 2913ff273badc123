"""Mogrifier LSTM language model (Melis et al. 2020): the Mogrifier backbone + an output head."""

import keras

from zoo.models.backbone_head_model import BackboneHeadModel
from zoo.models.mogrifier.mogrifier_backbone import MogrifierBackbone

# Constructor arguments that belong to the backbone (the rest configure the task).
BACKBONE_ARGS = ("embed_dim", "hidden_dim", "num_layers", "rounds", "rank", "input_dropout",
                 "inter_layer_dropout", "state_dropout", "output_dropout",
                 "shared_mask_dropout", "skip_connections", "cap_input_gate", "forget_bias",
                 "init", "seed", "unroll")
# Heads that map the backbone's output to the embedding's size themselves (their latent).
_PROJECTING_HEADS = ("mos", "moc")


def _head_projects(head):
    if isinstance(head, keras.layers.Layer):
        return hasattr(head, "num_experts")
    if isinstance(head, dict):
        if "registered_name" in head:  # a saved head
            return "num_experts" in head.get("config", {})
        head = head.get("type", "softmax")
    return str(head or "softmax").lower() in _PROJECTING_HEADS


@keras.saving.register_keras_serializable(package="zoo")
class MogrifierLM(BackboneHeadModel):
    """The Mogrifier LSTM language model of deepmind/lamb: `MogrifierBackbone` + an output
    head, trained with lamb's objective.

        g, states = MogrifierBackbone(w);   log P(. | c) = head(g)
        loss = sum_t mean_b NLL            (loss_reduction="sum_over_time", lamb's xe_loss)

    The head is tied to the embedding by default (lamb's share_input_and_output_embeddings,
    the embedding's output bias as lamb's softmax bias). A tied head whose input must have
    the embedding's size gets the backbone's down-projection P when hidden_dim differs from
    embed_dim (`output_projection=None`: automatic; a MoS or MoC head projects by itself,
    {"type": "mos", "num_experts": 2, "latent_dropout": p} is lamb's mos_num_components=2
    with its downprojected dropout).

    Args:
        vocab_size: V.
        embed_dim, hidden_dim, num_layers, rounds, rank, input_dropout, inter_layer_dropout,
            state_dropout, output_dropout, shared_mask_dropout, skip_connections,
            cap_input_gate, forget_bias, init, seed, unroll: the backbone's
            (`zoo.MogrifierBackbone`; defaults 912, 912, 2, 5, 84, no dropout, False, True,
            True, 1.0, "lamb", None, False: the shape of the paper's 24M PTB model, without
            its dropouts).
        tie_weights: share the embedding with the head. Default True.
        output_projection: None (default, automatic), True or False: the down-projection P.
        head: a head name, a dict {"type": name, ...} or a head layer. Default "softmax".
        bptt, clip_norm, weight_decay, scale_by_window, carry_state, flooding_level,
            loss_reduction: see `tflm.LanguageModel`; the defaults here are lamb's (70, 10.0,
            0, False, True, None, "sum_over_time"); lamb's l2_penalty is `weight_decay`
            (tf.nn.l2_loss = sum w^2 / 2 has gradient w).

    Input: int tokens `(batch, time)`. Output: log-probabilities `(batch, time, V)`.

    Reference: Melis, Kočiský & Blunsom 2020, "Mogrifier LSTM" (ICLR; arXiv 1909.01792);
    deepmind/lamb (lamb/lm.py, lamb/cell.py, lamb/tiled_lstm.py,
    experiment/mogrifier/config/).
    """

    preset_kind = "mogrifier"  # a preset's model.kind for this family (from_preset)

    def __init__(self, vocab_size, embed_dim=912, hidden_dim=912, num_layers=2, rounds=5,
                 rank=84, input_dropout=0.0, inter_layer_dropout=0.0, state_dropout=0.0,
                 output_dropout=0.0, shared_mask_dropout=False, skip_connections=True,
                 cap_input_gate=True, forget_bias=1.0, init="lamb", seed=None, unroll=False,
                 tie_weights=True, output_projection=None, head="softmax", bptt=70,
                 clip_norm=10.0, scale_by_window=False, loss_reduction="sum_over_time",
                 **kwargs):
        super().__init__(bptt=bptt, clip_norm=clip_norm, scale_by_window=scale_by_window,
                         loss_reduction=loss_reduction, **kwargs)
        self.tie_weights = bool(tie_weights)
        if output_projection is None:
            output_projection = (self.tie_weights and int(hidden_dim) != int(embed_dim)
                                 and not _head_projects(head))
        with self.own_dtype_policy():
            self.backbone = MogrifierBackbone(
                vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim, num_layers=num_layers,
                rounds=rounds, rank=rank, input_dropout=input_dropout,
                inter_layer_dropout=inter_layer_dropout, state_dropout=state_dropout,
                output_dropout=output_dropout, shared_mask_dropout=shared_mask_dropout,
                skip_connections=skip_connections, cap_input_gate=cap_input_gate,
                forget_bias=forget_bias, output_dim=int(embed_dim) if output_projection
                else None, init=init, seed=seed, unroll=unroll, name="backbone")
            self.vocab_size = self.backbone.vocab_size
            self.head = self._build_head(head)
        self.freeze_base = False

    def get_config(self):
        config = super().get_config()
        backbone = self.backbone.get_config()
        config.update({key: backbone[key] for key in BACKBONE_ARGS})
        config.update(vocab_size=self.vocab_size, tie_weights=self.tie_weights,
                      output_projection=self.backbone.output_dim is not None,
                      head=self._head_config())
        return config
