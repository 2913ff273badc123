"""`python -m zoo.train` end to end on a tiny synthetic corpus, and its errors."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.backends import run_in_backend
from tests.conftest import REPO
from zoo import train
from zoo.runs.builders import pad_to_multiple
from zoo.runs.corpora import load_data
from zoo.runs.settings import TrainingSettings

TINY = ["--set", "corpus.train_tokens=6000", "--set", "corpus.valid_tokens=1500",
        "--set", "corpus.test_tokens=1500", "--set", "corpus.vocab_size=40",
        "--set", "model.hidden_dim=16", "--set", "model.embed_dim=8",
        "--set", "training.bptt=10", "--batch-size", "8", "--quiet"]


def test_main_job_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--epochs", "2", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "optimal perplexity" in printed and "test perplexity" in printed
    for name in ("config.json", "metrics.json", "best.keras", "final.keras", "vocab.txt"):
        assert (out / name).exists(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2
    assert 1.0 < metrics["valid_perplexity"] < 40.0 * 1.5
    # Where the time went: each epoch's loop, first step and validation, the run's phases.
    for epoch in metrics["history"]:
        assert 0 < epoch["first_step_seconds"] <= epoch["train_seconds"]
        assert 0 < epoch["validation_seconds"]
        assert epoch["train_seconds"] + epoch["validation_seconds"] <= epoch["epoch_seconds"]
    seconds = metrics["seconds"]
    assert {"load_data", "build", "fit", "save", "load_best", "evaluate_test",
            "total"} <= set(seconds)
    assert sum(h["epoch_seconds"] for h in metrics["history"]) <= seconds["fit"]
    assert sum(v for k, v in seconds.items() if k != "total") <= seconds["total"]
    # No averaging: best.keras holds the weights the best epoch validated, so that epoch's
    # validation is the final valid figure (checked against a fresh evaluation below).
    best = metrics["history"][metrics["best_epoch"] - 1]
    assert metrics["evaluation"]["valid_from"] == f"epoch {metrics['best_epoch']}'s validation"
    assert metrics["valid_perplexity"] == best["val_perplexity"]
    assert "evaluate_valid" not in seconds
    assert metrics["optimal_perplexity"] < metrics["valid_perplexity"]
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["batch_size"] == 8 and config["model"]["hidden_dim"] == 16
    events = list((out / "logs").rglob("events.out.tfevents.*"))
    assert events, "TensorBoard event files must be written"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set()
    for f in events:
        acc = EventAccumulator(str(f)); acc.Reload()
        tags |= set(acc.Tags().get("tensors", [])) | set(acc.Tags().get("scalars", []))
    assert {"epoch_perplexity", "epoch_words_per_second", "epoch_learning_rate",
            "epoch_grad_norm", "epoch_loss", "top_predictions"} <= tags, tags
    import tensorflow as tf
    logs = out / "logs"
    assert "metadata.tsv" in (logs / "projector_config.pbtxt").read_text()
    matrix = tf.train.load_checkpoint(str(logs)).get_tensor(
        "embedding/.ATTRIBUTES/VARIABLE_VALUE")
    assert matrix.shape == (40, 8)
    assert len((logs / "metadata.tsv").read_text().splitlines()) == 40
    for listed in ("train", "validation", "evaluation"):  # each run the projector lists: words
        assert "metadata.tsv" in (logs / listed / "projector_config.pbtxt").read_text()
        assert (logs / listed / "metadata.tsv").read_text() == (logs / "metadata.tsv").read_text()
    # The best model reproduces the reported validation perplexity.
    import keras
    from tflm import data
    model = keras.saving.load_model(out / "best.keras")
    corpus, _ = load_data(config["corpus"], None)
    ds = data.lm_dataset(corpus.valid, config["training"]["eval_batch_size"], 10, train=False)
    ppl = model.evaluate(ds, verbose=0, return_dict=True)["perplexity"]
    assert ppl == pytest.approx(metrics["valid_perplexity"], rel=1e-5)
    # A finished run is never overwritten.
    assert train.main(["--epochs", "1", "--out", str(out), *TINY]) == 2
    assert "already holds a finished run" in capsys.readouterr().err


def test_the_final_model_is_evaluated_when_asked(tmp_path, capsys):
    """training.final_evaluation.model = "final": the figures are final.keras's (the
    overfitted model of the flooding tables), the validation evaluated afresh."""
    out = tmp_path / "run"
    # a rate at which the validation perplexity jumps about: the last epoch is not the best
    assert train.main(["--epochs", "4", "--out", str(out), *TINY, "--set",
                       'training.final_evaluation={"model": "final"}', "--set",
                       "training.lr=60"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_epoch"] < 4, metrics["history"]
    assert metrics["evaluation"]["model"] == "final.keras"
    assert "valid_from" not in metrics["evaluation"]
    import keras
    from tflm import data
    config = json.loads((out / "config.json").read_text())
    corpus, _ = load_data(config["corpus"], None)
    ds = data.lm_dataset(corpus.test, config["training"]["test_batch_size"], 10, train=False)
    final = keras.saving.load_model(out / "final.keras")
    assert final.evaluate(ds, verbose=0, return_dict=True)["perplexity"] == pytest.approx(
        metrics["test_perplexity"], rel=1e-5)
    assert train.main(["--out", str(tmp_path / "bad"), *TINY, "--set",
                       'training.final_evaluation={"model": "last"}']) == 2
    assert "must be one of 'best', 'final'" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--preset", "no_such_preset"], "Unknown preset"),
    (["--head", "no_such_head"], "unknown head"),
    (["--corpus", "/nonexistent/corpus_dir"], "nonexistent"),
    (["--set", "training.optimizer=rmsprop"], "unknown optimizer"),
    (["--set", "nonsense"], "key=value"),
    (["--set", "training.pad_to_multiple=0"], "pad_to_multiple must be a positive integer"),
    (["--set", "training.steps_per_execution=0"],
     "steps_per_execution must be a positive integer"),
])
def test_bad_input_is_one_line_error(args, message, tmp_path, capsys):
    code = train.main([*args, "--out", str(tmp_path / "r"), *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message.lower() in err.lower() and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r" / "metrics.json").exists()


def test_vocabulary_mismatched_checkpoint_is_refused(tmp_path, capsys):
    first = tmp_path / "a"
    assert train.main(["--epochs", "1", "--out", str(first), *TINY]) == 0
    code = train.main(["--epochs", "1", "--out", str(tmp_path / "b"), "--init-from",
                       str(first / "final.keras"), *TINY, "--set", "corpus.vocab_size=41"])
    err = capsys.readouterr().err
    assert code == 2 and "vocabulary" in err
    assert not (tmp_path / "b" / "metrics.json").exists()


def test_nan_loss_stops_with_epoch_and_step(tmp_path, capsys):
    code = train.main(["--epochs", "1", "--out", str(tmp_path / "n"), *TINY,
                       "--set", "training.lr=1e38", "--set", "training.clip_norm=null"])
    err = capsys.readouterr().err
    assert code == 3 and "epoch 1, step" in err
    assert not (tmp_path / "n" / "metrics.json").exists()


# TensorFlow's start-up lines (`zoo.runtime.quiet_start`): absl's banner, C++ log lines
# ("I0000 00:00:1795461606.546738   30094 cudart_stub.cc:31] ..."), the CPU-instructions note.
START_UP_NOISE = re.compile(r"^(WARNING: All log messages before absl|[IWE]\d{4} \d\d:\d\d:"
                            r"\d\d\.\d+ +\d+ \S+:\d+\]|To enable the following instructions)",
                            re.MULTILINE)


def test_cli_module_runs_without_start_up_noise(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # a user's shell
    proc = subprocess.run([sys.executable, "-m", "zoo.train", "--epochs", "1", "--out",
                           str(tmp_path / "cli"), *TINY], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "valid perplexity" in proc.stdout
    assert not START_UP_NOISE.findall(proc.stderr), proc.stderr[-2000:]
    # the command line froze the start-up's objects, then the model's (zoo.runtime.python_gc)
    frozen = json.loads((tmp_path / "cli" / "metrics.json").read_text())["gc_frozen"]
    assert len(frozen) == 2 and frozen[0] > 100_000 and frozen[1] > 0


def _killed_after_first_checkpoint(args):
    """`zoo.train`'s main with ARGS in a fresh process that dies (exit 137, no clean-up, as
    when killed) right after its first epoch checkpoint is written."""
    code = f"""if True:
        import os, sys
        from zoo import train
        from zoo.runs import checkpoint
        save = checkpoint.save_checkpoint
        def save_then_die(*args, **kwargs):
            save(*args, **kwargs)
            os._exit(137)
        checkpoint.save_checkpoint = save_then_die
        sys.exit(train.main({list(args)!r}))
    """
    return subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                          capture_output=True, text=True, timeout=600)


# Slow tier: in CI, test_train_faults' runs killed in a checkpoint swap resume to the same
# result, and test_train_errors' Ctrl-C test refuses the command again without --resume.
@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, capsys):
    """Killed after its first epoch's checkpoint (a process of its own, ended with no
    clean-up), the run resumes to the figures of the uninterrupted run. The uninterrupted
    run, the refusal of the command again without --resume and the resumed run are made in
    this process (a run's figures do not depend on what its process ran before; the
    command line's --resume in a process of its own: tests/zoo/test_train_faults.py)."""
    args = ["--epochs", "2", *TINY, "--set", "model.dropout=0.2",
            "--set", "model.weight_dropout=0.3"]
    assert train.main([*args, "--out", str(tmp_path / "full")]) == 0
    killed = _killed_after_first_checkpoint([*args, "--out", str(tmp_path / "cut")])
    assert killed.returncode == 137
    assert not (tmp_path / "cut" / "metrics.json").exists()
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert state["epoch"] == 1
    capsys.readouterr()
    assert train.main([*args, "--out", str(tmp_path / "cut")]) == 2
    assert "--resume" in capsys.readouterr().err
    assert train.main(["--resume", str(tmp_path / "cut"), "--quiet"]) == 0
    a = json.loads((tmp_path / "full" / "metrics.json").read_text())
    b = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert [h["epoch"] for h in b["history"]] == [1, 2]
    for key in ("perplexity", "val_perplexity"):
        np.testing.assert_allclose([h[key] for h in b["history"]],
                                   [h[key] for h in a["history"]], rtol=1e-5)
    assert b["test_perplexity"] == pytest.approx(a["test_perplexity"], rel=1e-5)


def test_corrupt_checkpoint_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--epochs", "1", "--out", str(out), *TINY]) == 0
    (out / "metrics.json").unlink()
    state = out / "checkpoint" / "state.json"
    state.write_text("{not json")
    assert train.main(["--resume", str(out), "--quiet"]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert state.read_text() == "{not json", "the checkpoint must not be touched"
    assert train.main(["--resume", str(tmp_path / "nothing"), "--quiet"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_et_asgd_run_with_regularizers_by_set_then_finetune(tmp_path, capsys):
    """ET-ASGD (averaging from epoch 2) with AdvSoft, embedding noise, MLE-CosReg and partial
    shuffle turned on with --set (as the ablation presets set them); then the AdvSoft
    README's finetuning change (alpha 0.028, no embedding noise) from the averaged model, at
    lr 0, so that the model it starts from is the one it keeps."""
    out = tmp_path / "asgd"
    code = train.main(["--epochs", "3", "--out", str(out), *TINY,
                       "--set", "training.optimizer=asgd", "--set", "training.switch=epoch",
                       "--set", "training.switch_epoch=1",
                       "--set", "model.head.adversarial_alpha=0.005",
                       "--set", "model.embedding_noise=0.15",
                       "--set", "model.cosine_regularization=0.5",
                       "--set", "training.partial_shuffle=true"])
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["averaging"] for h in metrics["history"]] == [0.0, 1.0, 1.0]
    assert all(np.isfinite(h["val_perplexity"]) for h in metrics["history"])
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["embedding_noise"] == 0.15
    assert config["model"]["cosine_regularization"] == 0.5
    assert config["training"]["partial_shuffle"] is True
    # best.keras holds averaged weights: the final valid figure is evaluated afresh.
    assert "valid_from" not in metrics["evaluation"] and "evaluate_valid" in metrics["seconds"]
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["trigger"] is not None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set()
    for f in (out / "logs").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(f)); acc.Reload()
        tags |= set(acc.Tags().get("tensors", [])) | set(acc.Tags().get("scalars", []))
    assert "epoch_averaging" in tags
    # best.keras holds the averaged weights: its validation perplexity is the logged one.
    import keras
    from tflm import data
    corpus, _ = load_data(config["corpus"], None)
    best = keras.saving.load_model(out / "best.keras")
    ds = data.lm_dataset(corpus.valid, config["training"]["eval_batch_size"], 10, train=False)
    best_logged = min(h["val_perplexity"] for h in metrics["history"])
    assert best.evaluate(ds, verbose=0, return_dict=True)["perplexity"] == \
        pytest.approx(best_logged, rel=1e-5)
    # Finetuning keeps the model it starts from unless an epoch beats it (the references'
    # stored_loss starts at evaluate(val_data)): with lr 0 no epoch does.
    code = train.main(["--finetune", str(out), "--epochs", "2", "--quiet",
                       "--set", "training.lr=0", "--set", "model.head.adversarial_alpha=0.028",
                       "--set", "model.embedding_noise=0"])
    assert code == 0, capsys.readouterr().err
    tuned = json.loads((out / "finetune" / "metrics.json").read_text())
    assert tuned["history"][0]["averaging"] == 1.0
    assert tuned["best_epoch"] == 0
    assert tuned["valid_perplexity"] == pytest.approx(best_logged, rel=1e-5)
    kept = keras.saving.load_model(out / "finetune" / "best.keras")
    assert kept.head.adversarial_alpha == 0.028 and kept.backbone.noise is None
    for a, b in zip(kept.get_weights(), best.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert json.loads((out / "finetune" / "config.json").read_text())["finetune"]["from"]
    assert train.main(["--out", str(tmp_path / "bad"), *TINY,
                       "--set", "training.partial_shuffle=3"]) == 2
    assert "partial_shuffle" in capsys.readouterr().err


def test_window_padding_default_follows_the_backend():
    from tflm.data import default_pad_to_multiple
    assert default_pad_to_multiple("jax") == 4
    assert default_pad_to_multiple("tensorflow") == default_pad_to_multiple("torch") == 1
    assert pad_to_multiple(TrainingSettings()) == 1  # the tests run on TensorFlow
    assert pad_to_multiple(TrainingSettings.from_dict({"pad_to_multiple": 8})) == 8


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_steps_per_execution_trains_as_single_steps(backend, tmp_path):
    """`training.steps_per_execution` 4 (JAX: 4 windows a compiled scan,
    `tflm.backends.scanned_steps`; TensorFlow: Keras' loop in one function) gives the
    perplexities and step counts of 1."""
    out = run_in_backend(backend, f"""
        import json, pathlib
        from zoo import train
        folder = pathlib.Path({str(tmp_path)!r})
        runs = {{}}
        for k in (1, 4):
            assert train.main(["--epochs", "1", "--out", str(folder / str(k)), *{TINY!r},
                               "--set", f"training.steps_per_execution={{k}}"]) == 0
            runs[k] = json.loads((folder / str(k) / "metrics.json").read_text())
        print(json.dumps(runs))
    """)
    runs = json.loads(out.strip().splitlines()[-1])
    one, four = runs["1"], runs["4"]
    assert four["valid_perplexity"] == pytest.approx(one["valid_perplexity"], rel=1e-6)
    assert four["test_perplexity"] == pytest.approx(one["test_perplexity"], rel=1e-6)
    assert four["history"][0]["train_steps"] == one["history"][0]["train_steps"] > 4


def test_jit_compile_on_pytorch_trains_the_eager_run(tmp_path):
    """`training.jit_compile=true` on PyTorch: the train step's forward pass compiled
    (`tflm.backends.torch_compiled_step`, here with dynamo's "eager" backend), random
    window lengths, dropouts off: the eager run's perplexities, the compiled model saved."""
    no_dropout = [a for key in ("dropout", "dropout_h", "dropout_i", "dropout_e",
                                "weight_dropout") for a in ("--set", f"model.{key}=0")]
    out = run_in_backend("torch", f"""
        import json, pathlib
        from torch._dynamo.utils import counters
        from tflm.backends import torch_compiled_step
        from zoo import train
        torch_compiled_step.BACKEND = "eager"
        folder = pathlib.Path({str(tmp_path)!r})
        runs = {{}}
        for jit in ("false", "true"):
            assert train.main(["--epochs", "1", "--out", str(folder / jit), *{TINY!r},
                               *{no_dropout!r}, "--set", "corpus.train_tokens=2000",
                               "--set", f"training.jit_compile={{jit}}"]) == 0
            runs[jit] = json.loads((folder / jit / "metrics.json").read_text())
        runs["graphs"] = counters["stats"]["unique_graphs"]
        runs["breaks"] = sum(counters["graph_break"].values())
        runs["saved"] = (folder / "true" / "final.keras").exists()
        print(json.dumps(runs))
    """)
    runs = json.loads(out.strip().splitlines()[-1])
    eager, compiled = runs["false"], runs["true"]
    assert compiled["valid_perplexity"] == pytest.approx(eager["valid_perplexity"], rel=1e-4)
    assert compiled["test_perplexity"] == pytest.approx(eager["test_perplexity"], rel=1e-4)
    assert runs["breaks"] == 0 and 1 <= runs["graphs"] <= 2 and runs["saved"]
