"""The factorized output matrix W = W1 W2 (Zhang 2018 §7.3) and MoS' prior bias, against
float64 NumPy on random inputs."""

import keras
import numpy as np
import pytest

from tflm.layers import (LowRankProjection, MoCLayer, MoSLayer, PLIFHead, SoftmaxLayer,
                         TiedEmbedding)

V, D, R = 40, 12, 3


def _np(v):
    return np.asarray(keras.ops.convert_to_numpy(v), np.float64)


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_projection_is_h_times_w1_w2_transposed_plus_bias():
    keras.utils.set_random_seed(0)
    proj = LowRankProjection(V, R)
    h = np.random.default_rng(0).normal(size=(2, 5, D)).astype("float32")
    out = _np(proj(h))
    proj.bias.assign(np.random.default_rng(1).normal(size=V))
    out = _np(proj(h))
    w = _np(proj.output_factor) @ _np(proj.input_factor)                  # (V, D)
    np.testing.assert_allclose(out, h @ w.T + _np(proj.bias), atol=1e-5)
    ids = np.array([[3, 7], [0, 39]])
    np.testing.assert_allclose(_np(proj.target_vectors(ids)), w[ids], atol=1e-6)
    assert proj.count_params() == V * R + R * D + V
    assert LowRankProjection(V, R, use_bias=False).compute_output_shape((2, D)) == (2, V)


def test_softmax_with_a_factorized_projection_is_rank_limited_mos_is_not():
    """Softmax: log P = H W^T + b - lse has rank <= r + 2; MoS over the same W1 W2 does
    not keep the bound (eq. 7.2)."""
    keras.utils.set_random_seed(1)
    h = np.random.default_rng(2).normal(size=(1, 200, D)).astype("float32")
    soft = SoftmaxLayer(vocab_size=V, output_rank=R)
    soft(h)
    soft.factorized.bias.assign(np.random.default_rng(3).normal(size=V))
    log_p = _np(soft(h))[0]
    w = _np(soft.factorized.output_factor) @ _np(soft.factorized.input_factor)
    np.testing.assert_allclose(log_p, _log_softmax(h[0] @ w.T + _np(soft.bias)), atol=1e-4)
    assert np.linalg.matrix_rank(log_p, tol=1e-3) <= R + 2
    mos = MoSLayer(4, vocab_size=V, output_rank=R)
    assert np.linalg.matrix_rank(_np(mos(h))[0], tol=1e-3) > R + 2


def test_mos_prior_bias_and_factorized_decoder_against_numpy():
    keras.utils.set_random_seed(4)
    rng = np.random.default_rng(4)
    g = rng.normal(size=(2, 3, D)).astype("float32")
    mos = MoSLayer(3, vocab_size=V, prior_bias=True, output_rank=R)
    mos(g)
    mos.prior_bias_weight.assign(rng.normal(size=3))
    mos.factorized.bias.assign(rng.normal(size=V))
    lat = np.tanh(g @ _np(mos.latent_kernel) + _np(mos.latent_bias)).reshape(2, 3, 3, D)
    log_pi = _log_softmax(g @ _np(mos.prior_kernel) + _np(mos.prior_bias_weight))
    w = _np(mos.factorized.output_factor) @ _np(mos.factorized.input_factor)
    comp = _log_softmax(lat @ w.T + _np(mos.factorized.bias))
    expected = np.log((np.exp(log_pi)[..., None] * np.exp(comp)).sum(2))
    np.testing.assert_allclose(_np(mos(g)), expected, atol=1e-5)
    # parameters: latent K D^2 + K D, prior D K + K, decoder V r + r D + V
    assert mos.count_params() == 3 * D * D + 3 * D + D * 3 + 3 + V * R + R * D + V


def test_a_head_with_a_factorized_decoder_round_trips(tmp_path):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4, D))
    model = keras.Model(inputs, MoSLayer(2, vocab_size=V, prior_bias=True,
                                         output_rank=R)(inputs))
    g = np.random.default_rng(5).normal(size=(2, 4, D)).astype("float32")
    model.save(tmp_path / "h.keras")
    loaded = keras.saving.load_model(tmp_path / "h.keras")
    np.testing.assert_array_equal(_np(model(g)), _np(loaded(g)))


def test_bad_factorizations_say_what_to_do():
    with pytest.raises(ValueError, match="factorizes an untied projection"):
        SoftmaxLayer(embedding=TiedEmbedding(V, D), output_rank=R)
    with pytest.raises(ValueError, match="output_rank must be a positive integer"):
        MoCLayer(2, vocab_size=V, output_rank=0)
    with pytest.raises(ValueError, match="does not implement a factorized projection"):
        PLIFHead(vocab_size=V, output_rank=R)
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        LowRankProjection(V, 2.5)
