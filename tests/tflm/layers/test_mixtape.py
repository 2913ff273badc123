"""Mixtape: sigmoid-tree gates, gate sharing, against a float64 NumPy reference."""

import numpy as np
import pytest

import keras
from tflm.layers import MixtapeLayer, SoftmaxLayer, TiedEmbedding
from tflm.layers.mixtape import sigmoid_tree
from tests.tflm.layers.test_heads_backends import (assert_close_log_probs, assert_log_probs,
                                       check_mixed_precision, check_training_step,
                                       gradients_finite, np_log_softmax, roundtrip_exact)

V, D, G, D2 = 50, 8, 12, 5


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_tree(gam):
    """Leaf weights of a complete binary sigmoid tree, recursively (heap order of nodes)."""
    k = gam.shape[-1] + 1

    def leaves(node, size):
        if size == 1:
            return [np.ones(gam.shape[:-1])]
        g = gam[..., node]
        left = leaves(2 * node + 1, size // 2)
        right = leaves(2 * node + 2, size // 2)
        return [g * p for p in left] + [(1 - g) * p for p in right]

    return np.stack(leaves(0, k), axis=-1)


def ref_mixtape(layer, g):
    f = lambda v: np.asarray(v, np.float64)
    g = f(g)
    k, n, s = layer.num_components, layer.num_components - 1, layer._num_gated
    h = np.tanh(g @ f(layer.latent_kernel) + f(layer.latent_bias)).reshape(g.shape[:-1] + (k, -1))
    if layer.tied:
        dec, bias = f(layer.embedding.embeddings), f(layer.embedding.output_bias)
    else:
        dec, bias = f(layer.kernel).T, f(layer.bias)
    comp = np.einsum("btkl,wl->btwk", h, dec)                        # h_k^T e_w
    if k == 1:
        return np_log_softmax(comp[..., 0] + bias)
    rank = (np.arange(layer.vocab_size) if layer.token_frequency_rank is None
            else np.asarray(layer.token_frequency_rank))
    row = np.where(rank < s, rank, s)                                # shared row S
    vw = f(layer.gate_vectors)[row]                                  # (V, d2)
    bw = f(layer.gate_bias)[row]                                     # (V, n)
    ctx = np.tanh(g @ f(layer.gate_context_kernel)).reshape(g.shape[:-1] + (n, -1))
    lin = g @ f(layer.gate_linear_kernel)                            # (B, T, n)
    a = np.einsum("btnj,wj->btwn", ctx, vw) + lin[:, :, None, :] + bw
    gam = sigmoid(a)
    if k == 4:   # the thesis' explicit K = 4 tree
        g1, g2, g3 = gam[..., 0], gam[..., 1], gam[..., 2]
        pi = np.stack([g1 * g2, g1 * (1 - g2), (1 - g1) * g3, (1 - g1) * (1 - g3)], -1)
    else:
        pi = np_tree(gam)
    return np_log_softmax((pi * comp).sum(-1) + bias)


def _randomize(layer, rng, scale=0.5):
    for w in layer.weights:
        w.assign(rng.normal(scale=scale, size=w.shape).astype("float32"))


@pytest.fixture
def g():
    return np.random.default_rng(0).normal(size=(3, 4, G)).astype("float32")


def test_sigmoid_tree_k4_and_k8():
    gam = np.random.default_rng(1).uniform(size=(5, 3))
    pi = np.asarray(sigmoid_tree(gam.astype("float32")))
    g1, g2, g3 = gam.T
    expected = np.stack([g1 * g2, g1 * (1 - g2), (1 - g1) * g3, (1 - g1) * (1 - g3)], -1)
    np.testing.assert_allclose(pi, expected, rtol=1e-6)
    gam8 = np.random.default_rng(2).uniform(size=(5, 7))
    pi8 = np.asarray(sigmoid_tree(gam8.astype("float32")))
    np.testing.assert_allclose(pi8, np_tree(gam8), rtol=1e-6)
    np.testing.assert_allclose(pi8.sum(-1), 1.0, atol=1e-6)
    # along another axis (the layer uses the (B, T, K-1, V) gate layout)
    on_axis = np.asarray(sigmoid_tree(np.moveaxis(gam8, -1, 0).astype("float32"), axis=0))
    np.testing.assert_allclose(np.moveaxis(on_axis, 0, -1), np_tree(gam8), rtol=1e-6)


@pytest.mark.parametrize("config", [
    dict(num_components=4, tied=True),
    dict(num_components=4, tied=True, shared_gate_rank=15),
    dict(num_components=4, tied=False, shared_gate_rank=15, permuted=True),
    dict(num_components=8, tied=False, shared_gate_rank=49, permuted=True),
    dict(num_components=2, tied=True, shared_gate_rank=200),
])
def test_matches_reference(g, config):
    rng = np.random.default_rng(3)
    config = dict(config)
    tied, permuted = config.pop("tied"), config.pop("permuted", False)
    rank = rng.permutation(V) if permuted else None
    kw = dict(embedding=TiedEmbedding(V, D)) if tied else dict(vocab_size=V, latent_dim=6)
    layer = MixtapeLayer(gate_dim=D2, token_frequency_rank=rank, **config, **kw)
    layer(g)
    _randomize(layer, rng)
    out = layer(g)
    assert_log_probs(out, (3, 4, V))
    assert_close_log_probs(out, ref_mixtape(layer, g))


def test_shared_gate_tokens_depend_on_context_only(g):
    rank = np.random.default_rng(4).permutation(V)
    layer = MixtapeLayer(4, gate_dim=D2, shared_gate_rank=10, vocab_size=V,
                         token_frequency_rank=rank)
    layer(g)
    _randomize(layer, np.random.default_rng(5))
    assert layer.gate_vectors.shape == (11, D2)          # 10 own rows + 1 shared
    own, shared = layer.mixture_weights(g)
    assert tuple(own.shape) == (3, 4, 10, 4) and tuple(shared.shape) == (3, 4, 4)
    np.testing.assert_allclose(np.asarray(shared).sum(-1), 1.0, atol=1e-6)
    own = np.asarray(own)
    assert np.abs(own - own[:, :, :1]).max() > 1e-3      # frequent tokens: own gates differ
    # rare tokens: logit_w = (sum_k pi_k h_k)^T e_w + b_w with the shared, context-only pi,
    # so differences of their log-probs are linear in (e_w1 - e_w2)
    out = np.asarray(layer(g), np.float64)
    h = np.asarray(layer.components(g), np.float64)                 # (B, T, K, L)
    mixed = (np.asarray(shared, np.float64)[..., None] * h).sum(2)    # (B, T, L)
    w = np.asarray(layer.kernel, np.float64)
    b = np.asarray(layer.bias, np.float64)
    rare = np.flatnonzero(rank >= 10)
    r1, r2 = rare[:5], rare[5:10]
    expected = mixed @ (w[:, r1] - w[:, r2]) + (b[r1] - b[r2])
    np.testing.assert_allclose(out[..., r1] - out[..., r2], expected, atol=2e-5)


def test_single_component_is_softmax_on_tanh_latent(g):
    emb = TiedEmbedding(V, D)
    layer = MixtapeLayer(1, embedding=emb)
    layer(g)
    emb.output_bias.assign(np.random.default_rng(6).normal(size=(V,)).astype("float32"))
    h = np.tanh(g @ np.asarray(layer.latent_kernel) + np.asarray(layer.latent_bias))
    np.testing.assert_allclose(np.asarray(layer(g)),
                               np.asarray(SoftmaxLayer(embedding=emb)(h.astype("float32"))),
                               atol=2e-6)


def test_high_rank():
    rng = np.random.default_rng(7)
    contexts = rng.normal(size=(1, 300, G)).astype("float32")
    layer = MixtapeLayer(4, gate_dim=D2, vocab_size=V, latent_dim=D)
    layer(contexts)
    _randomize(layer, rng, scale=1.0)
    s = np.linalg.svd(np.asarray(layer(contexts), np.float64)[0], compute_uv=False)
    assert int((s > 1e-4 * s[0]).sum()) > 3 * (D + 2)


def test_gradients_finite(g):
    layer = MixtapeLayer(4, gate_dim=D2, shared_gate_rank=20, embedding=TiedEmbedding(V, D),
                         latent_dropout=0.2)
    layer(g)
    gradients_finite(lambda: layer(g, training=True)[..., :7], layer.trainable_weights)


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(8)
    ids = rng.integers(0, V, size=(2, 6)).astype("int32")
    emb = TiedEmbedding(V, D)
    inp = keras.Input((6,), dtype="int32")
    h = keras.layers.Dense(G, activation="tanh")(emb(inp))
    rank = rng.permutation(V)
    out = MixtapeLayer(4, gate_dim=D2, shared_gate_rank=12, embedding=emb,
                       token_frequency_rank=rank, latent_dropout=0.1, seed=2, name="mt")(h)
    model = keras.Model(inp, out)
    for w in model.get_layer("mt").weights:
        if "gate" in w.path:
            w.assign(rng.normal(size=w.shape).astype("float32"))
    loaded = roundtrip_exact(model, ids, tmp_path)
    cfg = loaded.get_layer("mt").get_config()
    assert cfg["token_frequency_rank"] == [int(r) for r in rank]
    assert (cfg["num_components"], cfg["gate_dim"], cfg["shared_gate_rank"]) == (4, D2, 12)


def test_mixed_precision(g):
    check_mixed_precision(lambda: MixtapeLayer(4, gate_dim=D2, shared_gate_rank=20,
                                               embedding=TiedEmbedding(V, D)), g)


def test_one_training_step():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(4, 5, G)).astype("float32")
    y = rng.integers(0, V, size=(4, 5))
    inp = keras.Input((5, G))
    head = MixtapeLayer(4, gate_dim=D2, shared_gate_rank=20, vocab_size=V,
                        token_frequency_rank=rng.permutation(V))
    check_training_step(keras.Model(inp, head(inp)), x, y)


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="num_components=3"):
        MixtapeLayer(3, vocab_size=V)
    with pytest.raises(ValueError, match="gate_dim=0"):
        MixtapeLayer(4, gate_dim=0, vocab_size=V)
    with pytest.raises(ValueError, match="permutation"):
        MixtapeLayer(4, vocab_size=V, shared_gate_rank=5, token_frequency_rank=[0] * V)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        MixtapeLayer(4, vocab_size=V, token_frequency_rank=[0, 1, 2])
