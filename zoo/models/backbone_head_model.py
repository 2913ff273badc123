"""What every zoo language model shares: a backbone (embedding + LSTMs) and an output head."""

import contextlib

import keras
from keras import ops

from tflm import backends
from tflm.language_model import LanguageModel
from tflm.layers.head import head_from_config
from zoo.models import preset_folder
from zoo.models.backbone_call import call_layer
from zoo.models.heads import make_head


class BackboneHeadModel(LanguageModel):
    """A `tflm.LanguageModel` made of `self.backbone` and `self.head`.

        out = backbone(tokens, states);   log P(. | c) = head(out["sequence_output"])

    (a head with `takes_all_layers`, DOC, gets `out["layer_outputs"]`). The backbone returns
    the dict of `zoo.AWDLSTMBackbone` ("sequence_output", "layer_outputs",
    "raw_layer_outputs", "states", "padding_mask") and has `embedding`, `lstms` and
    `layer_sizes()`. A subclass builds both in its constructor (the head with
    `_build_head`) and may add training losses in `_add_training_losses`.
    """

    # ---- presets, the KerasHub way ---------------------------------------------------------
    def save_to_preset(self, preset_dir, vocabulary=None, metadata=None):
        """Write this model as a preset folder in KerasHub's layout (config.json,
        model.weights.h5, tokenizer.json with assets/tokenizer/vocabulary.txt, metadata.json:
        `zoo.models.preset_folder`), whole or not at all. `vocabulary`: the words in id
        order (default: `self.vocabulary`, which `from_preset` sets); `metadata`: more
        entries for metadata.json (`python -m zoo.train --export-preset` records the run's
        provenance there). Returns the folder's path."""
        return preset_folder.save_to_preset(self, preset_dir, vocabulary, metadata)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """The model of `preset`, as KerasHub's `from_preset`:

        - a preset folder (`save_to_preset`, `python -m zoo.train --export-preset`): rebuilt
          with its weights (unless `load_weights=False`), `model.vocabulary` (its words, in
          id order) and `model.preset_metadata` (its metadata.json);
        - a zoo preset name (`zoo.list_presets()`): that preset's model, untrained (the
          preset names its sizes, not weights).

        `kwargs` replace configuration entries (`zoo.AWDLSTM.from_preset("awd_lstm_ptb",
        hidden_dim=200)`). A preset of another family is refused (load it with its class).
        Hub handles (kaggle://, hf://) need their download first."""
        preset_folder.check_preset_name(preset)
        if preset_folder.is_preset_folder(preset):
            return preset_folder.load_preset_folder(preset, cls, load_weights, **kwargs)
        return preset_folder.build_named_preset(cls, preset, **kwargs)

    @contextlib.contextmanager
    def own_dtype_policy(self):
        """Within the block Keras' global dtype policy is this model's (its `dtype=`, e.g.
        "mixed_bfloat16"): the layers a family makes in its constructor and its `build`
        take the model's policy, also when Keras rebuilds a saved model from its config."""
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.dtype_policy)
        try:
            yield
        finally:
            keras.config.set_dtype_policy(previous)

    def build(self, input_shape=None):
        """Build every layer from shapes alone (`trace_shapes`)."""
        if self.built:
            return
        self.trace_shapes()
        self.built = True

    def trace_shapes(self):
        """The forward pass on symbolic `(None, None)` tokens under the model's dtype policy:
        every layer builds from shapes alone and records `(batch, time, ...)`, which
        `summary()` shows, rather than a dummy window's sizes."""
        with self.own_dtype_policy():
            self._forward(keras.KerasTensor((None, None), "int32"), None, training=False)

    @property
    def embedding(self):
        """The backbone's `TiedEmbedding` (shared with a tied head)."""
        return self.backbone.embedding

    @property
    def lstms(self):
        """The backbone's LSTM layers, bottom first."""
        return self.backbone.lstms

    @property
    def head_takes_all_layers(self):
        return bool(getattr(self.head, "takes_all_layers", False))

    def _build_head(self, head, **make_options):
        """The head layer for `head` (a layer, a saved config, a name or a dict), tied to the
        embedding when `self.tie_weights`; `make_options` go to `zoo.models.heads.make_head`."""
        embedding = self.embedding if self.tie_weights else None
        if isinstance(head, keras.layers.Layer):
            return head
        if isinstance(head, dict) and "registered_name" in head:  # from get_config
            return head_from_config(head, embedding)
        return make_head(head, embedding=embedding, vocab_size=self.vocab_size,
                         **make_options)

    def _head_config(self):
        """The head's serialized config without its embedding (the backbone holds it)."""
        head = keras.saving.serialize_keras_object(self.head)
        head["config"] = {k: v for k, v in head["config"].items() if k != "embedding"}
        return head

    def state_sizes(self):
        return self.backbone.layer_sizes()

    @property
    def uses_targets(self):
        return bool(getattr(self.head, "takes_targets", False)) or self.picks_targets_in_training

    @property
    def picks_targets_in_training(self):
        return (backends.current().picks_targets_in_training()
                and not self.head_takes_all_layers
                and bool(getattr(self.head, "picks_targets", False)))

    @property
    def samples_in_training(self):
        return bool(getattr(self.head, "samples_in_training", False))

    def forward_with_state(self, tokens, states=None, training=False, targets=None):
        """Pure forward pass: (log-probabilities, final [(h, c)] per layer). Builds the
        model first when it is not built (so it saves and reloads like a built one).
        `targets` `(batch, time)`: for a head that reads them in training (AdvSoft)."""
        if not self.built:
            self.build()
        return self._forward(tokens, states, training, targets)

    def head_log_probs(self, out, training=False, targets=None):
        """The head's log-probabilities for the backbone's outputs `out` (what
        `model.backbone(tokens, states)` returns): for evaluation procedures that need the
        hidden states too (the cache pointer) without running the backbone twice."""
        mask = out.get("padding_mask")
        head_inputs = out["layer_outputs"] if self.head_takes_all_layers \
            else out["sequence_output"]
        if training and targets is not None and self.picks_targets_in_training:
            picked = self.head.target_log_probs(head_inputs, targets, mask)
            return ops.expand_dims(picked, -1)
        kwargs = {}
        if mask is not None and getattr(self.head, "takes_mask", False):
            kwargs["mask"] = mask
        if targets is not None and training and self.uses_targets:
            kwargs["targets"] = targets
        return call_layer(self.head, head_inputs, training=training, **kwargs)

    def _forward(self, tokens, states=None, training=False, targets=None):
        out = call_layer(self.backbone, tokens, states=states, training=training)
        log_probs = self.head_log_probs(out, training=training, targets=targets)
        if training:
            self._add_training_losses(out)
        return log_probs, out["states"]

    def _add_training_losses(self, out):
        """Losses beyond the NLL, from the backbone's outputs in training (none here)."""
