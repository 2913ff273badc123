"""tflm.activations (PL~, GSS, SigSoftmax) and the GSS layers against float64 NumPy references."""

import numpy as np
import pytest

import keras
from keras import ops
from tflm import activations
from tflm.layers import GSSActivation, GSSHead, SigSoftmax, TiedEmbedding
from tests.tflm.layers.test_heads_backends import (assert_close_log_probs, assert_log_probs,
                                       check_mixed_precision, check_training_step,
                                       gradients_finite, np_log_softmax, np_softplus,
                                       roundtrip_exact)

V = 60
CK = [(0.0, 2.0), (-1.5, 2.5), (-1.5, 3.0), (0.7, 0.5), (1.0, 1.0), (-2.0, 5.0)]


def ref_pl_tilde(x, c, k):
    """Thesis eq 4.15, literally, in float64."""
    x = np.asarray(x, np.float64)
    return k * (x - c) + c - (k - 1.0) * np_softplus(x - c)


def ref_gss(l, c, k):
    return np_log_softmax(ref_pl_tilde(l, c, k))


def ref_sigsoftmax_product(l):
    """SS(l) = exp(l) sigmoid(l) / sum exp(l) sigmoid(l), product definition (moderate l)."""
    l = np.asarray(l, np.float64)
    g = np.exp(l) / (1.0 + np.exp(-l))
    return np.log(g / g.sum(-1, keepdims=True))


@pytest.fixture
def logits():
    return (4.0 * np.random.default_rng(0).normal(size=(3, 4, V))).astype("float32")


@pytest.mark.parametrize("c,k", CK)
def test_pl_tilde_matches_eq_4_15(c, k):
    x = np.linspace(-30, 30, 601).astype("float32")
    got = np.asarray(activations.pl_tilde(x, c, k))
    assert_close_log_probs(got, ref_pl_tilde(x, c, k), rtol=2e-6)


def test_pl_tilde_special_cases():
    x = np.linspace(-20, 20, 401).astype("float32")
    # PL~(x; 0, 0) = softplus(x)
    np.testing.assert_allclose(np.asarray(activations.pl_tilde(x, 0.0, 0.0)), np_softplus(x),
                               rtol=1e-6, atol=1e-6)
    # PL~(x; c, 1) = x exactly
    np.testing.assert_array_equal(np.asarray(activations.pl_tilde(x, -1.5, 1.0)), x)
    # PL~(x; 0, 2) = 2x - softplus(x) (decomposed sigsoftmax, eq 4.11)
    np.testing.assert_allclose(np.asarray(activations.pl_tilde(x, 0.0, 2.0)),
                               2 * x.astype(np.float64) - np_softplus(x), rtol=1e-6, atol=1e-5)
    # asymptotes (eq 4.10): ~x far right of c, ~k(x - c) + c far left
    assert abs(float(activations.pl_tilde(np.float32(60.0), -1.5, 2.5)) - 60.0) < 1e-5
    assert abs(float(activations.pl_tilde(np.float32(-60.0), -1.5, 2.5)) - (2.5 * -58.5 - 1.5)) < 1e-4


@pytest.mark.parametrize("c,k", CK)
def test_gss_matches_reference(logits, c, k):
    out = activations.gss(logits, c, k)
    assert_log_probs(out, logits.shape)
    assert_close_log_probs(out, ref_gss(logits, c, k))


def test_gss_k1_is_log_softmax_exactly(logits):
    for c in (-3.0, 0.0, 2.5):
        np.testing.assert_array_equal(np.asarray(activations.gss(logits, c, 1.0)),
                                      np.asarray(ops.log_softmax(logits, axis=-1)))


def test_sigsoftmax_is_gss_0_2_and_product_definition(logits):
    ss = np.asarray(activations.sigsoftmax(logits))
    assert_close_log_probs(ss, ref_sigsoftmax_product(logits))
    np.testing.assert_allclose(ss, np.asarray(activations.gss(logits, 0.0, 2.0)), atol=2e-6)
    assert_close_log_probs(np.asarray(SigSoftmax()(logits)), ref_sigsoftmax_product(logits))
    # it is not the plain softmax
    assert np.abs(ss - np_log_softmax(logits)).max() > 0.1


def test_return_probs(logits):
    p = np.asarray(activations.gss(logits, -1.5, 2.5, return_probs=True))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(p, np.exp(ref_gss(logits, -1.5, 2.5)), atol=1e-6)
    p = np.asarray(GSSActivation(-1.5, 2.5, return_probs=True)(logits))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    p = np.asarray(activations.sigsoftmax(logits, return_probs=True))
    np.testing.assert_allclose(p, np.exp(ref_sigsoftmax_product(logits)), atol=1e-6)


@pytest.mark.parametrize("c,k", [(0.0, 2.0), (-1.5, 2.5), (0.5, 0.3), (-1.5, 3.0)])
def test_huge_logits_stay_finite(c, k):
    rng = np.random.default_rng(1)
    big = (1e4 * rng.uniform(-1, 1, size=(2, 3, V))).astype("float32")
    big[0, 0, :3] = [1e4, -1e4, 0.0]
    out = activations.gss(big, c, k)
    assert_log_probs(out)
    assert_close_log_probs(out, ref_gss(big, c, k), rtol=1e-5)
    ss = activations.sigsoftmax(big)
    assert_log_probs(ss)
    assert_close_log_probs(ss, ref_gss(big, 0.0, 2.0), rtol=1e-5)


def test_gradients_finite_for_huge_logits():
    import tensorflow as tf
    big = tf.Variable((1e4 * np.random.default_rng(2).uniform(-1, 1, (2, 3, V))).astype("float32"))
    gradients_finite(lambda: activations.gss(big, -1.5, 2.5)[..., 0], [big])
    gradients_finite(lambda: activations.sigsoftmax(big)[..., 1], [big])


def test_gss_activation_fixed_and_trainable(logits):
    fixed = GSSActivation(c=-1.5, k=2.5)
    assert_close_log_probs(fixed(logits), ref_gss(logits, -1.5, 2.5))
    assert fixed.weights == []
    trainable = GSSActivation(c=-1.5, k=2.5, trainable_params=True)
    out = trainable(logits)
    assert_close_log_probs(out, ref_gss(logits, -1.5, 2.5))
    assert [v.name for v in trainable.trainable_weights] == ["c", "k"]
    np.testing.assert_allclose([float(trainable.c_weight), float(trainable.k_weight)], [-1.5, 2.5])
    grads = gradients_finite(lambda: trainable(logits)[..., 0], trainable.trainable_weights)
    assert all(float(g) != 0.0 for g in grads)
    # changing the weights changes the function
    trainable.k_weight.assign(1.0)
    np.testing.assert_allclose(np.asarray(trainable(logits)), np_log_softmax(logits), atol=1e-5)


def _head_reference(head, h, c, k):
    w = np.asarray(head.kernel, np.float64)
    b = np.asarray(head.bias, np.float64)
    return ref_gss(np.asarray(h, np.float64) @ w + b, c, k)


def test_gss_head_matches_reference():
    rng = np.random.default_rng(3)
    h = rng.normal(size=(2, 5, 16)).astype("float32")
    head = GSSHead(vocab_size=V, c=-1.5, k=3.0)
    head(h)
    head.bias.assign(rng.normal(size=(V,)).astype("float32"))
    out = head(h)
    assert_log_probs(out, (2, 5, V))
    assert_close_log_probs(out, _head_reference(head, h, -1.5, 3.0))
    emb = TiedEmbedding(V, 16)
    tied = GSSHead(embedding=emb, c=-1.5, k=2.5)
    out = tied(h)                                    # builds the embedding
    e = np.asarray(emb.embeddings, np.float64)
    ref = ref_gss(h.astype(np.float64) @ e.T + np.asarray(emb.output_bias), -1.5, 2.5)
    assert_close_log_probs(out, ref)


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="inf"):
        GSSActivation(c=float("inf"))
    with pytest.raises(ValueError, match="'abc'"):
        GSSHead(vocab_size=10, k="abc")
    with pytest.raises(ValueError, match="vocab_size"):
        GSSHead()


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, V, size=(2, 6)).astype("int32")
    emb = TiedEmbedding(V, 8)
    inp = keras.Input((6,), dtype="int32")
    x = emb(inp)
    x = keras.layers.Dense(8, activation="tanh")(x)
    out = GSSHead(embedding=emb, c=-1.5, k=2.5, trainable_params=True, name="gss")(x)
    model = keras.Model(inp, out)
    model.get_layer("gss").k_weight.assign(2.7)
    loaded = roundtrip_exact(model, ids, tmp_path)
    head = loaded.get_layer("gss")
    assert head.get_config()["c"] == -1.5 and head.trainable_params
    assert float(head.k_weight) == pytest.approx(2.7)

    logits = rng.normal(size=(2, 6, V)).astype("float32")
    li = keras.Input((6, V))
    seq = keras.Model(li, [GSSActivation(-1.5, 3.0)(li), SigSoftmax()(li)])
    before = [np.asarray(t) for t in seq(logits)]
    seq.save(tmp_path / "act.keras")
    after = [np.asarray(t) for t in keras.saving.load_model(tmp_path / "act.keras")(logits)]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_get_config_has_every_argument():
    cfg = GSSActivation(c=-1.5, k=3.0, trainable_params=True, return_probs=True).get_config()
    assert (cfg["c"], cfg["k"], cfg["trainable_params"], cfg["return_probs"]) == (-1.5, 3.0, True, True)
    clone = GSSHead.from_config(GSSHead(vocab_size=V, c=0.5, k=1.5).get_config())
    assert (clone.c, clone.k, clone.vocab_size) == (0.5, 1.5, V)
    assert SigSoftmax(return_probs=True).get_config()["return_probs"] is True


def test_mixed_precision():
    h = np.random.default_rng(5).normal(size=(2, 3, 16)).astype("float32")
    check_mixed_precision(lambda: GSSHead(vocab_size=V, c=-1.5, k=2.5, trainable_params=True), h)
    out = check_mixed_precision(lambda: GSSActivation(-1.5, 2.5, trainable_params=True),
                                h @ np.ones((16, V), "float32"))
    assert np.asarray(out).dtype == np.float32


def test_one_training_step():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(4, 5, 16)).astype("float32")
    y = rng.integers(0, V, size=(4, 5))
    inp = keras.Input((5, 16))
    model = keras.Model(inp, GSSHead(vocab_size=V, c=-1.5, k=2.5, trainable_params=True)(inp))
    check_training_step(model, x, y)
