"""zoo.runs.checkpoint: a kill at any file event of a checkpoint write leaves the newest
complete checkpoint for `recover`; a failed write puts the previous one back; truncated and
bit-flipped checkpoint files are refused in one line, never loaded as good."""

import errno
import json
import os
import random
import shutil

import keras
import numpy as np
import pytest

from tests.zoo.runs.crash_points import CrashPoints
from zoo.runs import checkpoint


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.Dropout(0.5, seed=1), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _state(epoch):
    return {"epoch": epoch, "history": [{"epoch": e, "val_perplexity": 30.0 - e}
                                        for e in range(1, epoch + 1)],
            "best": {"epoch": epoch}, "fingerprint": "f"}


def _save(run_dir, model, epoch):
    """Checkpoint `epoch` with weights and a random state that tell the epochs apart."""
    model.set_weights([np.full_like(w, epoch) for w in model.get_weights()])
    for v in checkpoint._rng_variables(model):
        v.assign(np.full(v.shape, epoch, dtype=v.dtype))
    checkpoint.save_checkpoint(run_dir, model, _state(epoch))


def _check_loads_epoch(run_dir, epoch):
    model, state = checkpoint.load_checkpoint(run_dir, "f")
    assert state["epoch"] == epoch
    assert all((w == epoch).all() for w in model.get_weights())
    assert all((keras.ops.convert_to_numpy(v.value) == epoch).all()
               for v in checkpoint._rng_variables(model))


def test_a_kill_at_any_file_event_of_two_checkpoint_writes_leaves_the_newest_whole_one(
        tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    model = _model()
    points = CrashPoints(run_dir, tmp_path / "snapshots")
    with points.recording(monkeypatch):
        _save(run_dir, model, 1)
        _save(run_dir, model, 2)
    labels = [label for label, _ in points.points]
    assert any("-> .checkpoint-previous" in label for label in labels), labels
    complete = 0  # the epoch whose state.json was last put in place (a whole temporary)
    for label, copy in points.points:
        if complete == 0:
            with pytest.raises(checkpoint.CheckpointError) as refused:
                checkpoint.recover(copy)
            message = str(refused.value)
            assert len(message.splitlines()) == 1
            assert "no checkpoint in" in message or "holds no complete checkpoint" in message
        else:
            line = checkpoint.recover(copy)
            assert f"the checkpoint of epoch {complete} in" in line and "\n" not in line, label
            assert sorted(p.name for p in copy.iterdir()) == ["checkpoint"], (label, line)
            _check_loads_epoch(copy, complete)
        if label.endswith("-> state.json"):
            complete += 1
    assert complete == 2


@pytest.mark.parametrize("failing", ["model.keras", "rng.npz", "state.json",
                                     "-> .checkpoint-previous", "-> checkpoint"])
def test_a_failed_checkpoint_write_puts_the_previous_one_back(tmp_path, monkeypatch, failing):
    model = _model()
    _save(tmp_path, model, 1)
    replace, rename, save = os.replace, type(tmp_path).rename, keras.Model.save

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "model.keras":
        monkeypatch.setattr(keras.Model, "save", lambda self, path, **k: (
            save(self, path), open(path, "r+b").truncate(100), full()))
    elif failing == "rng.npz":
        monkeypatch.setattr(np, "savez", full)
    elif failing == "state.json":
        monkeypatch.setattr(os, "replace", lambda s, d: full() if str(d).endswith(
            "state.json") else replace(s, d))
    else:  # the first rename to that name fails (putting the previous one back does not)
        calls = []
        monkeypatch.setattr(type(tmp_path), "rename", lambda s, t: full() if str(
            t).endswith(failing[3:]) and not calls.append(t) and len(calls) == 1
            else rename(s, t))
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, model, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    _check_loads_epoch(tmp_path, 1)


def _flip(path, offset, bit):
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_every_bit_flip_and_truncation_of_state_json_is_refused(tmp_path):
    _save(tmp_path, _model(), 1)
    path = tmp_path / "checkpoint" / "state.json"
    good = path.read_bytes()
    bits = random.Random(0)
    keys = {good.index(key) + i for key in (b'"sha256"', b'"files"') for i in range(8)}
    # every byte (one bit of each), and every bit of the checksum's and the sizes' keys
    for offset, bit in [(offset, bits.randrange(8)) for offset in range(len(good))] + [
            (offset, bit) for offset in sorted(keys) for bit in range(8)]:
        _flip(path, offset, bit)
        with pytest.raises(checkpoint.CheckpointError, match="state.json is corrupt"):
            checkpoint.read_state(tmp_path)
        path.write_bytes(good)
    for size in range(len(good)):
        path.write_bytes(good[:size])
        with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
            checkpoint.read_state(tmp_path)
    path.write_bytes(good)
    checkpoint.check_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("name", ["model.keras", "rng.npz"])
def test_damaged_model_and_random_state_files_are_refused_or_harmless(tmp_path, name):
    _save(tmp_path, _model(), 1)
    path = tmp_path / "checkpoint" / name
    good = path.read_bytes()
    for size in list(range(0, len(good), max(1, len(good) // 25))) + [len(good) - 1]:
        path.write_bytes(good[:size])
        with pytest.raises(checkpoint.CheckpointError, match=r"unreadable \(corrupt or "
                                                             "truncated|missing"):
            checkpoint.check_checkpoint(tmp_path / "checkpoint")
    flips = random.Random(0).sample(range(len(good) * 8), 60)
    harmless = 0
    for position in flips:
        path.write_bytes(good)
        _flip(path, position // 8, position % 8)
        try:  # what --resume does: check, then load
            checkpoint.check_checkpoint(tmp_path / "checkpoint")
            checkpoint.load_checkpoint(tmp_path, "f")
        except checkpoint.CheckpointError as err:
            assert len(str(err).splitlines()) == 1
            continue
        _check_loads_epoch(tmp_path, 1)  # a flip in a field nothing reads: same weights
        harmless += 1
    assert harmless < len(flips) // 3, "the payload is most of the file: most flips are caught"


def test_recover_prefers_the_newest_intact_checkpoint_and_says_what_it_removed(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    model = _model()
    _save(run_dir, model, 2)
    shutil.copytree(run_dir / "checkpoint", tmp_path / "epoch2")
    _save(run_dir, model, 3)
    # as a crash after the swap's renames, before .checkpoint-previous was removed
    shutil.copytree(tmp_path / "epoch2", run_dir / ".checkpoint-previous")
    (run_dir / ".checkpoint-1a2b3c4d").mkdir()  # a writer killed before its first file
    model_file = run_dir / "checkpoint" / "model.keras"
    model_file.write_bytes(model_file.read_bytes()[:-10])  # epoch 3: truncated
    line = checkpoint.recover(run_dir)
    assert line.startswith(f"resuming from the checkpoint of epoch 2 in "
                           f"{run_dir / 'checkpoint'}, recovered from .checkpoint-previous")
    assert "checkpoint (damaged)" in line and ".checkpoint-1a2b3c4d (incomplete)" in line
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint"]
    _check_loads_epoch(run_dir, 2)
    # a state.json written before checksums (and sizes) were recorded is still read
    state = json.loads((run_dir / "checkpoint" / "state.json").read_text())
    for key in ("sha256", "files"):
        del state[key]
    (run_dir / "checkpoint" / "state.json").write_text(json.dumps(state))
    assert checkpoint.recover(run_dir) == (f"resuming from the checkpoint of epoch 2 in "
                                           f"{run_dir / 'checkpoint'}")
