"""Dynamic evaluation (zoo.dynamic_eval): the update formula against NumPy, the statistics,
the two hyperparameter scalings, parity with the MoS code's dynamiceval.py (PyTorch peer on
identical weights), adaptation to drifting text, and the command line.

The TensorFlow session runs the formula test and the softmax parity test again under JAX
and PyTorch (one subprocess each)."""

import json
import shutil

import keras
import numpy as np
import pytest

from tflm import backends
from zoo import dynamic_eval as de
from tests.backends import run_tests_in_backend

V, E, H, BPTT = 30, 8, 12, 5
NO_DROPOUT = dict(dropout=0.0, dropout_h=0.0, dropout_i=0.0, dropout_e=0.0,
                  weight_dropout=0.0)


def _model(head="softmax", last=E):
    import zoo
    keras.utils.set_random_seed(5)
    model = zoo.AWDLSTM(V, embed_dim=E, hidden_dim=H, num_layers=3, last_dim=last, head=head,
                        init="pytorch", lstm_biases=2, **NO_DROPOUT)
    model.build()
    return model


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, V, size=n).astype("int32")


def _values(model):
    return [keras.ops.convert_to_numpy(v).copy() for v in model.trainable_variables]


def test_two_windows_follow_the_update_formula():
    """theta1 = theta0 - eta g0 / (MS + eps); theta2 = theta1 + lambda min(decrate, 1/lambda)
    (theta0 - theta1) - eta g1 / (MS + eps), g_k the window's gradient at theta_k with the
    state carried: computed here in NumPy from the model's gradients."""
    model = _model()
    rng = np.random.default_rng(0)
    variables = model.trainable_variables
    lamb, lr, eps = 0.5, 0.05, 0.01
    ms = [rng.uniform(0.01, 1.0, v.shape).astype("float32") for v in variables]
    decrate = [rng.uniform(0.0, 4.0, v.shape).astype("float32") for v in variables]  # > 1/lambda too
    stats = de.Statistics(ms=ms, decrate=decrate, num_batches=1, train_loss=0.0)
    ids = _ids(2 * BPTT + 1, 1)
    theta0 = _values(model)
    backend = backends.current()
    loss0, g0, states = backend.window_gradients(model, ids[None, :BPTT], ids[None, 1:BPTT + 1],
                                                 None)
    theta1 = [t - lr * keras.ops.convert_to_numpy(g) / (m + eps)
              for t, g, m in zip(theta0, g0, ms)]
    for v, t in zip(variables, theta1):
        v.assign(t)
    loss1, g1, _ = backend.window_gradients(model, ids[None, BPTT:2 * BPTT],
                                            ids[None, BPTT + 1:], states)
    theta2 = [t1 + lamb * np.minimum(d, 1 / lamb) * (t0 - t1)
              - lr * keras.ops.convert_to_numpy(g) / (m + eps)
              for t0, t1, g, d, m in zip(theta0, theta1, g1, decrate, ms)]
    for v, t in zip(variables, theta0):
        v.assign(t)

    settings = de.Settings(lamb=lamb, lr=lr, epsilon=eps, bptt=BPTT)
    result = de.dynamic_evaluate(model, ids, settings, stats, restore=False)
    for ours, expected in zip(_values(model), theta2):
        np.testing.assert_allclose(ours, expected, atol=2e-6, rtol=1e-5)
    mean_nll = (float(keras.ops.convert_to_numpy(loss0)) + float(
        keras.ops.convert_to_numpy(loss1))) / 2
    assert result["perplexity"] == pytest.approx(np.exp(mean_nll), rel=1e-5)
    assert result["tokens"] == 2 * BPTT


def test_weights_are_restored_and_a_zero_rate_changes_nothing():
    model = _model()
    before = _values(model)
    ids = _ids(23, 2)
    stats = de.gradient_statistics(model, _ids(400, 3), de.Settings(batch_size=4, bptt=BPTT))
    tiny = de.Settings(lamb=0.02, lr=1e-30, epsilon=1e-3, bptt=BPTT)
    still = de.dynamic_evaluate(model, ids, tiny, stats)
    assert still["perplexity"] == pytest.approx(de.static_perplexity(model, ids, BPTT),
                                                rel=1e-5)
    de.dynamic_evaluate(model, ids, de.Settings(lr=0.5, bptt=BPTT), stats)
    for a, b in zip(before, _values(model)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scaling", ["old", "new", "lamb"])
def test_statistics_are_the_root_sum_of_squared_window_gradients(scaling):
    """old: MS = sqrt(sum g^2), gsum = sum_p mean(MS_p); new: MS = sqrt(sum g^2 / n),
    gsum = mean_p mean(MS_p); lamb: MS as new, gsum = the mean over every element."""
    model = _model()
    train = _ids(4 * 17, 4)  # 4 streams of 17: windows 5, 5, 5, and a last of 1 left out
    settings = de.Settings(batch_size=4, bptt=BPTT, scaling=scaling)
    stats = de.gradient_statistics(model, train, settings)
    assert stats.num_batches == 3
    streams = train.reshape(4, 17)
    sums, states = [0.0] * len(model.trainable_variables), None
    for i in (0, 5, 10):
        _, grads, states = backends.current().window_gradients(
            model, streams[:, i:i + 5], streams[:, i + 1:i + 6], states)
        sums = [s + keras.ops.convert_to_numpy(g).astype("float64") ** 2
                for s, g in zip(sums, grads)]
    if scaling == "old":
        ms = [np.sqrt(s) for s in sums]
        gsum = sum(m.mean() for m in ms)
    else:
        ms = [np.sqrt(s / 3) for s in sums]
        everything = np.concatenate([m.ravel() for m in ms])
        gsum = (np.mean([m.mean() for m in ms]) if scaling == "new" else everything.mean())
    for ours, expected in zip(stats.ms, ms):
        np.testing.assert_allclose(ours, expected, rtol=2e-5, atol=1e-9)
    for ours, m in zip(stats.decrate, ms):
        np.testing.assert_allclose(ours, m / gsum, rtol=2e-5, atol=1e-9)


def test_the_new_scaling_is_the_old_one_in_other_units():
    model = _model()
    train, ids = _ids(4 * 26, 6), _ids(31, 7)
    old = de.Settings(lamb=0.3, lr=0.02, epsilon=0.01, batch_size=4, bptt=BPTT)
    stats_old = de.gradient_statistics(model, train, old)
    n, tensors = stats_old.num_batches, len(model.trainable_variables)
    lamb, lr, eps = de.old_to_new(old.lamb, old.lr, old.epsilon, tensors, n)
    assert de.new_to_old(lamb, lr, eps, tensors, n) == pytest.approx(
        (old.lamb, old.lr, old.epsilon))
    new = de.Settings(lamb=lamb, lr=lr, epsilon=eps, batch_size=4, bptt=BPTT, scaling="new")
    stats_new = de.gradient_statistics(model, train, new)
    a = de.dynamic_evaluate(model, ids, old, stats_old, restore=False)
    adapted_old = _values(model)
    model = _model()
    b = de.dynamic_evaluate(model, ids, new, stats_new, restore=False)
    assert b["perplexity"] == pytest.approx(a["perplexity"], rel=1e-5)
    for x, y in zip(adapted_old, _values(model)):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("head", ["softmax", "mos"])
def test_equals_the_mos_codes_dynamiceval_on_identical_weights(head):
    torch = pytest.importorskip("torch")
    from tflm.testing.reference_peer import (ReferenceRNNModel, load_keras_weights,
                                             peer_weights_as_keras, reference_dynamic_eval)
    last = E if head == "softmax" else 10
    spec = "softmax" if head == "softmax" else {"type": "mos", "num_experts": 3}
    model = _model(spec, last)
    peer = ReferenceRNNModel(V, E, H, last, 3, head=head,
                             **({"n_experts": 3} if head == "mos" else {}))
    load_keras_weights(peer, model)
    train, ids = _ids(6 * 31, 8), _ids(48, 9)  # 47 positions: windows of 5, the last of 2
    settings = de.Settings(lamb=0.075, lr=0.02, epsilon=0.001, batch_size=6, bptt=BPTT)
    stats = de.gradient_statistics(model, train, settings)
    ours = de.dynamic_evaluate(model, ids, settings, stats, restore=False)
    theirs = reference_dynamic_eval(peer, train, ids, settings.lamb, settings.lr,
                                    settings.epsilon, batch_size=6, bptt=BPTT)
    assert ours["perplexity"] == pytest.approx(theirs, rel=2e-5)
    expected = peer_weights_as_keras(peer)
    values = {v.path.split("/", 1)[1]: keras.ops.convert_to_numpy(v)
              for v in model.trainable_variables}
    for suffix, value in expected.items():
        [key] = [k for k in values if k.endswith(suffix)]
        np.testing.assert_allclose(values[key], value, atol=2e-5, rtol=1e-4, err_msg=suffix)
    del torch


@pytest.mark.slow  # 11 s; no README claim (the adaptation: the MoS-code parity tests here)
def test_adapts_to_text_whose_statistics_drift(tiny_run):
    """The tiny run's model, trained on one Markov language, meets a test split whose second
    half comes from another: dynamic evaluation ends well below static evaluation."""
    from tflm.data.synthetic import markov_language
    from zoo.runs.saved_run import open_run
    run = open_run(tiny_run)
    first = np.asarray(run.corpus.split("test"))[:400]
    other = markov_language(40, seed=99).sample(600, seed=1)
    ids = np.concatenate([first, other]).astype("int32")
    settings = de.Settings(lamb=0.02, lr=0.01, epsilon=0.001, batch_size=20, bptt=10,
                           max_batches=10)
    stats = de.gradient_statistics(run.model, run.corpus.split("train"), settings)
    static = de.static_perplexity(run.model, ids, 10)
    dynamic = de.dynamic_evaluate(run.model, ids, settings, stats)["perplexity"]
    static_first = de.static_perplexity(run.model, first, 10)
    assert dynamic < 0.9 * static, (dynamic, static)
    # On the first part (the training language) adaptation neither helps nor hurts much.
    assert de.dynamic_evaluate(run.model, first, settings, stats)["perplexity"] < \
        1.05 * static_first


def test_command_line(tiny_run, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    out = tmp_path / "dyn.json"
    assert de.main([str(run), "--batch-size", "10", "--max-batches", "20", "--json",
                    str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "test perplexity with dynamic evaluation" in printed
    result = json.loads(out.read_text())
    assert result["statistics_windows"] == 20 and result["tokens"] == 999
    assert result["settings"]["lamb"] == de.DEFAULTS["lamb"]
    acc = EventAccumulator(str(run / "logs" / "evaluation"))  # every event file in the folder
    acc.Reload()
    assert "dynamic_eval/test_perplexity" in acc.Tags()["tensors"]


def test_the_preset_carries_the_published_settings(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    config = json.loads((run / "config.json").read_text())
    config["dynamic_evaluation"] = {"lamb": 0.075, "epsilon": 0.002}
    (run / "config.json").write_text(json.dumps(config))
    from zoo.runs.saved_run import open_run
    settings = de.settings_for(open_run(run), {"lr": 0.001, "lamb": None})
    assert (settings.lamb, settings.epsilon, settings.lr) == (0.075, 0.002, 0.001)
    from zoo.presets import load_preset
    mos = load_preset("awd_lstm_mos_ptb")["dynamic_evaluation"]
    assert (mos["lamb"], mos["lr"], mos["epsilon"]) == (0.075, 0.002, 0.001)
    assert load_preset("awd_lstm_mos_wt2")["dynamic_evaluation"]["epsilon"] == 0.002
    lamb = load_preset("mogrifier_ptb")["dynamic_evaluation"]  # deepmind/lamb's defaults
    assert (lamb["scaling"], lamb["lamb"], lamb["lr"], lamb["epsilon"]) == (
        "lamb", 0.02, 0.001, 1e-5)


@pytest.mark.parametrize("args, message", [
    (["--lamb", "0"], "lamb must be a number > 0"),
    (["--batch-size", "5000"], "the statistics pass needs at least"),
])
def test_bad_settings_are_one_line_errors(tiny_run, capsys, args, message):
    assert de.main([str(tiny_run), "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_missing_run_is_a_one_line_error(tmp_path, capsys):
    assert de.main([str(tmp_path / "nothing"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such run directory or model file" in err[0]


@pytest.mark.parametrize("backend", ["jax", pytest.param("torch", marks=pytest.mark.slow)])
def test_formula_and_parity_hold_on_the_other_keras_backends(backend):
    out = run_tests_in_backend(backend, __file__,
                               "update_formula or identical_weights and softmax", timeout=600)
    assert "2 passed" in out, out[-2000:]
