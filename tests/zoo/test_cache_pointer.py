"""The continuous cache pointer (zoo.cache_pointer) against a direct NumPy computation of
salesforce pointer.py's loop, on TensorFlow, JAX and PyTorch."""

import json
import shutil

import keras
import numpy as np
import pytest

from tests.backends import run_in_backend
from zoo import cache_pointer as cp

V = 30


def _model():
    import zoo
    keras.utils.set_random_seed(11)
    model = zoo.AWDLSTM(V, embed_dim=8, hidden_dim=12, num_layers=2, dropout=0.0,
                        dropout_h=0.0, dropout_i=0.0, dropout_e=0.0, weight_dropout=0.0)
    model.build()
    return model


def direct_pointer_perplexity(log_probs, hidden, ids, window, theta, lam, bptt):
    """pointer.py's evaluate() position by position: one-hot next-word history, history of
    outputs, cut to `window` after each chunk of `bptt`, the pointer where start + idx >
    window; NLL over the positions scored."""
    next_hist, h_hist, nll = [], [], 0.0
    for i in range(0, len(ids) - 1, bptt):
        targets = ids[i + 1:min(i + 1 + bptt, len(ids))]
        start = len(next_hist)
        for t, target in enumerate(targets):
            one_hot = np.zeros(V)
            one_hot[target] = 1.0
            next_hist.append(one_hot)
            h_hist.append(hidden[i + t])
        for idx, target in enumerate(targets):
            p = np.exp(log_probs[i + idx])
            if start + idx > window:
                lo, hi = start + idx - window, start + idx
                logits = np.array(h_hist[lo:hi]) @ hidden[i + idx]
                attn = np.exp(theta * logits - np.max(theta * logits))
                attn /= attn.sum()
                ptr = (attn[:, None] * np.array(next_hist[lo:hi])).sum(0)
                p = lam * ptr + (1 - lam) * p
            nll -= np.log(p[target])
        next_hist, h_hist = next_hist[-window:], h_hist[-window:]
    return float(np.exp(nll / (len(ids) - 1)))


def _whole_pass(model, ids):
    out = model.backbone(ids[None, :-1], training=False)
    log_probs = keras.ops.convert_to_numpy(model.head_log_probs(out))[0].astype("float64")
    hidden = keras.ops.convert_to_numpy(out["raw_layer_outputs"][-1])[0].astype("float64")
    return log_probs, hidden


@pytest.mark.parametrize("window, bptt", [(7, 10), (12, 5), (40, 100)])
def test_equals_the_direct_computation(window, bptt):
    model = _model()
    ids = np.random.default_rng(0).integers(0, V, size=62).astype("int32")
    settings = cp.Settings(window=window, theta=1.7, lambdasm=0.3, bptt=bptt)
    ours = cp.evaluate_with_pointer(model, ids, settings)
    log_probs, hidden = _whole_pass(model, ids)
    expected = direct_pointer_perplexity(log_probs, hidden, ids, window, 1.7, 0.3, bptt)
    assert ours["perplexity"] == pytest.approx(expected, rel=1e-5)
    targets = ids[1:]
    model_only = np.exp(-log_probs[np.arange(len(targets)), targets].mean())
    assert ours["model_perplexity"] == pytest.approx(model_only, rel=1e-5)
    assert ours["perplexity"] != pytest.approx(model_only, rel=1e-4)  # the pointer acts


def test_lambda_zero_is_the_model_alone():
    model = _model()
    ids = np.random.default_rng(1).integers(0, V, size=40).astype("int32")
    r = cp.evaluate_with_pointer(model, ids, cp.Settings(window=5, lambdasm=0.0, bptt=8))
    assert r["perplexity"] == pytest.approx(r["model_perplexity"], rel=1e-9)


def test_the_pointer_helps_on_text_that_repeats_few_words():
    """An untrained model spreads its probability over all 30 words; text that keeps
    using 6 of them is predicted far better once the cache holds them."""
    model = _model()
    words = np.random.default_rng(2).choice(V, size=6, replace=False)
    ids = np.tile(words, 12).astype("int32")
    r = cp.evaluate_with_pointer(model, ids, cp.Settings(window=30, theta=1.0,
                                                         lambdasm=0.5, bptt=20))
    assert r["perplexity"] < 0.65 * r["model_perplexity"], r


def test_command_line_and_errors(tiny_run, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    out = tmp_path / "ptr.json"
    assert cp.main([str(run), "--window", "50", "--bptt", "200", "--json", str(out),
                    "--quiet"]) == 0
    assert "perplexity with the cache pointer" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["settings"]["window"] == 50 and result["tokens"] == 999
    acc = EventAccumulator(str(run / "logs" / "evaluation"))
    acc.Reload()
    assert "cache_pointer/test_perplexity" in acc.Tags()["tensors"]
    assert cp.main([str(run), "--lambdasm", "1.5", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lambdasm must be in [0, 1]" in err[0]


def test_presets_carry_the_published_settings():
    from zoo.presets import load_preset
    ptb = load_preset("awd_lstm_ptb")["cache_pointer"]
    assert (ptb["window"], ptb["theta"], ptb["lambdasm"], ptb["bptt"]) == (500, 1.0, 0.1, 5000)
    wt2 = load_preset("awd_lstm_wt2")["cache_pointer"]
    assert (wt2["window"], wt2["theta"], wt2["lambdasm"], wt2["bptt"]) == (
        3785, 0.662, 0.1279, 2000)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_equal_the_direct_computation(backend):
    out = run_in_backend(backend, """
        import numpy as np
        from tests.zoo.test_cache_pointer import _model, _whole_pass, direct_pointer_perplexity
        from zoo import cache_pointer as cp
        model = _model()
        ids = np.random.default_rng(0).integers(0, 30, size=62).astype("int32")
        ours = cp.evaluate_with_pointer(model, ids, cp.Settings(window=7, theta=1.7,
                                                                lambdasm=0.3, bptt=10))
        lp, h = _whole_pass(model, ids)
        expected = direct_pointer_perplexity(lp, h, ids, 7, 1.7, 0.3, 10)
        print("RATIO", ours["perplexity"] / expected)
    """)
    ratio = float(out.split("RATIO")[1])
    assert ratio == pytest.approx(1.0, abs=1e-5)
