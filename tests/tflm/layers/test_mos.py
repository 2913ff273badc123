"""Mixture of Softmaxes and Mixture of Contexts against float64 NumPy references."""

import numpy as np
import pytest

import keras
from tflm.layers import MoCLayer, MoSLayer, SoftmaxLayer, TiedEmbedding
from tests.tflm.layers.test_heads_backends import (assert_close_log_probs, assert_log_probs,
                                       check_mixed_precision, check_training_step,
                                       gradients_finite, np_log_softmax, np_logsumexp,
                                       np_softmax, roundtrip_exact)

V, D, G = 60, 8, 12


def weights64(layer):
    f = lambda v: np.asarray(v, np.float64)
    if layer.tied:
        dec, bias = f(layer.embedding.embeddings), f(layer.embedding.output_bias)
    else:
        dec, bias = f(layer.kernel).T, f(layer.bias)
    return f(layer.latent_kernel), f(layer.latent_bias), f(layer.prior_kernel), dec, bias


def ref_components(layer, g):
    wl, bl, wp, dec, bias = weights64(layer)
    g = np.asarray(g, np.float64)
    k = layer.num_experts
    lat = np.tanh(g @ wl + bl).reshape(g.shape[:-1] + (k, -1))        # (B, T, K, L)
    pi = np_softmax(g @ wp)                                             # (B, T, K)
    return lat, pi, dec, bias


def ref_mos(layer, g):
    """log sum_k pi_k softmax(h_k E^T + b), mixed in probability space (float64)."""
    lat, pi, dec, bias = ref_components(layer, g)
    probs = np_softmax(lat @ dec.T + bias)                              # (B, T, K, V)
    return np.log((pi[..., None] * probs).sum(axis=2))


def ref_moc(layer, g):
    lat, pi, dec, bias = ref_components(layer, g)
    return np_log_softmax((pi[..., None] * lat).sum(axis=2) @ dec.T + bias)


def _randomize(layer, rng):
    for w in layer.weights:
        w.assign(rng.normal(scale=0.5, size=w.shape).astype("float32"))


@pytest.fixture
def g():
    return np.random.default_rng(0).normal(size=(3, 4, G)).astype("float32")


@pytest.mark.parametrize("tied", [True, False])
def test_mos_matches_reference(g, tied):
    rng = np.random.default_rng(1)
    layer = (MoSLayer(4, embedding=TiedEmbedding(V, D)) if tied
             else MoSLayer(4, vocab_size=V, latent_dim=6))
    layer(g)
    _randomize(layer, rng)
    out = layer(g)
    assert_log_probs(out, (3, 4, V))
    assert_close_log_probs(out, ref_mos(layer, g))
    assert layer._latent_units == (D if tied else 6)


def test_sequential_mixture_equals_the_batched_one_in_value_and_gradient(g):
    import tensorflow as tf
    rng = np.random.default_rng(11)
    emb = TiedEmbedding(V, D)
    batched = MoSLayer(5, embedding=emb)
    sequential = MoSLayer(5, embedding=emb, mixture="sequential")
    batched(g)
    sequential(g)
    _randomize(batched, rng)
    sequential.set_weights(batched.get_weights())
    assert_close_log_probs(sequential(g), ref_mos(batched, g))
    weights = np.random.default_rng(12).normal(size=(3, 4, V)).astype("float32")
    grads = []
    for layer in (batched, sequential):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(g) * weights)
        grads.append(tape.gradient(loss, layer.trainable_weights))
    for a, b in zip(*grads):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
    assert MoSLayer.from_config(sequential.get_config()).mixture == "sequential"
    with pytest.raises(ValueError, match="mixture must be"):
        MoSLayer(2, vocab_size=V, mixture="loop")


def test_mos_is_not_a_single_softmax(g):
    """The mixture differs from any component's softmax and from the MoC of the same weights."""
    layer = MoSLayer(4, vocab_size=V)
    layer(g)
    _randomize(layer, np.random.default_rng(2))
    moc = MoCLayer(4, vocab_size=V)
    moc(g)
    moc.set_weights(layer.get_weights())
    assert np.abs(np.asarray(layer(g)) - np.asarray(moc(g))).max() > 0.05


def test_single_expert_equals_softmax_on_tanh_latent(g):
    emb = TiedEmbedding(V, D)
    mos = MoSLayer(1, embedding=emb)
    out = np.asarray(mos(g))
    emb.output_bias.assign(np.random.default_rng(3).normal(size=(V,)).astype("float32"))
    out = np.asarray(mos(g))
    h = np.tanh(g @ np.asarray(mos.latent_kernel) + np.asarray(mos.latent_bias))
    expected = np.asarray(SoftmaxLayer(embedding=emb)(h.astype("float32")))
    np.testing.assert_allclose(out, expected, atol=2e-6)


def test_mixture_in_log_space_keeps_tiny_probabilities(g):
    """Components that are confident about different words: log(sum p + eps) would clip at
    log(eps); the log-space mixture keeps exp(-thousands) exactly in range."""
    layer = MoSLayer(3, vocab_size=V)
    layer(g)
    _randomize(layer, np.random.default_rng(4))
    layer.kernel.assign(np.asarray(layer.kernel) * 1000.0)             # logits ~ 1e3
    out = np.asarray(layer(g))
    lat, pi, dec, bias = ref_components(layer, g)
    scale = np.abs(lat @ dec.T + bias).max()
    assert scale > 1000.0 and out.min() < -1000.0                      # exp() underflows even in float64
    # float32 logits of size `scale` carry absolute rounding errors of ~ scale * 1e-7
    assert_log_probs(out, atol=scale * 2e-7)
    expected = np_logsumexp(np.log(pi)[..., None] + np_log_softmax(lat @ dec.T + bias), axis=2)
    assert_close_log_probs(out, expected, rtol=1e-5, atol=scale * 2e-7)


def test_mixture_weights(g):
    layer = MoSLayer(5, vocab_size=V)
    pi = np.asarray(layer.mixture_weights(g))
    assert pi.shape == (3, 4, 5)
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(pi, np_softmax(g @ np.asarray(layer.prior_kernel, np.float64)),
                               atol=1e-6)


def test_latent_dropout_has_one_mask_per_sequence_and_component(g):
    layer = MoSLayer(4, vocab_size=V, latent_dim=16, latent_dropout=0.5, seed=1)
    inference = np.asarray(layer(g))
    np.testing.assert_array_equal(inference, np.asarray(layer(g, training=False)))
    train = np.asarray(layer(g, training=True))
    assert_log_probs(train)
    assert np.abs(train - inference).max() > 1e-3
    lat = np.asarray(layer.latent(g, training=True))                   # (B, T, K, L)
    dropped = lat == 0.0
    assert dropped.any() and not dropped.all()
    assert np.all(dropped == dropped[:, :1])                           # same over time
    assert not np.all(dropped == dropped[:, :, :1])                    # differs across components
    kept = np.tanh(g @ np.asarray(layer.latent_kernel) + np.asarray(layer.latent_bias))
    kept = kept.reshape(lat.shape) / 0.5
    np.testing.assert_allclose(lat[~dropped], kept[~dropped], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_moc_matches_reference(g, tied):
    layer = (MoCLayer(3, embedding=TiedEmbedding(V, D)) if tied
             else MoCLayer(3, vocab_size=V, latent_dim=5))
    layer(g)
    _randomize(layer, np.random.default_rng(5))
    out = layer(g)
    assert_log_probs(out, (3, 4, V))
    assert_close_log_probs(out, ref_moc(layer, g))


def test_rank_moc_bounded_mos_high():
    """Q over many contexts: MoC keeps rank <= L + 2, MoS with the same weights does not."""
    rng = np.random.default_rng(6)
    contexts = rng.normal(size=(1, 300, G)).astype("float32")
    mos = MoSLayer(4, vocab_size=V, latent_dim=D)
    mos(contexts)
    _randomize(mos, rng)
    moc = MoCLayer(4, vocab_size=V, latent_dim=D)
    moc(contexts)
    moc.set_weights(mos.get_weights())

    def rank(q):
        s = np.linalg.svd(np.asarray(q, np.float64)[0], compute_uv=False)
        return int((s > 1e-4 * s[0]).sum())

    assert rank(moc(contexts)) <= D + 2
    assert rank(mos(contexts)) > 3 * (D + 2)


def test_gradients_finite(g):
    layer = MoSLayer(3, embedding=TiedEmbedding(V, D), latent_dropout=0.2)
    layer(g)
    gradients_finite(lambda: layer(g, training=True)[..., :5], layer.trainable_weights)
    moc = MoCLayer(3, vocab_size=V)
    moc(g)
    gradients_finite(lambda: moc(g, training=True)[..., :5], moc.trainable_weights)


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(7)
    ids = rng.integers(0, V, size=(2, 6)).astype("int32")
    emb = TiedEmbedding(V, D)
    inp = keras.Input((6,), dtype="int32")
    h = keras.layers.Dense(G, activation="tanh")(emb(inp))
    out = MoSLayer(4, embedding=emb, latent_dropout=0.3, seed=3, name="mos")(h)
    model = keras.Model(inp, out)
    loaded = roundtrip_exact(model, ids, tmp_path)
    head = loaded.get_layer("mos")
    assert head.tied and head.embedding is loaded.layers[1]            # still shared after load
    cfg = head.get_config()
    assert (cfg["num_experts"], cfg["latent_dropout"], cfg["seed"], cfg["latent_dim"]) == (4, 0.3, 3, None)
    inp2 = keras.Input((6, G))
    m2 = keras.Model(inp2, MoCLayer(2, vocab_size=V, latent_dim=5)(inp2))
    roundtrip_exact(m2, rng.normal(size=(2, 6, G)).astype("float32"), tmp_path)


def test_mixed_precision(g):
    check_mixed_precision(lambda: MoSLayer(3, embedding=TiedEmbedding(V, D)), g)
    check_mixed_precision(lambda: MoCLayer(3, vocab_size=V), g)


@pytest.mark.parametrize("cls", [MoSLayer, MoCLayer])
def test_one_training_step(cls):
    rng = np.random.default_rng(8)
    ids = rng.integers(0, V, size=(4, 5)).astype("int32")
    y = rng.integers(0, V, size=(4, 5))
    emb = TiedEmbedding(V, D)
    inp = keras.Input((5,), dtype="int32")
    h = keras.layers.Dense(G, activation="tanh")(emb(inp))
    model = keras.Model(inp, cls(3, embedding=emb, latent_dropout=0.2, seed=1)(h))
    check_training_step(model, ids, y)


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="num_experts=0"):
        MoSLayer(0, vocab_size=V)
    with pytest.raises(ValueError, match="latent_dim=5"):
        MoSLayer(2, embedding=TiedEmbedding(V, D), latent_dim=5)
    with pytest.raises(ValueError, match="latent_dropout=1.0"):
        MoCLayer(2, vocab_size=V, latent_dropout=1.0)
