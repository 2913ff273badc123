"""`python -m zoo.train` under faults a long run meets: no saved result is ever lost or left
unreadable, and every refusal is one line with exit 2.

The faults: a kill at every file event of a run (its checkpoints, best.keras, the final
writes), a real SIGKILL between a checkpoint swap's renames, a failed write of each result
file while extending a finished run (EFBIG injected, and a real file-size limit), two
processes on one run folder, and truncated or bit-flipped files given to --resume.
"""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest

from tests.conftest import REPO, TINY_RUN_FLAGS, without_native_log_lines
from tests.zoo.runs.crash_points import CrashPoints
from tests.zoo.runs.lock_holder import hold_lock
from zoo import train
from zoo.runs import atomic_files, checkpoint
from zoo.runs.resume import recover_run, resume_config

# lr 2: every epoch of this tiny run improves, so each one writes best.keras
FLAGS = ["--seed", "3", "--set", "training.lr=2", *TINY_RUN_FLAGS]
RESULTS = ("best.keras", "final.keras", "metrics.json", "config.json", "vocab.txt")


def _error(capsys):
    err = without_native_log_lines(capsys.readouterr().err).strip()
    assert len(err.splitlines()) == 1, err
    return err


def _leftovers(run_dir):
    """Temporaries and checkpoint directories that are not `checkpoint/` (none may stay)."""
    return sorted(p.name for p in run_dir.iterdir()
                  if atomic_files.TEMPORARY_MARK in p.name or p.name.startswith(".checkpoint"))


def _whole(path):
    """A result file that is whole: a .keras zip with every CRC right, or JSON."""
    if path.suffix == ".keras":
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    if path.suffix == ".json":
        json.loads(path.read_text())
    return True


def _same_results(a, b):
    a, b = (json.loads((run / "metrics.json").read_text()) for run in (a, b))
    assert [h["epoch"] for h in a["history"]] == [h["epoch"] for h in b["history"]]
    for key in ("perplexity", "val_perplexity"):
        assert [h[key] for h in a["history"]] == pytest.approx(
            [h[key] for h in b["history"]], rel=1e-5)
    assert a["test_perplexity"] == pytest.approx(b["test_perplexity"], rel=1e-5)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A 2-epoch run, with a copy of its folder just before each of its file events: what
    a kill at that instant leaves (tests.zoo.runs.crash_points)."""
    base = tmp_path_factory.mktemp("recorded")
    points = CrashPoints(base / "run", base / "points")
    with pytest.MonkeyPatch.context() as patch, points.recording(patch):
        assert train.main(["--epochs", "2", "--out", str(base / "run"), *FLAGS]) == 0
    return base / "run", [(label, copy) for label, copy in points.points if copy.exists()]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A finished 1-epoch run of FLAGS (copy it before writing into it)."""
    out = tmp_path_factory.mktemp("one") / "run"
    assert train.main(["--epochs", "1", "--out", str(out), *FLAGS]) == 0
    return out


def _copy(run_dir, tmp_path, name="run"):
    shutil.copytree(run_dir, tmp_path / name)
    return tmp_path / name


# --- a kill at every file event ---------------------------------------------------------

def test_a_kill_at_any_file_event_leaves_whole_results_and_a_resumable_run(recorded, capsys):
    run_dir, points = recorded
    labels = [label for label, _ in points]
    for event in ("best.keras", "final.keras", "metrics.json", ".checkpoint-previous"):
        assert any(label.endswith(f"-> {event}") for label in labels), (event, labels)
    done = 0  # epochs whose checkpoint state.json was in place
    for label, copy in points:
        for name in RESULTS:
            assert not (copy / name).exists() or _whole(copy / name), (label, name)
        if (copy / "metrics.json").exists():
            assert (copy / "metrics.json").read_bytes() == (run_dir / "metrics.json").read_bytes()
        if done == 0:
            with pytest.raises(checkpoint.CheckpointError) as refused:
                recover_run(copy)
            assert len(str(refused.value).splitlines()) == 1
        else:
            line = recover_run(copy)
            assert f"resuming from the checkpoint of epoch {done} in" in line, (label, line)
            assert _leftovers(copy) == [], (label, line)
            if (copy / "metrics.json").exists():  # finished: resuming is refused
                with pytest.raises(Exception, match="is a finished run"):
                    resume_config(copy)
            else:
                assert resume_config(copy)[1]["epoch"] == done
        if label.endswith("-> state.json"):
            done += 1
    assert done == 2


def _point(points, event, nth=1):
    """The copy made just before the `nth` event whose label ends with `event`."""
    found = [copy for label, copy in points if label.endswith(event)]
    return found[nth - 1]


@pytest.mark.parametrize("event, nth", [("-> checkpoint", 2), ("-> metrics.json", 1)])
def test_a_run_killed_in_a_checkpoint_swap_or_its_final_writes_resumes_to_the_same_result(
        recorded, tmp_path, capsys, event, nth):
    run_dir, points = recorded
    cut = _copy(_point(points, event, nth), tmp_path)
    assert train.main(["--resume", str(cut), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "resuming from the checkpoint of epoch 2 in" in out
    _same_results(cut, run_dir)
    assert _leftovers(cut) == []


def test_a_run_killed_in_its_first_checkpoint_write_is_started_again(recorded, tmp_path,
                                                                      capsys):
    run_dir, points = recorded
    cut = _copy(_point(points, "-> state.json"), tmp_path)  # epoch 1's temporary, unfinished
    assert [p.name.startswith(".checkpoint-") for p in cut.iterdir()].count(True) == 1
    assert train.main(["--resume", str(cut), "--quiet"]) == 2
    err = _error(capsys)
    assert "holds no complete checkpoint" in err and f"--out {cut}" in err, err
    assert train.main(["--epochs", "2", "--out", str(cut), *FLAGS]) == 0
    _same_results(cut, run_dir)
    assert _leftovers(cut) == []


@pytest.mark.slow  # ~25 s: a fresh process imports TensorFlow and trains 2 epochs
def test_a_real_sigkill_between_the_swaps_renames_leaves_a_run_that_resumes(
        recorded, tmp_path, capsys):
    run_dir, _ = recorded
    out = tmp_path / "run"
    code = f"""if True:
        import os, pathlib, signal, sys
        from zoo import train
        rename, swaps = pathlib.Path.rename, []
        def rename_or_die(self, target):
            # epoch 2's swap: the old checkpoint moved aside, the new one not yet in place
            if pathlib.Path(target).name == "checkpoint":
                swaps.append(target)
                if len(swaps) == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
            return rename(self, target)
        pathlib.Path.rename = rename_or_die
        sys.exit(train.main({["--epochs", "2", "--out", str(out), *FLAGS]!r}))
    """
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not (out / "checkpoint").exists() and (out / ".checkpoint-previous").is_dir()
    assert train.main(["--resume", str(out), "--quiet"]) == 0
    assert "epoch 2 in" in capsys.readouterr().out
    _same_results(out, run_dir)
    assert _leftovers(out) == []


# --- a failed write while extending a finished run --------------------------------------

def _fail_write_of(monkeypatch, target):
    """The write of `target` (a result file, or "checkpoint": its model.keras) fails half
    way with EFBIG, as under a file-size limit."""
    fsync = atomic_files.fsync_file

    def fsync_or_fail(path):
        path = os.fspath(path)
        name = os.path.basename(path)
        hit = (name == "model.keras" and ".checkpoint-" in path if target == "checkpoint"
               else name.startswith(f".{os.path.splitext(target)[0]}{atomic_files.TEMPORARY_MARK}"))
        if hit:
            os.truncate(path, os.path.getsize(path) // 2)
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), path)
        return fsync(path)

    monkeypatch.setattr(atomic_files, "fsync_file", fsync_or_fail)


@pytest.mark.parametrize("target, kept", [
    ("config.json", "the previous config.json"),
    ("best.keras", "the previous best.keras (epoch 1)"),
    ("checkpoint", "the previous checkpoint (epoch 1), best.keras (epoch 2)"),
    ("final.keras", "the checkpoint of epoch 2, best.keras (epoch 2), the previous final.keras"),
    ("metrics.json", "the previous metrics.json (the results at epoch 1)"),
])
def test_a_failed_write_of_each_result_keeps_the_previous_one_and_says_so(
        one_epoch, recorded, tmp_path, capsys, monkeypatch, target, kept):
    run_dir = _copy(one_epoch, tmp_path)
    before = {name: (run_dir / name).read_bytes() for name in ("best.keras", "metrics.json")}
    with monkeypatch.context() as patch:
        _fail_write_of(patch, target)
        assert train.main(["--resume", str(run_dir), "--epochs", "2", "--quiet"]) == 2
    err = _error(capsys)
    assert err.startswith("zoo.train: error: cannot write ") and "(File too large)" in err, err
    assert kept in err, err
    assert err.endswith(f"then continue with: python -m zoo.train --resume {run_dir}"), err
    if target == "metrics.json":
        assert "the results (valid perplexity " in err and "were computed but not saved" in err
    assert _leftovers(run_dir) == []
    assert (run_dir / "metrics.json").read_bytes() == before["metrics.json"]
    if target in ("config.json", "best.keras"):
        assert (run_dir / "best.keras").read_bytes() == before["best.keras"]
    for name in RESULTS:
        assert _whole(run_dir / name), name
    if target in ("checkpoint", "metrics.json"):  # (the others: the same path, seconds more)
        # once there is room, the command the line gives finishes the run: from epoch 1's
        # checkpoint with epoch 2's best.keras; or only the outputs, over epoch 1's metrics
        assert train.main(["--resume", str(run_dir), "--quiet"]) == 0
        _same_results(run_dir, recorded[0])


def _limited(limit):
    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write raises EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_files


@pytest.mark.slow  # ~20 s: a fresh process imports TensorFlow
def test_a_file_size_limit_while_extending_a_finished_run_keeps_its_results(
        one_epoch, tmp_path, capsys):
    run_dir = _copy(one_epoch, tmp_path)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    limit = (run_dir / "best.keras").stat().st_size // 2  # the models do not fit
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.train", "--resume", str(run_dir), "--epochs", "2",
         "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=600,
        preexec_fn=_limited(limit), env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    err = without_native_log_lines(proc.stderr).strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, proc.stderr[-3000:]
    assert "(File too large)" in err and "best.keras" in err, err
    for name in ("best.keras", "final.keras", "metrics.json", "vocab.txt"):
        assert (run_dir / name).read_bytes() == before[name], name
    assert _leftovers(run_dir) == []
    assert checkpoint.read_state(run_dir)["epoch"] == 1
    from zoo.models.saving import load_model
    load_model(run_dir / "best.keras")
    assert train.main(["--resume", str(run_dir), "--quiet"]) == 0  # config.json: 2 epochs
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]


# --- one process per run folder ---------------------------------------------------------

def test_a_second_process_on_a_run_folder_is_refused_in_one_line(one_epoch, tmp_path,
                                                                  capsys):
    run_dir = _copy(one_epoch, tmp_path)
    new = tmp_path / "new"
    holders = [hold_lock(run_dir), hold_lock(new)]
    try:
        for argv, holder in (
                (["--resume", str(run_dir), "--epochs", "2", "--quiet"], holders[0]),
                (["--epochs", "1", "--out", str(new), *FLAGS], holders[1]),
                (["--finetune", str(run_dir), "--out", str(new), *FLAGS[:2], "--quiet"],
                 holders[1])):
            assert train.main(argv) == 2
            err = _error(capsys)
            assert f"is in use: process {holder.pid} on " in err, err
            assert "wait for that one to end" in err
        assert sorted(p.name for p in new.iterdir()) == [".lock"], "the other's folder stays"
    finally:
        for holder in holders:
            holder.send_signal(signal.SIGKILL)  # dies holding it: its lock file stays
            holder.wait()
    assert (run_dir / ".lock").exists()  # a dead process's lock file is no lock
    assert train.main(["--resume", str(run_dir), "--epochs", "2", "--quiet"]) == 0
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow  # ~30 s: two fresh processes import TensorFlow at once
def test_two_runs_started_at_once_into_one_folder_one_is_refused(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    argv = [sys.executable, "-m", "zoo.train", "--epochs", "200", "--out", str(out), *FLAGS]
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 300
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "neither process ended"
            time.sleep(0.1)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        err = without_native_log_lines(loser.stderr.read()).strip()
        assert loser.returncode == 2 and len(err.splitlines()) == 1, err
        assert f"{out} is in use: process {winner.pid} on " in err, err
        assert winner.poll() is None, "the first run goes on"
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --- damaged files given to --resume ----------------------------------------------------

def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _edit_config(run_dir, part, key, value):
    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    config[part][key] = value
    path.write_text(json.dumps(config))


def _snapshot(run_dir):
    return {str(p.relative_to(run_dir)): p.read_bytes() if p.is_file() else None
            for p in sorted(run_dir.rglob("*"))}


@pytest.mark.parametrize("damage, message", [
    (lambda r: _flip_byte(r / "checkpoint" / "state.json", 40), "state.json is corrupt"),
    (lambda r: (r / "checkpoint" / "state.json").write_bytes(
        (r / "checkpoint" / "state.json").read_bytes()[:-30]), "state.json is corrupt"),
    (lambda r: _flip_byte(r / "checkpoint" / "model.keras", 30000),
     "model.keras is unreadable (corrupt or truncated"),
    (lambda r: _flip_byte(r / "checkpoint" / "rng.npz", 100),
     "rng.npz is unreadable (corrupt or truncated"),
    (lambda r: (r / "best.keras").write_bytes((r / "best.keras").read_bytes()[:20000]),
     "best.keras (the best model, epoch 1) is unreadable (corrupt or truncated"),
    (lambda r: _flip_byte(r / "best.keras", 30000),
     "best.keras (the best model, epoch 1) is unreadable (corrupt or truncated"),
    (lambda r: (r / "config.json").write_bytes((r / "config.json").read_bytes()[:-5]),
     "config.json is corrupt"),
    (lambda r: (r / "config.json").write_text("[1, 2]"),
     "config.json is corrupt (a JSON list, not the object of settings"),
    (lambda r: _edit_config(r, "training", "epoch", 3),
     "unknown setting training.epoch; did you mean training.epochs?"),
    (lambda r: _edit_config(r, "model", "hidden_dim", "big"),
     "model.hidden_dim must be an integer; got 'big'"),
])
def test_a_damaged_file_is_refused_in_one_line_and_nothing_is_touched(
        one_epoch, tmp_path, capsys, damage, message):
    run_dir = _copy(one_epoch, tmp_path)
    damage(run_dir)
    before = _snapshot(run_dir)
    assert train.main(["--resume", str(run_dir), "--epochs", "2", "--quiet"]) == 2
    err = _error(capsys)
    assert message in err, err
    assert _snapshot(run_dir) == before


def test_a_damaged_checkpoint_with_an_intact_previous_one_resumes_from_that(
        one_epoch, tmp_path, capsys):
    run_dir = _copy(one_epoch, tmp_path)
    shutil.copytree(run_dir / "checkpoint", run_dir / ".checkpoint-previous")
    model = run_dir / "checkpoint" / "model.keras"
    model.write_bytes(model.read_bytes()[:1000])
    assert train.main(["--resume", str(run_dir), "--epochs", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert (f"resuming from the checkpoint of epoch 1 in {run_dir / 'checkpoint'}, recovered "
            "from .checkpoint-previous") in out and "removed checkpoint (damaged)" in out, out
    assert _leftovers(run_dir) == []
