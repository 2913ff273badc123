"""FRAGE (Gong et al. 2018): the discriminator's loss, its closed-form gradient and SGD step,
the fooling term and the moment distance against a NumPy transcription of the formulas
(values, finite differences), the sign of each update, the popular / rare split, zoo.AWDLSTM
with FRAGE on (its exact share of the training loss, fit, .keras round trip, JAX and
PyTorch) and off (variables and config as without it), and the two presets' commands."""

import json

import numpy as np
import pytest

import keras
import tensorflow as tf

from tests.backends import run_in_backend
from tests.numeric_grad import numeric_grad
from tflm.layers import FrageAdversary, FrageMoments
from tflm.layers.frage import (discriminator_gradients, discriminator_loss, discriminator_step,
                               fooling_loss, frage_settings, moment_distance,
                               popular_mask_from_counts, ranked_popular_mask)
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

RNG = np.random.default_rng(5)


def np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_code_loss(E, mask, W, b):
    """The code's D loss, written as it is computed there: PyTorch's CrossEntropyLoss with
    class weights [(V - k) / V, k / V] over all V rows (class 0 popular, 1 rare), i.e. the
    weighted mean sum_i w_{y_i} CE_i / sum_i w_{y_i}."""
    V, k = len(mask), int(mask.sum())
    y = np.where(mask > 0.5, 0, 1)
    ce = -np_log_softmax(np.asarray(E, np.float64) @ W + b)[np.arange(V), y]
    w = np.where(y == 0, (V - k) / V, k / V)
    return float((w * ce).sum() / w.sum())


def np_d_loss(E, mask, W, b):
    """L_D = 1/2 (mean_popular -log D_0 + mean_rare -log D_1)."""
    log_d = np_log_softmax(np.asarray(E, np.float64) @ W + b)
    pop = mask > 0.5
    return float(0.5 * (-log_d[pop, 0].mean() - log_d[~pop, 1].mean()))


def np_fool(E, mask, W, b, words="rare"):
    if words == "all":
        return np_d_loss(E, mask, W, b)
    log_d = np_log_softmax(np.asarray(E, np.float64) @ W + b)
    return float(-log_d[mask < 0.5, 1].mean())


def np_moments(X):
    """torch's mean, var (unbiased), and the code's skewness and kurtosis, per column."""
    mean = X.mean(0)
    var = X.var(0, ddof=1)
    c = X - mean
    return mean, var, (c ** 3).mean(0) / var ** 1.5, (c ** 4).mean(0) / var ** 2


def np_moment_distance(E, mask):
    E = np.asarray(E, np.float64)
    pop, rare = np_moments(E[mask > 0.5]), np_moments(E[mask < 0.5])
    return float(sum(np.sqrt(((a - b) ** 2).sum()) for a, b in zip(pop, rare)))


def _problem(V=12, d=4, k=5):
    counts = RNG.integers(1, 100, size=V)
    mask = popular_mask_from_counts(counts, k)
    return dict(E=RNG.normal(size=(V, d)), mask=mask, W=RNG.normal(size=(d, 2)) * 0.5,
                b=RNG.normal(size=2) * 0.1)


def _f32(x):
    return tf.constant(np.asarray(x, np.float32))


def test_discriminator_loss_is_the_codes_class_weighted_cross_entropy():
    q = _problem()
    ours = float(discriminator_loss(_f32(q["E"]), q["mask"], _f32(q["W"]), _f32(q["b"])))
    assert ours == pytest.approx(np_d_loss(q["E"], q["mask"], q["W"], q["b"]), rel=1e-5)
    # the balanced mean is exactly the code's weighted cross-entropy over the whole vocabulary
    assert ours == pytest.approx(np_code_loss(q["E"], q["mask"], q["W"], q["b"]), rel=1e-5)


@pytest.mark.parametrize("words", ["rare", "all"])
def test_fooling_loss_equals_the_transcription(words):
    q = _problem()
    ours = float(fooling_loss(_f32(q["E"]), q["mask"], _f32(q["W"]), _f32(q["b"]), words))
    assert ours == pytest.approx(np_fool(q["E"], q["mask"], q["W"], q["b"], words), rel=1e-5)


def test_moment_distance_equals_the_transcription():
    q = _problem(V=14, d=3, k=6)
    ours = float(moment_distance(_f32(q["E"]), q["mask"]))
    assert ours == pytest.approx(np_moment_distance(q["E"], q["mask"]), rel=1e-4)


def test_closed_form_discriminator_gradient_and_step():
    """The closed-form grad of L_D in (W, c) against finite differences, and the step is
    PyTorch's SGD with weight decay: p - lr (grad + wd p)."""
    q = _problem()
    gw, gb = discriminator_gradients(_f32(q["E"]), q["mask"], _f32(q["W"]), _f32(q["b"]))
    num_w = numeric_grad(lambda w: np_d_loss(q["E"], q["mask"], w, q["b"]), q["W"])
    num_b = numeric_grad(lambda b: np_d_loss(q["E"], q["mask"], q["W"], b), q["b"])
    assert np.abs(num_w).max() > 1e-3
    np.testing.assert_allclose(np.asarray(gw), num_w, atol=2e-5)
    np.testing.assert_allclose(np.asarray(gb), num_b, atol=2e-5)
    lr, wd = 0.3, 0.01
    new_w, new_b = discriminator_step(_f32(q["E"]), q["mask"], _f32(q["W"]), _f32(q["b"]), lr,
                                      wd)
    np.testing.assert_allclose(np.asarray(new_w), q["W"] - lr * (num_w + wd * q["W"]),
                               atol=2e-5)
    np.testing.assert_allclose(np.asarray(new_b), q["b"] - lr * (num_b + wd * q["b"]),
                               atol=2e-5)


@pytest.mark.parametrize("words", ["rare", "all"])
def test_gradients_of_the_embedding_terms_by_finite_differences(words):
    q = _problem(V=10, d=3, k=4)
    E = tf.Variable(q["E"].astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        fool = fooling_loss(E, q["mask"], _f32(q["W"]), _f32(q["b"]), words)
        moments = moment_distance(E, q["mask"])
    expected = numeric_grad(lambda e: np_fool(e, q["mask"], q["W"], q["b"], words), q["E"])
    np.testing.assert_allclose(tape.gradient(fool, E).numpy(), expected, atol=2e-5)
    rows = q["mask"] > 0.5
    if words == "rare":  # the code's fooling term moves the rare rows alone
        assert np.abs(expected[rows]).max() == 0.0 and np.abs(expected[~rows]).max() > 1e-3
    else:
        assert np.abs(expected[rows]).max() > 1e-3
    expected = numeric_grad(lambda e: np_moment_distance(e, q["mask"]), q["E"])
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(tape.gradient(moments, E).numpy(), expected, atol=5e-4)


def _separable_toy(V=8, d=2):
    """Popular rows around +x, rare rows around -x, a discriminator that half-knows it."""
    mask = ranked_popular_mask(V, 3)
    E = RNG.normal(size=(V, d)) * 0.1
    E[:, 0] += np.where(mask > 0.5, 1.0, -1.0)
    return E, mask, np.array([[0.5, -0.5], [0.0, 0.0]]), np.zeros(2)


def test_signs_the_discriminator_descends_and_the_embeddings_ascend_its_loss():
    E, mask, W, b = _separable_toy()
    before = np_d_loss(E, mask, W, b)
    new_w, new_b = (np.asarray(t, np.float64) for t in
                    discriminator_step(_f32(E), mask, _f32(W), _f32(b), 0.5, 0.0))
    assert np_d_loss(E, mask, new_w, new_b) < before - 1e-3  # D: gradient descent on L_D
    # the model's term is -lambda L_fool: descending it moves the rare rows so that the
    # discriminator's loss on them grows (they drift towards the popular side, +x)
    layer = FrageAdversary(len(mask), 2, popular=3, coefficient=0.5, discriminator_lr=0.5,
                           discriminator_weight_decay=0.0)
    layer.build()
    layer.popular_mask.assign(mask)
    layer.kernel.assign(W.astype("float32"))
    layer.bias.assign(b.astype("float32"))
    Ev = tf.Variable(E.astype("float32"))
    with tf.GradientTape() as tape:
        layer(Ev, training=True)
        added = layer.losses[-1]
    grad = tape.gradient(added, Ev).numpy()
    stepped = E - 0.1 * grad
    assert np_fool(stepped, mask, new_w, new_b) > np_fool(E, mask, new_w, new_b) + 1e-4
    assert np.all(grad[mask < 0.5, 0] < 0)  # descending moves every rare row along +x
    assert np.all(grad[mask > 0.5] == 0)


def test_layer_steps_the_discriminator_and_adds_minus_lambda_fool_in_training_only():
    q = _problem()
    V, d = q["E"].shape
    layer = FrageAdversary(V, d, popular=5, coefficient=0.3, discriminator_lr=0.2,
                           discriminator_weight_decay=1e-3)
    layer.build()
    layer.popular_mask.assign(q["mask"])
    layer.kernel.assign(q["W"].astype("float32"))
    layer.bias.assign(q["b"].astype("float32"))
    assert not layer.trainable_weights  # the model's optimizer never moves D
    E = _f32(q["E"])
    out = layer(E, training=False)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(E))
    assert layer.losses == [] and np.allclose(np.asarray(layer.kernel), q["W"])
    out = layer(E, training=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(E))
    gw = numeric_grad(lambda w: np_d_loss(q["E"], q["mask"], w, q["b"]), q["W"])
    gb = numeric_grad(lambda b: np_d_loss(q["E"], q["mask"], q["W"], b), q["b"])
    new_w = q["W"] - 0.2 * (gw + 1e-3 * q["W"])
    new_b = q["b"] - 0.2 * (gb + 1e-3 * q["b"])
    np.testing.assert_allclose(np.asarray(layer.kernel), new_w, atol=2e-5)
    np.testing.assert_allclose(np.asarray(layer.bias), new_b, atol=2e-5)
    assert float(layer.frage_discriminator_loss) == pytest.approx(
        np_d_loss(q["E"], q["mask"], q["W"], q["b"]), rel=1e-5)
    assert len(layer.losses) == 1
    assert float(layer.losses[0]) == pytest.approx(
        -0.3 * np_fool(q["E"], q["mask"], new_w, new_b), rel=1e-4)


def test_moments_layer_adds_lambda_times_the_distance_in_training_only():
    q = _problem()
    layer = FrageMoments(len(q["mask"]), popular=5, coefficient=0.25)
    layer.set_word_counts(np.where(q["mask"] > 0.5, 100, 1))  # before build: kept for it
    E = _f32(q["E"])
    layer(E, training=False)
    assert layer.losses == []
    np.testing.assert_array_equal(np.asarray(layer.popular_mask), q["mask"])
    layer(E, training=True)
    assert float(layer.losses[0]) == pytest.approx(
        0.25 * np_moment_distance(q["E"], q["mask"]), rel=1e-4)


def test_the_split_ranks_counts_and_refuses_bad_sizes():
    counts = np.array([5, 9, 9, 1, 7, 0])
    np.testing.assert_array_equal(popular_mask_from_counts(counts, 3), [0, 1, 1, 0, 1, 0])
    np.testing.assert_array_equal(popular_mask_from_counts(counts, 1), [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(ranked_popular_mask(5, 2), [1, 1, 0, 0, 0])
    layer = FrageAdversary(6, 3, popular=2)
    layer.build()
    np.testing.assert_array_equal(layer.popular_ids(), [0, 1])  # frequency-ranked ids
    layer.set_word_counts(counts)
    np.testing.assert_array_equal(layer.popular_ids(), [1, 2])
    for bad in (0, 6):
        with pytest.raises(ValueError, match="popular"):
            FrageAdversary(6, 3, popular=bad)
    with pytest.raises(ValueError, match="6 counts for a vocabulary of 7"):
        FrageMoments(7, popular=2).set_word_counts(counts)
    with pytest.raises(ValueError, match="coefficient"):
        FrageMoments(7, popular=2, coefficient=0.0)
    with pytest.raises(ValueError, match="adversary_words"):
        FrageAdversary(6, 3, popular=2, adversary_words="popular")


def test_settings_fill_the_codes_defaults_and_refuse_unknown_keys():
    assert frage_settings(None) is None and frage_settings(False) is None
    assert frage_settings(True) == {"method": "adversarial", "popular": 1000,
                                    "coefficient": 0.02, "discriminator_lr": 0.02,
                                    "discriminator_weight_decay": 1.2e-6,
                                    "adversary_words": "rare"}
    assert frage_settings({"method": "moments"}) == {"method": "moments", "popular": 2000,
                                                     "coefficient": 0.01}
    with pytest.raises(ValueError, match="unknown settings"):
        frage_settings({"method": "moments", "discriminator_lr": 0.1})
    with pytest.raises(ValueError, match="method"):
        frage_settings({"method": "mmd"})
    with pytest.raises(ValueError, match="frage must be"):
        AWDLSTM(20, embed_dim=4, hidden_dim=6, num_layers=1, frage=0.5)


KW = dict(embed_dim=6, hidden_dim=8, num_layers=2, alpha=0, beta=0, seed=1, dropout=0,
          dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0)


def test_off_leaves_the_variables_and_config_as_without_it():
    def made(**frage):
        keras.backend.clear_session()  # the same automatic layer names for each
        m = AWDLSTM(40, **frage, **KW)
        m.build()
        return (m, m.get_config(), [(w.path, tuple(w.shape)) for w in m.weights],
                [w.path for w in m.trainable_weights])

    plain, off, on = made(), made(frage=None), made(frage={"popular": 10})
    assert plain[1] == off[1] and "frage" not in off[1]
    assert off[0].frage_layer is None and off[0].frage is None
    assert plain[2] == off[2] and plain[3] == off[3] == on[3]
    assert [w for w in on[2] if "/frage/" not in w[0]] == plain[2]
    assert sorted(p.rsplit("/", 1)[1] for p, _ in on[2] if "/frage/" in p) == [
        "bias", "frage_discriminator_loss", "kernel", "popular_mask"]
    assert {k: v for k, v in on[1].items() if k != "frage"} == plain[1]


@pytest.mark.parametrize("head", ["softmax", {"type": "mos", "num_experts": 2}])
def test_model_adds_the_adversarial_term_in_training_only(head, tmp_path):
    """With the model's optimizer at lr 0, one train step: the loss is the NLL plus
    -lambda L_fool(E, D') with D' one closed-form SGD step of D on L_D(E), and D is D'
    after it; evaluation is the NLL alone. Then fit, save and load."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 40, size=(3, 5)).astype("int32")
    y = rng.integers(0, 40, size=(3, 5)).astype("int32")
    settings = {"popular": 10, "coefficient": 0.5, "discriminator_lr": 0.3}
    frage = AWDLSTM(40, head=head, frage=settings, **KW)
    frage.build()
    frage.frage_layer.set_word_counts(np.bincount(x.reshape(-1), minlength=40) + np.arange(40))
    plain = AWDLSTM(40, head=head, **KW)
    plain.build()
    for source, w in zip([w for w in frage.weights if "/frage/" not in w.path], plain.weights):
        w.assign(np.asarray(source))
    layer = frage.frage_layer
    E = np.asarray(frage.embedding.embeddings, np.float64)
    mask, W0, b0 = (np.asarray(v, np.float64) for v in (layer.popular_mask, layer.kernel,
                                                         layer.bias))
    for m in (frage, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.0))
    ev = [m.evaluate(x, y, batch_size=3, verbose=0, return_dict=True) for m in (frage, plain)]
    assert ev[0]["loss"] == pytest.approx(ev[1]["loss"], rel=1e-6)
    np.testing.assert_array_equal(np.asarray(layer.kernel), W0)  # evaluation steps nothing
    tr = [m.train_on_batch(x, y, return_dict=True) for m in (frage, plain)]
    gw = numeric_grad(lambda w: np_d_loss(E, mask, w, b0), W0)
    gb = numeric_grad(lambda b: np_d_loss(E, mask, W0, b), b0)
    W1 = W0 - 0.3 * (gw + 1.2e-6 * W0)
    b1 = b0 - 0.3 * (gb + 1.2e-6 * b0)
    np.testing.assert_allclose(np.asarray(layer.kernel), W1, atol=1e-5)
    np.testing.assert_allclose(np.asarray(layer.bias), b1, atol=1e-5)
    assert tr[0]["nll"] == pytest.approx(tr[1]["nll"], rel=1e-6)
    assert tr[0]["loss"] - tr[1]["loss"] == pytest.approx(-0.5 * np_fool(E, mask, W1, b1),
                                                          rel=1e-4)
    assert tr[0]["frage_discriminator_loss"] == pytest.approx(np_d_loss(E, mask, W0, b0),
                                                              rel=1e-5)
    frage.compile(optimizer=keras.optimizers.SGD(2.0))
    xs, ys = rng.integers(0, 40, size=(2, 6, 8)).astype("int32")
    hist = frage.fit(xs, ys, batch_size=3, epochs=3, verbose=0).history
    assert all(np.isfinite(hist["loss"])) and hist["nll"][-1] < hist["nll"][0]
    assert not np.allclose(np.asarray(layer.kernel), W1)  # D kept stepping during fit
    path = tmp_path / "frage.keras"
    frage.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.frage == frage.frage and isinstance(loaded.frage_layer, FrageAdversary)
    assert len(loaded.weights) == len(frage.weights)
    for a, b in zip(frage.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(frage(x)), np.asarray(loaded(x)))


def test_model_with_moments_adds_lambda_times_the_distance():
    """Any head: here GSS (FRAGE reads the embedding matrix, not the head's output)."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 30, size=(2, 6)).astype("int32")
    m = AWDLSTM(30, head="gss", frage={"method": "moments", "popular": 12, "coefficient": 0.7},
                **KW)
    plain = AWDLSTM(30, head="gss", **KW)
    for model in (m, plain):
        model.build()
        model.compile(optimizer=keras.optimizers.SGD(0.0))
    for source, w in zip(m.weights, plain.weights):
        w.assign(np.asarray(source))
    assert [w.path.rsplit("/", 1)[1] for w in m.frage_layer.weights] == ["popular_mask"]
    E, mask = (np.asarray(v) for v in (m.embedding.embeddings, m.frage_layer.popular_mask))
    gap = (m.train_on_batch(x, x, return_dict=True)["loss"]
           - plain.train_on_batch(x, x, return_dict=True)["loss"])
    assert gap == pytest.approx(0.7 * np_moment_distance(E, mask), rel=1e-4)


def test_zoo_sets_the_split_from_the_training_counts_and_the_presets_build():
    from zoo.presets import load_preset
    from zoo.runs.builders import from_preset
    from zoo.runs.initial_weights import set_training_word_counts
    small = dict(embed_dim=6, hidden_dim=8, last_dim=6, init="keras")
    model = from_preset("awd_lstm_mos_frage_ptb", **small)
    model.build()
    layer = model.frage_layer
    assert isinstance(layer, FrageMoments) and (layer.popular, layer.coefficient) == (2000,
                                                                                        0.01)
    train = np.concatenate([np.full(50, 7), np.arange(10000)])  # id 7 the most frequent
    set_training_word_counts(model, train, 10000)
    ids = layer.popular_ids()
    assert len(ids) == 2000 and ids[0] == 0 and 7 in ids and 1999 in ids and 2000 not in ids
    wt2 = load_preset("awd_lstm_mos_frage_wt2")
    assert wt2["model"]["frage"] == {"method": "moments", "popular": 8000, "coefficient": 0.02}


def test_the_presets_read_their_commands_as_the_codes_argparse():
    """--moment is store_true (on when given), --adv store_false (off when given): the MoS
    command runs moment matching; without --moment the preset would have no FRAGE."""
    from zoo.presets import load_preset
    from zoo.presets.reference import REFERENCE_DEFAULTS, implied_settings, parse_command
    defaults = REFERENCE_DEFAULTS["ChengyueGongR/Frequency-Agnostic"]
    flags = parse_command(load_preset("awd_lstm_mos_frage_ptb")["reference"]["train"], defaults)
    assert (flags["moment"], flags["adv"], flags["switch"], flags["epochs"]) == (True, False,
                                                                                160, 600)
    preset = load_preset("awd_lstm_mos_frage_ptb")
    implied = implied_settings(preset)
    assert implied["model.frage"] == {"method": "moments", "popular": 2000,
                                      "coefficient": 0.01}
    assert (implied["model.embedding_noise"], implied["training.switch_epoch"]) == (0.15, 160)
    preset["reference"]["train"] = preset["reference"]["train"].replace(" --moment", "")
    assert implied_settings(preset)["model.frage"] is None


BACKEND_SNIPPET = """
import json, os, tempfile, numpy as np, keras
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
rng = np.random.default_rng(0)
x = rng.integers(0, 40, size=(4, 61)).astype("int32")
xs = np.concatenate(x[:, :-1].reshape(4, 6, 10).transpose(1, 0, 2))
ys = np.concatenate(x[:, 1:].reshape(4, 6, 10).transpose(1, 0, 2))
out = {}
for method in ("adversarial", "moments"):
    m = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=10,
                frage={"method": method, "popular": 10}, alpha=0, beta=0, dropout=0,
                dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0)
    m.compile(optimizer=keras.optimizers.SGD(5.0))
    m.build()
    k0 = keras.ops.convert_to_numpy(m.frage_layer.weights[-1])
    h = m.fit(xs, ys, batch_size=4, epochs=2, verbose=0).history
    ev = m.evaluate(xs, ys, batch_size=4, verbose=0, return_dict=True)
    path = os.path.join(tempfile.mkdtemp(), "m.keras"); m.save(path)
    loaded = keras.saving.load_model(path)
    same = np.array_equal(keras.ops.convert_to_numpy(m(xs[:4])),
                          keras.ops.convert_to_numpy(loaded(xs[:4])))
    moved = not np.array_equal(k0, keras.ops.convert_to_numpy(m.frage_layer.weights[-1]))
    out[method] = dict(loss=h["loss"], nll=h["nll"], eval_loss=ev["loss"], eval_nll=ev["nll"],
                       reload_equal=bool(same), moved=bool(moved),
                       d_loss=h.get("frage_discriminator_loss"),
                       reloaded=loaded.get_config().get("frage"))
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["jax", pytest.param("torch", marks=pytest.mark.slow)])
def test_fit_and_reload_on_other_backends(backend):  # torch: 30-45 s on the 2-core machine
    """On JAX the discriminator's step comes back from the stateless train step as the
    layer's non-trainable values; on PyTorch it is copied in place."""
    stdout = run_in_backend(backend, BACKEND_SNIPPET)
    result = json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    for method, r in result.items():
        assert all(np.isfinite(r["loss"])) and r["nll"][-1] < r["nll"][0], (method, r)
        assert r["eval_loss"] == pytest.approx(r["eval_nll"], rel=1e-6)
        assert r["reload_equal"] and r["reloaded"]["method"] == method
    adversarial = result["adversarial"]
    assert adversarial["moved"]  # the last weight, frage_discriminator_loss, was assigned
    assert all(0.0 < v < 5.0 for v in adversarial["d_loss"])
    assert all(loss < nll for loss, nll in zip(adversarial["loss"], adversarial["nll"]))
    assert all(loss > nll for loss, nll in zip(result["moments"]["loss"],
                                               result["moments"]["nll"]))


def test_finetuning_without_frage_starts_from_a_frage_run(tmp_path):
    """`python -m zoo.train --finetune RUN --set model.frage=null` (the code's finetune.py
    has no FRAGE term): the model is built without the layer and takes the run's weights
    (`zoo.runs.initial_weights`, as `--finetune` loads them)."""
    from zoo.runs.builders import from_preset
    from zoo.runs.initial_weights import check_init_model
    small = dict(embed_dim=6, hidden_dim=8, last_dim=6, init="keras")
    trained = from_preset("awd_lstm_mos_frage_ptb", **small)
    trained.build()
    path = tmp_path / "best.keras"
    trained.save(path)
    tuned = from_preset("awd_lstm_mos_frage_ptb", frage=None, **small)
    tuned.build()
    assert tuned.frage_layer is None and "frage" not in tuned.get_config()
    check_init_model(path, tuned, [str(i) for i in range(10000)])
    for a, b in zip([w for w in trained.weights if "/frage/" not in w.path], tuned.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
