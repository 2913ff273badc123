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
    from zoo.zaremba_backbone import ZarembaBackbone

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


def _recording_draws(monkeypatch):
    """Wrap the backbone's `draw_uniforms`: every draw's uniforms, by layer name."""
    from zoo import backbone as backbone_module
    drawn, real = [], backbone_module.draw_uniforms

    def record(requests, seed):
        out = real(requests, seed)
        drawn.append(out)
        return out
    monkeypatch.setattr(backbone_module, "draw_uniforms", record)
    return drawn


def test_training_window_draws_every_mask_at_once_and_applies_each(monkeypatch):
    """One `keras.random.uniform` call per training window gives every mask (a JAX train
    step then holds one threefry loop, not eight); each layer applies its own part."""
    import keras
    from keras import ops
    from tflm.layers.dropout import keep_mask

    backbone = AWDLSTMBackbone(20, embed_dim=6, hidden_dim=10, num_layers=3, dropout=0.4,
                               dropout_h=0.3, dropout_i=0.5, dropout_e=0.2,
                               weight_dropout=0.5, seed=0)
    x = _tokens((4, 7))
    backbone(x, training=False)
    shapes, real = [], keras.random.uniform
    monkeypatch.setattr(keras.random, "uniform",
                        lambda shape, *a, **k: shapes.append(tuple(shape)) or real(shape, *a, **k))
    drawn = _recording_draws(monkeypatch)
    backbone(x, training=False)
    assert shapes == [] and drawn == []
    out = backbone(x, training=True)
    sizes = 20 + 4 * 6 + 10 * 40 * 2 + 6 * 24 + 4 * 10 * 2 + 4 * 6
    assert shapes == [(sizes,)]
    u_e, u_i, u_w0, u_h0, u_w1, u_h1, u_w2, u_o = [np.asarray(u) for u in drawn[0]]
    assert u_e.shape == (20, 1) and u_i.shape == (4, 1, 6) and u_w1.shape == (10, 40)
    assert u_h1.shape == (4, 1, 10) and u_o.shape == (4, 1, 6) and u_w2.shape == (6, 24)
    # the locked dropouts: raw output times its (batch, 1, width) mask
    raw = [np.asarray(r) for r in out["raw_layer_outputs"]]
    for dropped, r, u, rate in zip(out["layer_outputs"], raw, (u_h0, u_h1, u_o),
                                   (0.3, 0.3, 0.4)):
        np.testing.assert_allclose(np.asarray(dropped),
                                   r * np.asarray(keep_mask(u, rate, "float32")), atol=1e-6)
    # the embedding's row mask and the input dropout, then the first LSTM with U dropped
    embedded = np.asarray(backbone.embedding(x)) * np.asarray(
        keep_mask(u_e, 0.2, "float32"))[x] * np.asarray(keep_mask(u_i, 0.5, "float32"))
    lstm = backbone.lstms[0]
    kernel = lstm.cell.recurrent_kernel
    undropped = np.asarray(kernel)
    kernel.assign(undropped * np.asarray(keep_mask(u_w0, 0.5, "float32")))
    try:
        expected = np.asarray(lstm(ops.convert_to_tensor(embedded), training=False)[0])
    finally:
        kernel.assign(undropped)
    np.testing.assert_allclose(raw[0], expected, atol=1e-5)
    # a fresh draw every window
    backbone(x, training=True)
    assert not np.allclose(np.asarray(drawn[1][0]), u_e)


def test_one_draw_masks_keep_their_rates_independently(monkeypatch):
    """The parts of the one draw are independent uniforms: each mask keeps 1 - p of its
    entries, and two parts of equal size are uncorrelated (sd of a keep rate at most 0.005
    for 4,000 entries; of the correlation of 16,384 pairs 0.008)."""
    backbone = AWDLSTMBackbone(4000, embed_dim=64, hidden_dim=64, num_layers=2,
                               dropout=0.4, dropout_h=0.25, dropout_i=0.4, dropout_e=0.1,
                               weight_dropout=0.5, seed=3)
    drawn = _recording_draws(monkeypatch)
    backbone(_tokens((256, 2)), training=True)
    u_e, u_i, u_w0, u_h0, u_w1, u_o = [np.asarray(u).ravel() for u in drawn[0]]
    for u, rate in ((u_e, 0.1), (u_i, 0.4), (u_w0, 0.5), (u_h0, 0.25), (u_w1, 0.5),
                    (u_o, 0.4)):
        assert 0.0 <= u.min() and u.max() < 1.0
        assert abs(np.mean(u < 1.0 - rate) - (1.0 - rate)) < 0.02
    assert abs(np.corrcoef(u_w0, u_w1)[0, 1]) < 0.04
    assert abs(np.corrcoef(u_i, u_h0)[0, 1]) < 0.04


def test_draw_uniforms_cuts_one_draw_and_keeps_this_replicas_streams(monkeypatch):
    """Under a strategy (replica 1 of 2 here), a per-stream part is this replica's rows of
    the global batch's uniforms, a shared part the same uniforms on every replica: exactly
    the elements of the one flat draw."""
    import keras
    from tflm import backends
    from tflm.layers.dropout import draw_uniforms

    monkeypatch.setattr(type(backends.current()), "global_batch_block", lambda self: (1, 2))
    per_stream, shared = draw_uniforms([((2, 1, 3), True), ((4, 5), False)],
                                       keras.random.SeedGenerator(7))
    flat = np.asarray(keras.random.uniform((2 * 2 * 3 + 20,),
                                           seed=keras.random.SeedGenerator(7)))
    np.testing.assert_array_equal(np.asarray(per_stream), flat[:12].reshape(4, 1, 3)[2:])
    np.testing.assert_array_equal(np.asarray(shared), flat[12:].reshape(4, 5))
