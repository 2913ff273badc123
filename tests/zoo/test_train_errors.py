"""`python -m zoo.train` says what went wrong instead of going on: divergence, bad starts,
resumes that would change a run, finished runs; and it reports progress and its flags."""

import hashlib
import json
import logging
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, without_native_log_lines
from tests.zoo.test_train import TINY
from zoo import train
from zoo.runs import checkpoint
from zoo.runs.run_dir import NewRunDir


def _error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --- divergence ---------------------------------------------------------------------------

def test_divergence_to_infinity_stops_and_keeps_nothing_half_made(tmp_path, capsys):
    # lr 1e6: the loss grows to ~1e5 (finite) while the perplexity overflows to inf.
    out = tmp_path / "inf"
    code = train.main(["--epochs", "3", "--out", str(out), *TINY, "--set", "training.lr=1e6"])
    err = _error(capsys)
    assert code == 3, err
    assert "perplexity became inf at epoch 1, step" in err
    assert not out.exists(), "a run that diverged before its first checkpoint leaves nothing"


@pytest.mark.parametrize("logs, message", [
    ({"loss": 1e5, "perplexity": float("inf")}, "training perplexity became inf"),
    ({"loss": float("nan"), "perplexity": 3.0}, "training loss became nan"),
])
def test_stop_on_nan_checks_loss_and_perplexity_after_every_step(logs, message):
    from tflm.callbacks import StopOnNaN, TrainingDiverged
    guard = StopOnNaN()
    guard.on_epoch_begin(4)
    guard.on_train_batch_end(0, {"loss": 2.0, "perplexity": 7.4})
    with pytest.raises(TrainingDiverged, match=f"{message} at epoch 5, step 3"):
        guard.on_train_batch_end(2, logs)


def test_stop_on_nan_checks_the_validation_at_epoch_end():
    from tflm.callbacks import StopOnNaN, TrainingDiverged
    guard = StopOnNaN()
    guard.on_epoch_end(0, {"loss": 2.0, "perplexity": 7.4, "val_loss": 2.1,
                           "val_perplexity": 8.2})
    with pytest.raises(TrainingDiverged, match="validation perplexity became inf at the end "
                                               "of epoch 2"):
        guard.on_epoch_end(1, {"loss": 2.0, "perplexity": 7.4, "val_loss": 1e4,
                               "val_perplexity": float("inf")})


def test_divergence_after_a_good_epoch_keeps_its_checkpoint_and_best_model(
        tmp_path, capsys, monkeypatch):
    save = checkpoint.save_checkpoint

    def save_then_poison(run_dir, model, state):
        save(run_dir, model, state)
        if state["epoch"] == 1:  # the weights blow up after the good epoch 1 was saved
            for v in model.trainable_variables:
                v.assign(np.full(v.shape, np.nan, dtype="float32"))

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_poison)
    out = tmp_path / "run"
    code = train.main(["--epochs", "3", "--out", str(out), *TINY])
    err = _error(capsys)
    assert code == 3, err
    assert "at epoch 2, step 1" in err and "last good checkpoint (epoch 1)" in err
    assert f"--init-from {out / 'best.keras'}" in err
    assert json.loads((out / "checkpoint" / "state.json").read_text())["epoch"] == 1
    assert not (out / "final.keras").exists() and not (out / "metrics.json").exists()
    import keras
    best = keras.saving.load_model(out / "best.keras")
    assert all(np.isfinite(w).all() for w in best.get_weights())


# --- a failed start -----------------------------------------------------------------------

def _corpus(directory, train="a b c\nd e f\n" * 20, valid="a b\nc d\n" * 20,
            test="e f\na b\n" * 20):
    directory.mkdir()
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (directory / f"{name}.txt").write_bytes(text if isinstance(text, bytes)
                                                else text.encode("utf-8"))
    return directory


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "training.batch_size (--batch-size) must be a positive integer; "
                            "got 0"),
    (["--epochs", "0"], "training.epochs (--epochs) must be a positive integer; got 0"),
    (["--set", "training.lr=abc"], "training.lr must be a finite number >= 0; got 'abc'"),
    (["--set", "corpus.vocab_size=-5"], "vocab_size must be an integer >= 2, got -5"),
    (["--set", "training.final_evaluation.bptt=0"],
     "training.final_evaluation.bptt must be a positive integer; got 0"),
    (["--set", "training.eval_window=long"],
     'training.eval_window must be "auto" (long windows, same perplexity), "bptt" or a '
     "positive integer; got 'long'"),
    (["--set", "model.num_layers=0"], "num_layers must be >= 1; got 0"),  # fails after mkdir
])
def test_failed_start_is_one_line_and_leaves_no_run_folder(args, message, tmp_path, capsys):
    out = tmp_path / "runs" / "r"
    code = train.main(["--epochs", "1", "--out", str(out), *TINY, *args])  # last flag wins
    err = _error(capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "runs").exists(), "the folders this start created must be removed"


def test_empty_train_file_names_the_file(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus", train="")
    code = train.main(["--corpus", str(corpus), "--out", str(tmp_path / "r"), *TINY])
    err = _error(capsys)
    assert code == 2 and f"{corpus / 'train.txt'} is empty" in err, err
    assert not (tmp_path / "r").exists()


def test_non_utf8_corpus_names_the_file_and_line(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus", valid=b"a b\nc d\nx caf\xe9 y\n" * 20)
    code = train.main(["--corpus", str(corpus), "--out", str(tmp_path / "r"), *TINY])
    err = _error(capsys)
    assert code == 2 and f"{corpus / 'valid.txt'}, line 3, column 6" in err, err
    assert "not UTF-8" in err
    assert not (tmp_path / "r").exists()


def test_failed_start_never_removes_a_folder_that_existed(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code = train.main(["--out", str(out), *TINY, "--set", "model.num_layers=0"])
    assert code == 2 and "num_layers" in _error(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# --- resume: what it may change, finished runs ----------------------------------------------

def test_resume_extends_with_epochs_refuses_other_flags_and_finished_runs(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--epochs", "1", "--out", str(out), *TINY]) == 0
    assert "epoch 1/1  loss " in capsys.readouterr().out  # --quiet: one line per epoch
    final = (out / "final.keras").read_bytes()
    for flags, named in ((["--epochs", "2", "--set", "training.lr=0.001"], "--set"),
                         (["--batch-size", "4", "--seed", "0"], "--batch-size, --seed"),
                         (["--preset", "synthetic"], "--preset"),
                         (["--head", "mos"], "--head"), (["--corpus", "ptb"], "--corpus"),
                         (["--init-from", str(out / "best.keras")], "--init-from"),
                         (["--finetune", str(out)], "--finetune")):
        assert train.main(["--resume", str(out), *flags]) == 2
        err = _error(capsys)
        assert f"{named} cannot be given with it" in err, err
    assert train.main(["--resume", str(out), "--quiet"]) == 2
    err = _error(capsys)
    assert "is a finished run (1 of 1 epochs" in err and "--epochs N with N > 1" in err
    assert train.main(["--resume", str(out), "--epochs", "1", "--quiet"]) == 2
    assert "finished run" in _error(capsys)
    assert (out / "final.keras").read_bytes() == final, "a finished run is not rewritten"
    assert train.main(["--resume", str(out), "--epochs", "2", "--quiet"]) == 0
    assert "epoch 2/2  loss " in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["training"]["epochs"] == 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert train.main(["--resume", str(out), "--quiet"]) == 2
    assert "finished run (2 of 2 epochs" in _error(capsys)


def _fake_run(run_dir, epochs=3, done=3, trigger=None, metrics=True):
    """A run directory with config.json, checkpoint/state.json (and metrics.json)."""
    (run_dir / "checkpoint").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"training": {"epochs": epochs}}))
    (run_dir / "checkpoint" / "state.json").write_text(json.dumps(
        {"epoch": done, "history": [], "best": None, "fingerprint": "x", "trigger": trigger,
         "version": checkpoint.STATE_VERSION}))
    if metrics:
        (run_dir / "metrics.json").write_text("{}")
    return run_dir


def test_resume_plan_of_stopped_killed_and_shortened_runs(tmp_path):
    from zoo.errors import UserError
    from zoo.runs.resume import resume_config
    stopped = _fake_run(tmp_path / "stopped", epochs=10, done=4,
                        trigger={"history": [], "switched": True, "switch_epoch": 0,
                                 "stopped": True, "stop_epoch": 3})
    with pytest.raises(UserError, match="non-monotonic rule stopped it after epoch 4"):
        resume_config(stopped)
    with pytest.raises(UserError, match="cannot be extended"):
        resume_config(stopped, epochs=20)
    # Killed after its last checkpoint, before metrics.json: resuming only writes outputs.
    killed = _fake_run(tmp_path / "killed", epochs=3, done=3, metrics=False)
    config, state, changed = resume_config(killed)
    assert state["epoch"] == 3 and config["training"]["epochs"] == 3 and not changed
    # An unfinished run may end earlier, never before what it has done.
    running = _fake_run(tmp_path / "running", epochs=10, done=4)
    config, _, changed = resume_config(running, epochs=6)
    assert changed and config["training"]["epochs"] == 6
    with pytest.raises(UserError, match="fewer than the 4 epochs"):
        resume_config(running, epochs=3)


# --- Ctrl-C and damaged checkpoints ---------------------------------------------------------

def test_ctrl_c_prints_how_to_resume_and_keeps_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # a user's shell
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.train", "--epochs", "50", "--out", str(out), *TINY],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # Python turns SIGINT into KeyboardInterrupt only when it is not ignored on start.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    state = out / "checkpoint" / "state.json"
    try:
        deadline = time.monotonic() + 300
        while not state.exists():
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert len(without_native_log_lines(err).strip().splitlines()) == 1, err[-2000:]
    done = json.loads(state.read_text())["epoch"]
    assert f"the checkpoint of epoch {done} is kept in {out / 'checkpoint'}" in err, err
    resume = shlex.join(["python", "-m", "zoo.train", "--resume", str(out), "--quiet"])
    assert err.strip().endswith(f"continue the run with: {resume}"), err
    assert not (out / "metrics.json").exists()
    # The same command again does not start over on the kept checkpoint: it says --resume.
    assert train.main(["--epochs", "50", "--out", str(out), *TINY]) == 2
    assert "--resume" in capsys.readouterr().err
    # The checkpoint is whole: the run goes on from it and finishes.
    assert train.main(["--resume", str(out), "--epochs", str(done + 1), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, done + 2))


def test_ctrl_c_before_the_first_checkpoint_keeps_nothing(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_checkpoint", interrupted)
    out = tmp_path / "runs" / "r"
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    try:
        code = train.main(["--epochs", "3", "--out", str(out), *TINY])
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C left main() (a traceback for the user)")
    finally:
        tf_logger.setLevel(level)  # main() quiets TensorFlow's logger as its process ends
    err = _error(capsys)
    assert code == 130, err
    assert "interrupted before the first epoch finished, so nothing was kept" in err, err
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_while_a_checkpoint_is_swapped_in_keeps_the_previous_one(tmp_path, monkeypatch):
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    checkpoint.save_checkpoint(tmp_path, model, {"epoch": 1})
    rename = pathlib.Path.rename

    def interrupted_rename(self, target):  # Ctrl-C once the old checkpoint is moved aside
        if self.name.startswith(".checkpoint-") and self.name != ".checkpoint-previous":
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", interrupted_rename)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, model, {"epoch": 2})
    monkeypatch.undo()
    assert checkpoint.read_state(tmp_path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_a_new_run_folder_holding_a_checkpoint_is_kept_on_ctrl_c(tmp_path):
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        with NewRunDir(out):  # interrupted after the checkpoint was written, before keep()
            (out / "checkpoint").mkdir(parents=True)
            raise KeyboardInterrupt
    assert (out / "checkpoint").is_dir()


@pytest.fixture
def pythons_sigint():
    """SIGINT set to Python's own handler for the test (a test run before it in the same
    worker may have left another one, which made this test skip), put back afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_while_training_waits_for_a_safe_point_and_a_second_one_does_not(
        pythons_sigint):
    from zoo.runtime import interrupt
    with interrupt.handle_ctrl_c():
        handler = signal.getsignal(signal.SIGINT)
        assert handler is not signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):  # outside training: at once, as Python does
            handler(signal.SIGINT, None)
        with interrupt.deferring():
            handler(signal.SIGINT, None)  # noted, not raised inside TensorFlow's code
            with pytest.raises(KeyboardInterrupt):
                interrupt.check()  # the next batch end, epoch end or checkpoint
            interrupt.check()  # raised once
            handler(signal.SIGINT, None)
            with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: at once
                handler(signal.SIGINT, None)
        interrupt.check()  # what was left when the run ended is dropped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupt.deferring():  # no handler (library use): check() never raises
        interrupt.check()


def _snapshot(directory):
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns,
                                            hashlib.sha256(p.read_bytes()).hexdigest()
                                            if p.is_file() else None)
            for p in sorted(directory.rglob("*"))}


def test_truncated_checkpoint_model_is_named_unreadable_and_nothing_is_touched(
        tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--epochs", "1", "--out", str(out), *TINY]) == 0
    capsys.readouterr()
    model = out / "checkpoint" / "model.keras"
    data = model.read_bytes()
    model.write_bytes(data[:len(data) // 2])
    before = _snapshot(out)
    assert train.main(["--resume", str(out), "--epochs", "2", "--quiet"]) == 2
    err = _error(capsys)
    assert f"the checkpoint's model file {model} is unreadable (corrupt or truncated" in err, err
    assert "File not found" not in err, err
    assert _snapshot(out) == before, "a failed resume must not touch the run"


# --- progress and help ----------------------------------------------------------------------

def test_progress_header_counts_the_whole_run(tmp_path, capsys):
    args = [a for a in TINY if a != "--quiet"]
    assert train.main(["--epochs", "2", "--out", str(tmp_path / "r"), *args]) == 0
    printed = capsys.readouterr().out
    assert printed.count("Epoch 1/2") == 1 and printed.count("Epoch 2/2") == 1, printed[-2000:]


def test_help_lists_presets_and_explains_every_flag(capsys):
    from zoo.presets import list_presets
    with pytest.raises(SystemExit) as exit_:
        train.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in list_presets():
        assert name in text, name
    parser = train.build_parser()
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help text"
