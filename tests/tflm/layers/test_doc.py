"""Direct Output Connection: multi-layer mixture and the coefficient-of-variation regularizer."""

import numpy as np
import pytest

import keras
import tflm
from tflm.layers import DOCLayer, MoSLayer, TiedEmbedding
from tflm.layers.doc import prior_cv_squared
from tests.tflm.layers.test_heads_backends import (assert_close_log_probs, assert_log_probs,
                                       check_mixed_precision, check_training_step,
                                       gradients_finite, np_softmax, roundtrip_exact)

V, D = 50, 8
DIMS = (6, 10, 12)          # e.g. embedding-ish, second layer, last layer


def f64(v):
    return np.asarray(v, np.float64)


def ref_doc(layer, inputs):
    lat = []
    used = [(o, c) for o, c in zip(inputs, layer.num_components_per_layer) if c > 0]
    for (o, c), w, b in zip(used, layer.latent_kernels, layer.latent_biases):
        o = f64(o)
        lat.append(np.tanh(o @ f64(w) + f64(b)).reshape(o.shape[:-1] + (c, -1)))
    lat = np.concatenate(lat, axis=2)                                  # (B, T, R, L)
    if layer.tied:
        dec, bias = f64(layer.embedding.embeddings), f64(layer.embedding.output_bias)
    else:
        dec, bias = f64(layer.kernel).T, f64(layer.bias)
    pi = np_softmax(f64(inputs[-1]) @ f64(layer.prior_kernel))        # prior from the last input
    probs = np_softmax(lat @ dec.T + bias)
    return np.log((pi[..., None] * probs).sum(2)), pi


def ref_cv_squared(pi):
    """Reference (doc_lm): S = priors summed over time; (R-1) * S.var(unbiased, all) / S.mean()^2."""
    s = f64(pi).sum(axis=1)                                            # (B, R)
    return (s.shape[-1] - 1) * s.var(ddof=1) / s.mean() ** 2


def _inputs(rng, dims=DIMS, b=3, t=4):
    return [rng.normal(size=(b, t, d)).astype("float32") for d in dims]


def _randomize(layer, rng):
    for w in layer.weights:
        w.assign(rng.normal(scale=0.5, size=w.shape).astype("float32"))


@pytest.mark.parametrize("counts,tied", [((2, 1, 3), True), ((0, 2, 3), False), ((2, 3, 0), True)])
def test_matches_reference(counts, tied):
    rng = np.random.default_rng(0)
    xs = _inputs(rng)
    kw = dict(embedding=TiedEmbedding(V, D)) if tied else dict(vocab_size=V, latent_dim=5)
    layer = DOCLayer(counts, cv_regularization=0.0, **kw)
    layer(xs)
    _randomize(layer, rng)
    out = layer(xs)
    assert_log_probs(out, (3, 4, V))
    expected, pi = ref_doc(layer, xs)
    assert_close_log_probs(out, expected)
    np.testing.assert_allclose(np.asarray(layer.mixture_weights(xs)), pi, atol=1e-6)
    assert layer.num_components == sum(counts)
    assert len(layer.latent_kernels) == sum(c > 0 for c in counts)


def test_single_layer_doc_is_mos():
    rng = np.random.default_rng(1)
    (x,) = _inputs(rng, dims=(12,))
    emb = TiedEmbedding(V, D)
    doc = DOCLayer((4,), embedding=emb, cv_regularization=0.0)
    mos = MoSLayer(4, embedding=emb)
    doc([x])
    mos(x)
    _randomize(doc, rng)
    mos.latent_kernel.assign(doc.latent_kernels[0])
    mos.latent_bias.assign(doc.latent_biases[0])
    mos.prior_kernel.assign(doc.prior_kernel)
    np.testing.assert_allclose(np.asarray(doc([x])), np.asarray(mos(x)), atol=1e-6)


def test_cv_squared_formula():
    rng = np.random.default_rng(2)
    pi = np_softmax(rng.normal(size=(3, 7, 5)))
    np.testing.assert_allclose(float(prior_cv_squared(pi.astype("float32"))), ref_cv_squared(pi),
                               rtol=1e-5)
    # batch of one: sum_r (S_r - mean)^2 / mean^2
    s = pi[:1].sum(1)[0]
    np.testing.assert_allclose(float(prior_cv_squared(pi[:1].astype("float32"))),
                               ((s - s.mean()) ** 2).sum() / s.mean() ** 2, rtol=1e-5)
    # uniform priors: no penalty
    assert float(prior_cv_squared(np.full((2, 3, 4), 0.25, "float32"))) == pytest.approx(0.0, abs=1e-12)


def test_regularizer_only_in_training_and_only_when_enabled():
    rng = np.random.default_rng(3)
    xs = _inputs(rng)
    layer = DOCLayer((2, 1, 3), embedding=TiedEmbedding(V, D), cv_regularization=0.5)
    layer(xs)
    _randomize(layer, rng)
    assert layer.losses == []
    layer(xs, training=True)
    (loss,) = layer.losses
    pi = np.asarray(layer.mixture_weights(xs))
    np.testing.assert_allclose(float(loss), 0.5 * ref_cv_squared(pi), rtol=1e-5)
    assert float(loss) > 0
    off = DOCLayer((2, 1, 3), embedding=TiedEmbedding(V, D), cv_regularization=0.0)
    off(xs, training=True)
    assert off.losses == []


def test_training_step_includes_the_regularizer():
    rng = np.random.default_rng(4)
    xs = _inputs(rng, b=4, t=5)
    y = rng.integers(0, V, size=(4, 5))
    lam = 10.0
    inputs = [keras.Input((5, d)) for d in DIMS]
    head = DOCLayer((2, 1, 3), vocab_size=V, cv_regularization=lam)
    model = keras.Model(inputs, head(inputs))
    _randomize(head, rng)
    out = np.asarray(model(xs, training=True), np.float64)
    nll = -np.take_along_axis(out, y[..., None], -1).mean()
    expected = nll + lam * ref_cv_squared(np.asarray(head.mixture_weights(xs)))
    loss = check_training_step(model, xs, y)
    assert loss == pytest.approx(expected, rel=1e-4)
    assert lam * ref_cv_squared(np.asarray(head.mixture_weights(xs))) > 1e-3 * nll


def test_gradients_finite():
    rng = np.random.default_rng(5)
    xs = _inputs(rng)
    layer = DOCLayer((2, 1, 3), embedding=TiedEmbedding(V, D), latent_dropout=0.3)
    layer(xs)
    gradients_finite(lambda: layer(xs, training=True)[..., :5], layer.trainable_weights)


def test_latent_dropout_mask_is_shared_by_components_and_time_as_in_the_reference():
    rng = np.random.default_rng(6)
    xs = _inputs(rng)
    layer = DOCLayer((2, 1, 3), vocab_size=V, latent_dim=16, latent_dropout=0.5, seed=0)
    layer(xs)
    comps = np.asarray(layer.components(xs, training=True))            # (B, T, R, L)
    assert comps.shape == (3, 4, 6, 16)
    dropped = comps == 0.0
    assert np.all(dropped == dropped[:, :1]) and np.all(dropped == dropped[:, :, :1])
    assert not np.all(dropped == dropped[:1])  # but one mask per sequence
    assert 0.3 < dropped[:, 0, 0].mean() < 0.7
    assert_log_probs(layer(xs, training=True))


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(7)
    xs = _inputs(rng)
    emb = TiedEmbedding(V, D)
    inputs = [keras.Input((4, d)) for d in DIMS]
    out = DOCLayer([0, 2, 3], embedding=emb, latent_dropout=0.2, cv_regularization=0.001,
                   seed=1, name="doc")(inputs)
    model = keras.Model(inputs, out)
    loaded = roundtrip_exact(model, xs, tmp_path)
    cfg = loaded.get_layer("doc").get_config()
    assert cfg["num_components_per_layer"] == [0, 2, 3] and cfg["cv_regularization"] == 0.001


def test_mixed_precision():
    xs = _inputs(np.random.default_rng(8))
    check_mixed_precision(lambda: DOCLayer((2, 1, 3), embedding=TiedEmbedding(V, D)), xs)


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match=r"\(0, 0\)"):
        DOCLayer((0, 0), vocab_size=V)
    with pytest.raises(ValueError, match="-1"):
        DOCLayer((-1, 2), vocab_size=V)
    with pytest.raises(ValueError, match="1.5"):
        DOCLayer((1.5, 2), vocab_size=V)
    with pytest.raises(ValueError, match="cv_regularization=-0.1"):
        DOCLayer((1, 2), vocab_size=V, cv_regularization=-0.1)
    layer = DOCLayer((1, 2), vocab_size=V)
    with pytest.raises(ValueError, match="list of layer outputs"):
        layer(_inputs(np.random.default_rng(9)))                      # three inputs for two counts
    with pytest.raises(ValueError, match="list of layer outputs"):
        DOCLayer((1, 2), vocab_size=V)(np.zeros((2, 3, 4), "float32"))
