"""Regularizers of the embedding: MLE-CosReg, spectrum control (orthogonality, singular-value
decay, the SVD-parametrized embedding), Gaussian embedding noise, partial shuffle."""

import numpy as np
import pytest

import keras
import tensorflow as tf

from tests.numeric_grad import numeric_grad
from tests.tflm.test_distribute import MIRRORED_PRELUDE, _result, _run
from tflm.data import batchify, partial_shuffle
from tflm.layers import EmbeddingNoise, SpectralEmbedding, TiedEmbedding
from tflm.layers.spectral_embedding import derived_decay_constants
from tflm.regularizers import (CosineSimilarityRegularizer, OrthogonalityRegularizer,
                               SingularValueDecayRegularizer, decay_target)
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

RNG = np.random.default_rng(0)


def _value_and_grad(fn, x):
    v = tf.Variable(x)
    with tf.GradientTape() as tape:
        out = fn(v)
    return float(out), tape.gradient(out, v).numpy()


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
    expected = numeric_grad(lambda x: cosreg_pairs(x, 0.7), e)
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
    expected = numeric_grad(lambda x: orthogonality(x, 0.3, 0.2), w)
    np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-4)
    q, _ = np.linalg.qr(RNG.normal(size=(6, 3)))
    assert float(reg(q.astype("float32"))) == pytest.approx(0.0, abs=1e-10)
    # a weight holding c W: the penalty of W, its gradient 1/c times W's
    scaled = OrthogonalityRegularizer(0.3, 0.2, scale=2.5)
    value, grad = _value_and_grad(scaled, 2.5 * w)
    assert value == pytest.approx(orthogonality(w.astype(np.float64), 0.3, 0.2), rel=1e-5)
    np.testing.assert_allclose(grad, expected / 2.5, rtol=1e-3, atol=1e-4)
    assert float(scaled(2.5 * q.astype("float32"))) == pytest.approx(0.0, abs=1e-9)
    assert scaled.get_config()["scale"] == 2.5
    with pytest.raises(ValueError, match="scale"):
        OrthogonalityRegularizer(scale=0.0)


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
    u, v = np.asarray(layer.u), np.asarray(layer.v)
    np.testing.assert_allclose(u.T @ u, np.eye(6), atol=1e-5)
    np.testing.assert_allclose(v.T @ v, np.eye(6), atol=1e-5)
    np.testing.assert_allclose(np.asarray(layer.singular_values),
                               np.linalg.svd(e, compute_uv=False), rtol=1e-5)
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
    # the factors are stored times the rms initial singular value, sigma sqrt(vocab)
    assert layer.factor_scale == pytest.approx(0.2 / np.sqrt(12) * np.sqrt(4000))
    assert np.sqrt(np.mean(s ** 2)) == pytest.approx(layer.factor_scale, rel=0.02)
    np.testing.assert_allclose(np.asarray(layer.left), np.asarray(layer.u) * layer.factor_scale,
                               rtol=1e-6)
    assert derived_decay_constants(3.0, 1.0, 5, "polynomial") == (3.0, 0.0)
    c1, c2 = derived_decay_constants(3.0, 1.0, 5)
    assert c1 * np.exp(-c2) == pytest.approx(3.0) and c1 * np.exp(-5 * c2) == pytest.approx(1.0)
    assert len(layer.losses) == 3  # U, s, V
    with pytest.raises(ValueError, match="embed_dim <= vocab_size"):
        SpectralEmbedding(5, 10)
    with pytest.raises(ValueError, match="decay_c1"):
        SpectralEmbedding(50, 5, embeddings_initializer="glorot_uniform")
    with pytest.raises(ValueError, match="factor_scale"):
        SpectralEmbedding(50, 5, embeddings_initializer="glorot_uniform", decay=None)
    SpectralEmbedding(50, 5, embeddings_initializer="glorot_uniform", decay=None,
                      factor_scale=1.0).build()


def _first_order_step(e_grad, u, s, v, c, lr):
    """dE of one SGD step of size lr on the stored factors (c U, s, c V) of E = U diag(s) V^T
    for a loss with gradient G = e_grad in E (first order):
        -lr [G V D V^T + U D U^T G + U diag(diag(U^T G V)) V^T],  D = diag(s^2 / c^2)."""
    d = np.diag(s ** 2 / c ** 2)
    through_s = u @ np.diag(np.diag(u.T @ e_grad @ v)) @ v.T
    return -lr * (e_grad @ v @ d @ v.T + u @ d @ u.T @ e_grad + through_s)


@pytest.mark.parametrize("factor_scale", [None, 1.0])
def test_spectral_embedding_sgd_step_on_E(factor_scale):
    """An SGD step through the factors moves E by the first-order formula above: with the
    default factor_scale c (the rms initial singular value) D ~ I and E moves about as a
    plain embedding does (at most 3 lr |G|); stored unscaled (c = 1) the step is s_k^2 times
    larger (here ~25; ~33 for AWD-LSTM's PTB embedding, where lr 30 then diverged)."""
    layer = SpectralEmbedding(300, 12, orthogonality_frobenius=0, orthogonality_spectral=0,
                              decay=None, factor_scale=factor_scale,
                              embeddings_initializer=keras.initializers.RandomUniform(-0.5, 0.5))
    layer.build()
    target = RNG.normal(size=(300, 12)).astype("float32")
    before = np.asarray(layer.embeddings, np.float64)
    u, s, v = (np.asarray(w, np.float64) for w in (layer.u, layer.singular_values, layer.v))
    weights = [layer.left, layer.singular_values, layer.right]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer.embeddings * target)
    grads = tape.gradient(loss, weights)
    lr = 1e-5
    for w, g in zip(weights, grads):
        w.assign_sub(lr * g)
    moved = np.asarray(layer.embeddings, np.float64) - before
    expected = _first_order_step(target.astype(np.float64), u, s, v, layer.factor_scale, lr)
    np.testing.assert_allclose(moved, expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())
    ratio = np.linalg.norm(moved) / (lr * np.linalg.norm(target))
    if factor_scale is None:
        assert 0.5 < ratio < 3.0
    else:
        assert ratio > 10.0


def test_spectral_embedding_keras_round_trip(tmp_path):
    model = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, spectrum_control=True)
    model.build()
    x = RNG.integers(0, 40, size=(2, 5)).astype("int32")
    path = tmp_path / "sc.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(loaded(x)))
    assert loaded.embedding.decay_c1 == model.embedding.decay_c1
    assert loaded.embedding.factor_scale == model.embedding.factor_scale
    # the saved model names every option, so later default changes leave it as it was
    assert loaded.get_config()["spectrum_control"] == model.embedding.spectrum_options()
    assert model.get_config()["spectrum_control"]["factor_scale"] == model.embedding.factor_scale
    # a configuration saved before factor_scale existed held U and V unscaled
    config = model.embedding.get_config()
    del config["factor_scale"]
    assert SpectralEmbedding.from_config(config).factor_scale == 1.0
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


def _weight_values(model):
    """{path below the model's own name: value} of the trainable weights."""
    return {w.path.split("/", 1)[1]: np.asarray(w) for w in model.trainable_weights}


def _copy_weights(values, model):
    """Every trainable weight of `model` whose path `values` has takes that value; a
    SpectralEmbedding takes the SVD of the source's embedding matrix."""
    copied = 0
    for w in model.trainable_weights:
        key = w.path.split("/", 1)[1]
        if key in values:
            w.assign(values[key])
            copied += 1
    if isinstance(model.embedding, SpectralEmbedding):
        model.embedding.assign_matrix(values["backbone/embedding/embeddings"])
        copied += 1
    assert copied == len(values)


def test_evaluation_is_unchanged_by_every_regularizer(tmp_path):
    """The same weights evaluate alike with and without each regularizer (AdvSoft, embedding
    noise, MLE-CosReg, spectrum control: E = U diag(s) V^T holding the plain model's E), while
    the training loss moves; every one survives a .keras round trip. (Partial shuffle only
    reorders the training streams: zoo.runs.training never applies it to valid / test.)"""
    kw = dict(embed_dim=6, hidden_dim=8, num_layers=2, alpha=0, beta=0, seed=1, dropout=0,
              dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0)
    keras.utils.set_random_seed(7)  # fixed weights: the perturbations' effects are small here
    rng = np.random.default_rng(7)
    x = rng.integers(0, 40, size=(3, 5)).astype("int32")
    y = rng.integers(0, 40, size=(3, 5)).astype("int32")
    plain = AWDLSTM(40, **kw)
    plain.build()
    values = _weight_values(plain)
    plain.compile(optimizer=keras.optimizers.SGD(0.0))
    ev0 = plain.evaluate(x, y, batch_size=3, verbose=0, return_dict=True)
    tr0 = plain.train_on_batch(x, y, return_dict=True)
    variants = {"advsoft": dict(head={"type": "softmax", "adversarial_alpha": 5.0}),
                "noise": dict(embedding_noise=1.0),
                "cosreg": dict(cosine_regularization=2.0),
                "spectrum": dict(spectrum_control={"decay_strength": 0.5})}
    for name, extra in variants.items():
        model = AWDLSTM(40, **kw, **extra)
        model.build()
        _copy_weights(values, model)
        model.compile(optimizer=keras.optimizers.SGD(0.0))
        ev = model.evaluate(x, y, batch_size=3, verbose=0, return_dict=True)
        assert ev["perplexity"] == pytest.approx(ev0["perplexity"], rel=1e-5), name
        assert ev["loss"] == pytest.approx(ev0["loss"], rel=1e-5), name
        tr = model.train_on_batch(x, y, return_dict=True)
        penalty = float(sum(model.losses)) if model.losses else 0.0
        if name in ("cosreg", "spectrum"):  # the NLL as plain's, plus the penalties
            assert abs(penalty) > 1e-4, name
            assert tr["nll"] == pytest.approx(tr0["nll"], rel=1e-5), name
            assert tr["loss"] == pytest.approx(tr0["loss"] + penalty, rel=1e-5), name
        elif name == "advsoft":  # the adversary raises the training NLL
            assert tr["nll"] > tr0["nll"] + 2e-4, (tr["nll"], tr0["nll"])
        else:  # the noise moves it
            assert abs(tr["nll"] - tr0["nll"]) > 2e-4, (tr["nll"], tr0["nll"])
        path = tmp_path / f"{name}.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
        np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(loaded(x)))


# MirroredStrategy on two logical CPUs (one subprocess: TensorFlow fixes its logical devices
# at start-up), as tests/tflm/test_distribute.py does for AdvSoft, embedding noise and MLE-CosReg:
# spectrum control, with dropout off and then with every dropout, AdvSoft and embedding noise
# on (per-stream draws: a replicated step draws what one device draws), and partial shuffle.
MIRRORED_SNIPPET = MIRRORED_PRELUDE + """
from tflm import data
rng = np.random.default_rng(0)

def compare(kw, ds, epochs=2):
    single, multi = twins(kw)
    out = {"eval": [m.evaluate(ds, verbose=0, return_dict=True)["perplexity"]
                    for m in (single, multi)],
           "loss": [m.fit(ds, epochs=epochs, verbose=0).history["loss"]
                    for m in (single, multi)]}
    out["weight_diff"] = float(max(np.abs(a - b).max() for a, b in
                                   zip(single.get_weights(), multi.get_weights())))
    # the embedding's penalties (model.losses would also hold the AR / TAR tensors of the
    # last traced step, which only exist inside its graph)
    out["penalty"] = float(sum(multi.embedding.losses)) if multi.embedding.losses else 0.0
    return out

kw = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1,
          spectrum_control={"orthogonality_frobenius": 0.05, "orthogonality_spectral": 0.05,
                            "decay_strength": 0.1})
streams = rng.integers(0, 30, size=(8, 31)).astype("int32")
result = {"replicas": strategy.num_replicas_in_sync}
result["sc"] = compare(kw, windows(streams))
kw.update(dropout=0.4, dropout_h=0.3, dropout_i=0.5, dropout_e=0.2, weight_dropout=0.5,
          embedding_noise=0.3, head={"type": "softmax", "adversarial_alpha": 0.05},
          spectrum_control={"decay": "polynomial", "decay_c1": 1.0, "decay_gamma": -0.5,
                            "decay_strength": 0.1})
result["sc_dropout_noise_advsoft"] = compare(kw, windows(streams))
# partial shuffle: two epochs' rotated streams (one fit over both), the replicas holding
# their blocks of them
kw = dict(kw, spectrum_control=None, embedding_noise=0.0, head="softmax")
shuffled = [data.partial_shuffle(streams, seed=5, epoch=e) for e in range(2)]
result["shuffle_rotated"] = bool((shuffled[0] != streams).any()
                                 and (shuffled[1] != shuffled[0]).any())
result["partial_shuffle"] = compare(kw, windows(shuffled[0]).concatenate(windows(shuffled[1])),
                                    epochs=1)
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def mirrored():
    return _result(_run(MIRRORED_SNIPPET))


@pytest.mark.slow  # 28 s of CI; no README claim rests on it (test_distribute keeps mirrored fits)
@pytest.mark.parametrize("part", ["sc", "sc_dropout_noise_advsoft", "partial_shuffle"])
def test_mirrored_two_cpus_train_like_one_device(mirrored, part):
    """Spectrum control (every penalty on; its orthogonality and decay penalties are part of
    each replica's loss), then spectrum control with every dropout, embedding noise and AdvSoft,
    then partial shuffle: a replicated fit on two logical CPUs equals the one-device fit."""
    assert mirrored["replicas"] == 2
    r = mirrored[part]
    assert r["eval"][1] == pytest.approx(r["eval"][0], rel=1e-5)
    assert np.all(np.isfinite(r["loss"][0]))
    for a, b in zip(*r["loss"]):
        assert b == pytest.approx(a, rel=1e-5)
    assert r["weight_diff"] < 1e-5
    if part.startswith("sc"):
        assert r["penalty"] > 1e-4  # the penalties are on
    else:
        assert mirrored["shuffle_rotated"]
