"""Regularizers of the embedding: MLE-CosReg, spectrum control (orthogonality, singular-value
decay, the SVD-parametrized embedding), Gaussian embedding noise, partial shuffle."""

import numpy as np
import pytest

import keras
import tensorflow as tf

from tflm.data import batchify, partial_shuffle
from tflm.layers import EmbeddingNoise, SpectralEmbedding, TiedEmbedding
from tflm.layers.spectral_embedding import derived_decay_constants
from tflm.regularizers import (CosineSimilarityRegularizer, OrthogonalityRegularizer,
                               SingularValueDecayRegularizer, decay_target)
from zoo.awd_lstm import AWDLSTM

RNG = np.random.default_rng(0)


def _value_and_grad(fn, x):
    v = tf.Variable(x)
    with tf.GradientTape() as tape:
        out = fn(v)
    return float(out), tape.gradient(out, v).numpy()


def _numeric_grad(fn, x, h=1e-6):
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (fn(up) - fn(down)) / (2 * h)
    return grad


def cosreg_pairs(e, gamma):
    """The O(N^2) definition: gamma / N^2 sum_{i != j} cos(e_i, e_j)."""
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    cos = unit @ unit.T
    n = len(e)
    return gamma * (cos.sum() - np.trace(cos)) / n ** 2


def test_cosreg_linear_form_equals_pairwise_definition_value_and_gradient():
    e = RNG.normal(size=(7, 4)).astype("float32") + 0.3
    value, grad = _value_and_grad(CosineSimilarityRegularizer(0.7), e)
    assert value == pytest.approx(cosreg_pairs(e.astype(np.float64), 0.7), rel=1e-5)
    expected = _numeric_grad(lambda x: cosreg_pairs(x, 0.7), e)
    np.testing.assert_allclose(grad, expected, atol=1e-5)


def test_cosreg_extremes():
    same = np.tile(RNG.normal(size=(1, 5)), (6, 1)).astype("float32")
    assert float(CosineSimilarityRegularizer(1.0)(same)) == pytest.approx(30 / 36, rel=1e-5)
    orth = np.eye(5, dtype="float32")
    assert float(CosineSimilarityRegularizer(1.0)(orth)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="gamma"):
        CosineSimilarityRegularizer(-1.0)


def orthogonality(w, fro, spec):
    a = w.T @ w - np.eye(w.shape[1])
    return fro * (a ** 2).sum() + spec * np.linalg.norm(a, 2) ** 2


def test_orthogonality_penalty_value_and_gradient():
    w = RNG.normal(size=(6, 3)).astype("float32") * 0.5
    reg = OrthogonalityRegularizer(0.3, 0.2)
    value, grad = _value_and_grad(reg, w)
    assert value == pytest.approx(orthogonality(w.astype(np.float64), 0.3, 0.2), rel=1e-5)
    expected = _numeric_grad(lambda x: orthogonality(x, 0.3, 0.2), w)
    np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-4)
    q, _ = np.linalg.qr(RNG.normal(size=(6, 3)))
    assert float(reg(q.astype("float32"))) == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("kind,c2,gamma", [("exponential", 0.05, 1.0),
                                           ("exponential", 0.3, 0.5),
                                           ("polynomial", 0.0, -0.5)])
def test_singular_value_decay_penalty(kind, c2, gamma):
    s = np.sort(RNG.uniform(0.5, 3.0, size=8))[::-1].astype("float32")
    k = np.arange(1, 9, dtype=np.float64)
    target = 2.5 * (np.exp(-c2 * k ** gamma) if kind == "exponential" else k ** gamma)
    np.testing.assert_allclose(decay_target(8, kind, 2.5, c2, gamma), target, rtol=1e-12)
    reg = SingularValueDecayRegularizer(2.5, c2, gamma, strength=0.4, kind=kind)
    value, grad = _value_and_grad(reg, s)
    assert value == pytest.approx(0.4 * ((s - target) ** 2).sum(), rel=1e-5)
    np.testing.assert_allclose(grad, 0.8 * (s - target), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="kind"):
        SingularValueDecayRegularizer(1.0, kind="linear")


def test_spectral_embedding_represents_a_given_matrix_exactly():
    e = RNG.normal(size=(30, 6)).astype("float32")
    layer = SpectralEmbedding.from_matrix(e)
    np.testing.assert_allclose(np.asarray(layer.embeddings), e, atol=1e-5)
    ids = RNG.integers(0, 30, size=(2, 5))
    np.testing.assert_allclose(np.asarray(layer(ids)), e[ids], atol=1e-5)
    h = RNG.normal(size=(2, 5, 6)).astype("float32")
    np.testing.assert_allclose(np.asarray(layer.reverse(h)), h @ e.T, atol=1e-4)
    # orthonormal factors: the orthogonality penalties vanish at this point
    reg = layer.orthogonality
    assert float(reg(layer.left)) < 1e-9 and float(reg(layer.right)) < 1e-9
    with pytest.raises(ValueError, match=r"\(30, 6\)"):
        layer.assign_matrix(e[:10])


def test_spectral_embedding_default_init_and_derived_target():
    layer = SpectralEmbedding(4000, 40)
    layer.build()
    s = np.linalg.svd(np.asarray(layer.embeddings), compute_uv=False)
    target = np.asarray(decay_target(40, "exponential", layer.decay_c1, layer.decay_c2, 1.0))
    # the target runs between the Marchenko-Pastur edges of the random initial matrix
    assert target[0] == pytest.approx(s[0], rel=0.03)
    assert target[-1] == pytest.approx(s[-1], rel=0.03)
    assert np.all(np.diff(target) < 0)
    # the same distribution as TiedEmbedding's U(-0.1, 0.1) entries
    values = np.asarray(layer.embeddings)
    assert np.abs(values).max() <= 0.1 + 1e-5 and values.std() == pytest.approx(0.0577, rel=0.05)
    assert derived_decay_constants(3.0, 1.0, 5, "polynomial") == (3.0, 0.0)
    c1, c2 = derived_decay_constants(3.0, 1.0, 5)
    assert c1 * np.exp(-c2) == pytest.approx(3.0) and c1 * np.exp(-5 * c2) == pytest.approx(1.0)
    assert len(layer.losses) == 3  # U, s, V
    with pytest.raises(ValueError, match="embed_dim <= vocab_size"):
        SpectralEmbedding(5, 10)
    with pytest.raises(ValueError, match="decay_c1"):
        SpectralEmbedding(50, 5, embeddings_initializer="glorot_uniform")


def test_spectral_embedding_keras_round_trip(tmp_path):
    model = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, spectrum_control=True)
    model.build()
    x = RNG.integers(0, 40, size=(2, 5)).astype("int32")
    path = tmp_path / "sc.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(loaded(x)))
    assert loaded.embedding.decay_c1 == model.embedding.decay_c1
    assert float(sum(loaded.losses)) == pytest.approx(float(sum(model.losses)), rel=1e-6)


def test_embedding_noise_statistics_and_inference_identity():
    x = np.zeros((64, 20, 16), "float32")
    layer = EmbeddingNoise(0.15, seed=3)
    first, second = np.asarray(layer(x, training=True)), np.asarray(layer(x, training=True))
    assert first.mean() == pytest.approx(0.0, abs=0.003)
    assert first.std() == pytest.approx(0.15, rel=0.02)
    assert abs(np.corrcoef(first.ravel(), second.ravel())[0, 1]) < 0.02  # fresh draws
    assert not np.array_equal(first[0], first[1])  # every stream its own noise
    np.testing.assert_array_equal(np.asarray(layer(x + 1.0, training=False)), x + 1.0)
    with pytest.raises(ValueError, match="scale"):
        EmbeddingNoise(-0.1)


def test_cosine_regularization_joins_the_training_loss_only():
    kw = dict(embed_dim=6, hidden_dim=8, num_layers=2, alpha=0, beta=0, seed=1)
    x = RNG.integers(0, 40, size=(3, 5)).astype("int32")
    y = RNG.integers(0, 40, size=(3, 5)).astype("int32")
    plain = AWDLSTM(40, **kw)
    plain.build()
    reg = AWDLSTM(40, cosine_regularization=2.0, **kw)
    reg.build()
    reg.set_weights(plain.get_weights())
    expected = float(CosineSimilarityRegularizer(2.0)(reg.embedding.embeddings))
    for m in (plain, reg):
        m.compile(optimizer=keras.optimizers.SGD(0.0))
    ev = [m.evaluate(x, y, batch_size=3, verbose=0, return_dict=True) for m in (plain, reg)]
    assert ev[1]["loss"] == pytest.approx(ev[0]["loss"], rel=1e-6)  # evaluation unchanged
    tr = [m.train_on_batch(x, y, return_dict=True) for m in (plain, reg)]
    assert tr[1]["loss"] - tr[0]["loss"] == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError, match="use one of them"):
        AWDLSTM(40, cosine_regularization=1.0, spectrum_control=True, **kw)


def test_partial_shuffle_rotates_each_stream():
    ids = np.arange(5 * 40)
    streams = batchify(ids, 5)
    shuffled = partial_shuffle(streams, seed=7, epoch=0)
    offsets = []
    for row, new in zip(streams, shuffled):
        offset = int(np.flatnonzero(row == new[0])[0])
        np.testing.assert_array_equal(np.roll(row, -offset), new)
        offsets.append(offset)
    assert len(set(offsets)) > 1  # independent offsets per stream
    np.testing.assert_array_equal(shuffled, partial_shuffle(streams, seed=7, epoch=0))
    assert not np.array_equal(shuffled, partial_shuffle(streams, seed=7, epoch=1))
    with pytest.raises(ValueError, match="batchify"):
        partial_shuffle(ids)


def test_partial_shuffle_offsets_are_uniform():
    streams = np.tile(np.arange(10), (2000, 1))
    firsts = partial_shuffle(streams, seed=0, epoch=3)[:, 0]
    counts = np.bincount(firsts, minlength=10)
    assert counts.min() > 150 and counts.max() < 250  # 200 expected per offset (sd 13)
