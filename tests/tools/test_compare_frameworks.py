"""`python tools/compare_frameworks.py` (the harness in tools/frameworks) and the native
PyTorch peer (tools/frameworks/torch_native.py)."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from tools.frameworks import compare as cf
from tools.frameworks.report import flops_per_token
from tests.conftest import REPO

HAVE_TORCH = importlib.util.find_spec("torch") is not None
KERAS_BACKENDS = [b for b in ("tensorflow", "jax", "torch")
                  if importlib.util.find_spec(b) is not None]

TINY = {
    "description": "tiny MoS AWD-LSTM on a 50-word synthetic language (tests only)",
    "corpus": {"name": "synthetic", "kind": "mixture", "vocab_size": 50, "num_components": 2,
               "component_rank": 4, "temperature": 0.5, "seed": 0, "train_tokens": 4000,
               "valid_tokens": 800, "test_tokens": 200},
    "model": {"embed_dim": 8, "hidden_dim": 16, "num_layers": 2, "last_dim": 12,
              "tie_weights": True, "dropout": 0.1, "dropout_h": 0.1, "dropout_i": 0.1,
              "dropout_e": 0.1, "weight_dropout": 0.2, "alpha": 2.0, "beta": 1.0,
              "head": {"type": "mos", "num_experts": 3, "latent_dropout": 0.1}},
    "training": {"batch_size": 4, "eval_batch_size": 4, "bptt": 10, "lr": 5.0,
                 "weight_decay": 1.2e-6, "clip_norm": 0.25, "seed": 3},
}


def _tiny_preset(tmp_path, **model):
    preset = json.loads(json.dumps(TINY))
    preset["model"].update(model)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(preset))
    return path


# ---- the arithmetic and the configuration ---------------------------------------------------
def test_flops_per_token_from_layer_sizes():
    config = cf.resolve_config("awd_lstm_mos_ptb")
    f = flops_per_token(config, 10_000)
    # 280 -> 960 -> 960 -> 620, MoS K=15 with a tied 280-dim latent, V = 10,000
    lstm = 4 * 960 * (280 + 960) + 4 * 960 * (960 + 960) + 4 * 620 * (960 + 620)
    head = 620 * 15 * 280 + 620 * 15 + 15 * 10_000 * 280
    assert f["lstm_params"] == lstm and f["head_params"] == head
    assert f["train_flops_per_token"] == 6 * (lstm + head)
    assert f["eval_flops_per_token"] == 2 * (lstm + head)
    softmax = flops_per_token(cf.resolve_config("awd_lstm_ptb"), 10_000)
    assert softmax["head_params"] == 10_000 * 400


def test_resolve_config_overrides_and_no_dropout():
    config = cf.resolve_config("awd_lstm_mos_ptb", ["model.hidden_dim=64",
                                                    "training.batch_size=3",
                                                    "model.head.num_experts=2"],
                               no_dropout=True)
    assert config["model"]["hidden_dim"] == 64 and config["training"]["batch_size"] == 3
    assert config["model"]["head"]["num_experts"] == 2
    assert all(config["model"][k] == 0.0 for k in cf.DROPOUTS)
    assert config["model"]["head"]["latent_dropout"] == 0.0
    with pytest.raises(cf.UserError, match="(?i)unknown preset"):
        cf.resolve_config("no_such_preset")
    with pytest.raises(cf.UserError, match="(?i)key=value"):
        cf.resolve_config("synthetic", ["model.hidden_dim"])
    assert cf.resolve_config("synthetic", lstm_kernel="portable")["model"]["use_cudnn"] is False
    assert "use_cudnn" not in cf.resolve_config("synthetic")["model"]


def test_bad_backend_is_a_user_error(tmp_path, capsys):
    assert cf.main(["--preset", "synthetic", "--backends", "theano", "--out",
                    str(tmp_path)]) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_runs_as_a_script_from_anywhere(tmp_path):
    # `python tools/compare_frameworks.py` puts tools/, not the repository, on sys.path.
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "compare_frameworks.py"),
                           "--preset", "synthetic", "--backends", "theano", "--out",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unknown backend" in proc.stderr


@pytest.mark.slow
def test_a_comparison_run_from_another_folder_writes_into_its_relative_out(tmp_path):
    # The workers run with the relative --out of the folder the command was started in, and
    # the memory column says what the run added to the framework's own resident memory.
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "compare_frameworks.py"),
                           "--preset", "synthetic", "--backends", "tensorflow", "--steps", "2",
                           "--warmup", "1", "--threads", "1", "--eval-windows", "2",
                           "--set", "corpus.train_tokens=3000", "--set",
                           "corpus.valid_tokens=600", "--set", "corpus.test_tokens=600",
                           "--set", "corpus.vocab_size=30", "--set", "model.hidden_dim=8",
                           "--set", "model.embed_dim=4", "--out", "cmp/"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "cmp" / "results.json").read_text())["backends"][0]
    assert row["status"] == "ok", row
    assert 0 <= row["peak_rss_added_mib"] <= row["peak_rss_mib"]
    assert row["rss_after_imports_mib"] + row["peak_rss_added_mib"] == pytest.approx(
        row["peak_rss_mib"])
    assert "(peak RSS; run +" in proc.stdout


# ---- the native peer against the Keras model (in process, default backend) ----------------
def _keras_and_native(head, dropout=0.0, seed=0):
    import keras

    from tools.frameworks.roles import export_keras_roles
    from tools.frameworks.torch_native import from_model_config
    from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

    model_cfg = dict(embed_dim=6, hidden_dim=10, num_layers=3, last_dim=6 if head == "softmax"
                     else 9, dropout=dropout, dropout_h=dropout, dropout_i=dropout,
                     dropout_e=dropout, weight_dropout=dropout, alpha=2.0, beta=1.0,
                     head=head)
    keras.utils.set_random_seed(seed)
    k_model = AWDLSTM(30, **model_cfg)
    k_model.build()
    native = from_model_config(model_cfg, 30, seed=seed)
    native.load_roles(export_keras_roles(k_model))
    return k_model, native


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("head", ["softmax", {"type": "mos", "num_experts": 4},
                                  {"type": "moc", "num_experts": 3}])
def test_native_model_equals_keras_model_from_the_same_weights(head):
    import keras
    import torch

    k_model, native = _keras_and_native(head)
    assert sum(p.numel() for p in native.parameters()) == k_model.count_params()
    tokens = np.random.default_rng(1).integers(0, 30, size=(3, 14)).astype("int32")
    # Two windows with carried state, evaluation mode.
    k1, k_states = k_model.forward_with_state(tokens[:, :7], None)
    k2, _ = k_model.forward_with_state(tokens[:, 7:], k_states)
    native.eval()
    with torch.no_grad():
        n1, n_states, _ = native(torch.as_tensor(tokens[:, :7], dtype=torch.long))
        n2, _, _ = native(torch.as_tensor(tokens[:, 7:], dtype=torch.long), n_states)
    for k, n in ((k1, n1), (k2, n2)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(k), n.numpy(), atol=2e-5)
    # Training mode without dropout: same AR + TAR as the Keras model's losses.
    native.train()
    _, _, extra = native(torch.as_tensor(tokens[:, :7], dtype=torch.long))
    k_model.forward_with_state(tokens[:, :7], None, training=True)
    k_extra = sum(float(keras.ops.convert_to_numpy(l)) for l in k_model.losses)
    assert float(extra.detach()) == pytest.approx(k_extra, rel=1e-5)
    # The round trip by role is exact.
    back = native.export_roles()
    from tools.frameworks.roles import export_keras_roles
    for role, value in export_keras_roles(k_model).items():
        np.testing.assert_array_equal(back[role], value)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_native_dropouts_follow_the_awd_lstm_rules():
    import torch

    from tools.frameworks.torch_native import LockedDropout, NativeAWDLSTM, WeightDropLSTM

    locked = LockedDropout(0.5).train()
    y = locked(torch.ones(4, 9, 3))
    assert torch.equal(y, y[:, :1].expand_as(y))          # one mask per sequence, all steps
    assert set(torch.unique(y).tolist()) <= {0.0, 2.0}
    model = NativeAWDLSTM(20, embed_dim=4, hidden_dim=6, num_layers=2, dropout=0.0,
                          dropout_h=0.0, dropout_i=0.0, dropout_e=0.5, weight_dropout=0.0,
                          seed=0).train()
    tokens = torch.tensor([[3, 5, 3, 7, 3, 5]])
    e = model.embed(tokens)
    zero = (e == 0).all(-1)[0]
    assert zero[0] == zero[2] == zero[4] and zero[1] == zero[5]   # a word is dropped everywhere
    layer = WeightDropLSTM(3, 5, weight_dropout=0.5)
    assert [n for n, _ in layer.named_parameters()] == ["weight_ih", "weight_hh", "bias_ih"]
    x = torch.randn(2, 4, 3)
    state = (torch.zeros(2, 5), torch.zeros(2, 5))
    layer.eval()
    a, _ = layer(x, state)
    b, _ = layer(x, state)
    layer.train()
    c, _ = layer(x, state)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    with pytest.raises(ValueError, match="softmax, mos and moc"):
        NativeAWDLSTM(20, head="gss")


# ---- the tool end to end --------------------------------------------------------------------
def _ok(results):
    return {r["backend"]: r for r in results["backends"] if r["status"] == "ok"}


def test_tool_end_to_end_tiny_preset_all_installed_backends(tmp_path, capsys):
    """Every installed backend runs, the report is well formed, parameter counts agree, and
    without dropout the losses of every step, the weights after the steps and the validation
    perplexity agree across backends and with the native peer (the fair-comparison check)."""
    out = tmp_path / "out"
    argv = ["--preset", str(_tiny_preset(tmp_path)), "--steps", "3", "--warmup", "1",
            "--eval-windows", "3", "--window-lengths", "fixed", "--no-dropout",
            "--save-weights", "--threads", "1", "--jobs", "2", "--out", str(out)]
    assert cf.main(argv) == 0
    printed = capsys.readouterr().out
    assert "train words/s" in printed and "parameter counts agree: True" in printed
    results = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()
    assert md.count("| tensorflow |") + md.count("| jax |") + md.count("| torch |") >= 1
    assert "| backend | status | train words/s |" in md
    assert "FLOP per training token" in md

    expected = set(KERAS_BACKENDS) | ({"torch-native"} if HAVE_TORCH else set())
    ok = _ok(results)
    assert set(ok) == expected, {r["backend"]: r.get("reason") for r in results["backends"]}
    for r in results["backends"]:
        if r["backend"] not in expected:
            assert r["status"] == "skipped" and "not installed" in r["reason"]

    assert results["agreement"]["params_agree"]
    params = {r["params"] for r in ok.values()} | {results["init"]["params"]}
    assert len(params) == 1
    for r in ok.values():
        assert r["steps"] == 3 and len(r["step_times_s"]) == 3
        assert r["train_words_per_s"] > 0 and r["eval_words_per_s"] > 0
        assert r["peak_memory_mib"] > 0 and r["memory_kind"] == "peak RSS"
        assert r["cudnn"] == "no" and r["floor_train_words_per_s"] > 0
        assert r["versions"]["python"]

    # The LSTM kernel that ran: no fused kernel for TensorFlow / JAX on a CPU; PyTorch's own.
    expected_kernels = {"tensorflow": "portable", "jax": "portable", "torch": "fused",
                        "torch-native": "fused"}
    assert {name: r["lstm_kernel"] for name, r in ok.items()} == {
        name: expected_kernels[name] for name in ok}
    ref = next(iter(ok.values()))
    for name, r in ok.items():
        np.testing.assert_allclose(r["step_losses"], ref["step_losses"], rtol=1e-5,
                                   err_msg=name)
        np.testing.assert_allclose(r["running_loss"], ref["running_loss"], rtol=1e-5,
                                   err_msg=name)
        assert r["first_step_loss"] == pytest.approx(ref["first_step_loss"], rel=1e-5)
        assert r["valid_perplexity_after_steps"] == pytest.approx(
            ref["valid_perplexity_after_steps"], rel=1e-5)
    assert results["agreement"]["first_step_loss_max_rel_diff"] < 1e-5
    # The first step's loss is that of the shared initial weights: about log V on 50 words.
    assert abs(ref["first_step_nll"] - np.log(50)) < 0.5
    init = dict(np.load(out / "init_weights.npz"))
    after = {name: dict(np.load(out / f"weights_{name}.npz")) for name in ok}
    first = next(iter(after.values()))
    assert max(np.abs(first[k] - init[k]).max() for k in init) > 1e-3   # training moved them
    for name, weights in after.items():
        for role, value in weights.items():
            np.testing.assert_allclose(value, first[role], atol=2e-6, err_msg=f"{name} {role}")


def test_missing_backend_is_reported_as_skipped(tmp_path, monkeypatch):
    real = cf.backend_available
    monkeypatch.setattr(cf, "backend_available", lambda name: (
        (False, "Python package 'jax' is not installed") if name == "jax" else real(name)))
    results = cf.run(["--preset", str(_tiny_preset(tmp_path)), "--backends", "jax,torch",
                      "--steps", "2", "--out", str(tmp_path / "out")])
    skipped, ran = results["backends"]
    assert skipped == {"backend": "jax", "status": "skipped",
                       "reason": "Python package 'jax' is not installed"}
    assert ran["backend"] == "torch" and ran["status"] == "ok"
    assert "skipped: Python package 'jax' is not installed" in (
        tmp_path / "out" / "results.md").read_text()


def test_no_requested_backend_installed_is_a_user_error_before_any_work(tmp_path, monkeypatch,
                                                                       capsys):
    """Nothing is prepared (no worker, no initial weights) when no requested backend can
    run: the one-line error names each one's reason and what to do."""
    monkeypatch.setattr(cf, "backend_available", lambda name: (
        False, f"Python package {name!r} is not installed"))
    monkeypatch.setattr(cf, "run_worker", lambda *a, **k: pytest.fail("a worker started"))
    assert cf.main(["--preset", str(_tiny_preset(tmp_path)), "--backends", "jax,torch",
                    "--steps", "2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "none of --backends can run here" in err
    assert "jax: Python package 'jax' is not installed" in err
    assert "torch: Python package 'torch' is not installed" in err


@pytest.mark.slow
def test_tool_with_dropout_epochs_and_plot(tmp_path):
    """Dropout on (different random streams), variable window lengths, one epoch: every
    backend learns, the perplexities agree statistically, and the figure is written."""
    out = tmp_path / "out"
    argv = ["--preset", str(_tiny_preset(tmp_path)), "--steps", "5", "--warmup", "1",
            "--epochs", "2", "--plot", "--threads", "1", "--jobs", "2", "--out", str(out)]
    assert cf.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    ok = _ok(results)
    assert (out / "valid_perplexity_vs_time.png").stat().st_size > 1000
    finals = []
    for name, r in ok.items():
        curve = r["epochs"]
        assert [e["epoch"] for e in curve] == [0, 1, 2]
        assert curve[-1]["val_perplexity"] < curve[0]["val_perplexity"], name
        assert curve[-1]["train_time_s"] > curve[1]["train_time_s"] > 0
        finals.append(curve[-1]["val_perplexity"])
    assert max(finals) / min(finals) < 1.15
