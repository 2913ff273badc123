"""`zoo.AWDLSTMBackbone`: every layer's hidden states, and the task built on it."""

import numpy as np
import pytest

from tflm.data import PAD_ID
from zoo import AWDLSTM, AWDLSTMBackbone


def _tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 20, size=shape).astype("int32")


def test_outputs_are_every_layers_hidden_states():
    backbone = AWDLSTMBackbone(20, embed_dim=6, hidden_dim=10, num_layers=3, seed=0)
    x = _tokens((2, 7))
    out = backbone(x, training=False)
    assert "padding_mask" not in out
    assert [tuple(o.shape) for o in out["raw_layer_outputs"]] == [(2, 7, 10), (2, 7, 10),
                                                                  (2, 7, 6)]
    assert backbone.layer_sizes() == [10, 10, 6]
    for dropped, raw in zip(out["layer_outputs"], out["raw_layer_outputs"]):
        np.testing.assert_array_equal(np.asarray(dropped), np.asarray(raw))  # no dropout
    np.testing.assert_array_equal(np.asarray(out["sequence_output"]),
                                  np.asarray(out["layer_outputs"][-1]))
    for (h, c), raw in zip(out["states"], out["raw_layer_outputs"]):
        np.testing.assert_allclose(np.asarray(h), np.asarray(raw)[:, -1], atol=1e-6)
    # Carrying the states: two windows equal one.
    first = backbone(x[:, :4], training=False)
    second = backbone(x[:, 4:], states=first["states"], training=False)
    np.testing.assert_allclose(np.asarray(second["sequence_output"]),
                               np.asarray(out["sequence_output"])[:, 4:], atol=1e-5)
    # Training: dropout applies between raw and dropped outputs.
    train = backbone(x, training=True)
    assert not np.allclose(np.asarray(train["layer_outputs"][0]),
                           np.asarray(train["raw_layer_outputs"][0]))


def test_padding_mask_is_returned_and_holds_the_state():
    backbone = AWDLSTMBackbone(20, embed_dim=6, hidden_dim=8, num_layers=2, seed=0)
    x = _tokens((2, 6))
    padded = np.concatenate([x, np.full((2, 2), PAD_ID, "int32")], axis=1)
    out = backbone(padded, training=False)
    np.testing.assert_array_equal(np.asarray(out["padding_mask"]),
                                  np.arange(8)[None].repeat(2, 0) < 6)
    plain = backbone(x, training=False)
    for (h, c), (h0, c0) in zip(out["states"], plain["states"]):
        np.testing.assert_allclose(np.asarray(h), np.asarray(h0), atol=1e-6)
        np.testing.assert_allclose(np.asarray(c), np.asarray(c0), atol=1e-6)


def test_task_is_backbone_plus_head_and_rejects_bad_settings():
    model = AWDLSTM(20, embed_dim=6, hidden_dim=8, num_layers=2, seed=0)
    model.build()
    assert model.embedding is model.backbone.embedding is model.head.embedding
    assert model.lstms == model.backbone.lstms
    assert model.state_sizes() == [8, 6]
    x = _tokens((2, 5))
    out = model.backbone(x)
    head = np.asarray(model.head(out["sequence_output"]))
    np.testing.assert_allclose(np.asarray(model.forward_with_state(x)[0]), head, atol=1e-6)
    clone = AWDLSTMBackbone.from_config(model.backbone.get_config())
    assert clone.get_config() == model.backbone.get_config()
    with pytest.raises(ValueError, match="num_layers"):
        AWDLSTMBackbone(20, num_layers=0)
    with pytest.raises(ValueError, match="use_cudnn"):
        AWDLSTMBackbone(20, use_cudnn="sometimes")


@pytest.mark.parametrize("kind", ["awd", "zaremba"])
def test_build_creates_every_weight_from_shapes_without_a_forward_pass(kind, monkeypatch):
    """`build()` makes the weights a first forward pass would, in the same order (so the
    same initial values from the same seed), without running one: JAX ran the LSTM stack
    op by op for that, 3.7 s of the PTB model's build."""
    import keras
    from zoo.models.zaremba.zaremba_backbone import ZarembaBackbone

    def make():
        keras.utils.set_random_seed(7)
        if kind == "awd":
            return AWDLSTMBackbone(20, embed_dim=6, hidden_dim=10, num_layers=3, seed=0,
                                   lstm_biases=2, init="pytorch", name="backbone")
        return ZarembaBackbone(20, hidden_dim=8, num_layers=2, name="backbone")

    called = make()
    called(_tokens((2, 3)))  # built by its first call
    built = make()
    monkeypatch.setattr(type(built), "call", lambda *a, **k: pytest.fail("a forward pass"))
    built.build()
    assert [v.path for v in built.weights] == [v.path for v in called.weights]
    for a, b in zip(built.weights, called.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
