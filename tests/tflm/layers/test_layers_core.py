"""TiedEmbedding, SoftmaxLayer, LockedDropout, EmbeddingDropout against NumPy references."""

import numpy as np
import pytest
import keras
from scipy.special import log_softmax

from tflm.layers import (EmbeddingDropout, LockedDropout, SoftmaxLayer, StreamDropout,
                         TiedEmbedding)


def _roundtrip(model, x, tmp_path):
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
    return loaded


def test_tied_embedding_lookup_and_reverse_match_numpy():
    rng = np.random.default_rng(0)
    emb = TiedEmbedding(30, 6)
    ids = rng.integers(0, 30, size=(3, 4))
    out = np.asarray(emb(ids))
    E = np.asarray(emb.embeddings)
    np.testing.assert_allclose(out, E[ids], rtol=0, atol=0)
    emb.output_bias.assign(rng.normal(size=30).astype("float32"))
    h = rng.normal(size=(3, 4, 6)).astype("float32")
    expected = h.astype(np.float64) @ E.T.astype(np.float64) + np.asarray(emb.output_bias)
    np.testing.assert_allclose(np.asarray(emb.reverse(h)), expected, rtol=1e-5, atol=1e-5)


def test_tied_embedding_default_init_is_uniform_0_1():
    emb = TiedEmbedding(2000, 20)
    emb.build()
    E = np.asarray(emb.embeddings)
    assert E.min() >= -0.1 and E.max() <= 0.1 and E.std() > 0.05


@pytest.mark.parametrize("tied", [True, False])
def test_softmax_layer_matches_numpy_and_normalizes(tied):
    rng = np.random.default_rng(1)
    emb = TiedEmbedding(40, 8) if tied else None
    head = SoftmaxLayer(embedding=emb, vocab_size=None if tied else 40)
    h = rng.normal(size=(2, 5, 8)).astype("float32")
    out = np.asarray(head(h))
    if tied:
        emb.output_bias.assign(rng.normal(size=40).astype("float32"))
        out = np.asarray(head(h))
        logits = h.astype(np.float64) @ np.asarray(emb.embeddings, np.float64).T \
            + np.asarray(emb.output_bias, np.float64)
    else:
        logits = h.astype(np.float64) @ np.asarray(head.kernel, np.float64) \
            + np.asarray(head.bias, np.float64)
    np.testing.assert_allclose(out, log_softmax(logits, axis=-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.exp(out).sum(-1), 1.0, atol=1e-5)
    assert out.dtype == np.float32


def test_softmax_layer_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="vocab_size"):
        SoftmaxLayer()
    with pytest.raises(TypeError, match="TiedEmbedding"):
        SoftmaxLayer(embedding=keras.layers.Embedding(10, 4))
    with pytest.raises(ValueError, match="disagrees"):
        SoftmaxLayer(embedding=TiedEmbedding(10, 4), vocab_size=11)
    head = SoftmaxLayer(embedding=TiedEmbedding(10, 4))
    with pytest.raises(ValueError, match="embed_dim=4"):
        head(np.zeros((1, 2, 5), "float32"))


def test_softmax_mixed_precision_keeps_float32():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        emb = TiedEmbedding(20, 4)
        head = SoftmaxLayer(embedding=emb)
        x = emb(np.zeros((2, 3), "int32"))
        out = head(x)
        assert str(out.dtype) == "float32" or "float32" in str(out.dtype)
        assert all("float32" in str(v.dtype) for v in emb.weights)
        np.testing.assert_allclose(np.exp(np.asarray(out)).sum(-1), 1.0, atol=1e-5)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def test_locked_dropout_mask_shared_over_time_and_scaled():
    layer = LockedDropout(0.5, seed=3)
    x = np.ones((4, 7, 6), "float32")
    y = np.asarray(layer(x, training=True))
    assert set(np.unique(y)) <= {0.0, 2.0}
    np.testing.assert_array_equal(y, np.repeat(y[:, :1], 7, axis=1))
    y2 = np.asarray(layer(x, training=True))
    assert not np.array_equal(y, y2), "a new mask must be drawn at every call"
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    big = np.asarray(LockedDropout(0.3, seed=1)(np.ones((200, 2, 200), "float32"), training=True))
    assert abs(big.mean() - 1.0) < 0.02


def test_stream_dropout_draws_per_element_and_time_step():
    layer = StreamDropout(0.3, seed=3)
    x = np.ones((200, 5, 200), "float32")
    y = np.asarray(layer(x, training=True))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.7)}
    kept = y > 0
    assert abs(kept.mean() - 0.7) < 0.01 and abs(y.mean() - 1.0) < 0.02
    # independent over time: masks of consecutive steps agree as two Bernoulli(0.7) draws
    agree = (kept[:, 1:] == kept[:, :-1]).mean()
    assert abs(agree - (0.7 ** 2 + 0.3 ** 2)) < 0.01
    assert not np.array_equal(y, np.asarray(layer(x, training=True)))
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    assert StreamDropout.from_config(layer.get_config()).rate == 0.3
    with pytest.raises(ValueError, match="rate=1.0"):
        StreamDropout(1.0)


def test_locked_dropout_rejects_bad_rate():
    with pytest.raises(ValueError, match="rate=1.0"):
        LockedDropout(1.0)


def test_embedding_dropout_drops_whole_words():
    rng = np.random.default_rng(0)
    layer = EmbeddingDropout(vocab_size=10, rate=0.5, seed=2)
    ids = rng.integers(0, 10, size=(3, 50))
    emb = rng.normal(size=(3, 50, 4)).astype("float32") + 5.0
    out = np.asarray(layer(ids, emb, training=True))
    ratio = out / emb
    for w in range(10):
        vals = np.unique(np.round(ratio[ids == w], 5))
        assert len(vals) <= 1 and (len(vals) == 0 or vals[0] in (0.0, 2.0)), (w, vals)
    np.testing.assert_array_equal(np.asarray(layer(ids, emb, training=False)), emb)


def test_core_layers_keras_roundtrip(tmp_path):
    emb = TiedEmbedding(25, 6, name="emb")
    ids = keras.Input((None,), dtype="int32")
    h = emb(ids)
    h = LockedDropout(0.2)(h)
    out = SoftmaxLayer(embedding=emb)(h)
    model = keras.Model(ids, out)
    x = np.random.default_rng(0).integers(0, 25, size=(2, 5))
    loaded = _roundtrip(model, x, tmp_path)
    assert len(loaded.weights) == len(model.weights)
