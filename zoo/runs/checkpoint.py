"""Epoch checkpoints that a killed run resumes from, written so the last good one survives.

A checkpoint is a directory `RUN_DIR/checkpoint/` with
  model.keras      model weights and optimizer state (ASGD averages included)
  rng.npz          the dropout `SeedGenerator` states (not part of `.keras` files)
  state.json       epoch reached, history, best-so-far, trigger state, config fingerprint,
                   the sizes of the two files above and a checksum of its own content

`save_checkpoint` writes it into a fresh directory `RUN_DIR/.checkpoint-XXXXXXXX`, every
file flushed to the disk and state.json last (a temporary directory with a state.json is
complete), then swaps it in with two renames:

    checkpoint -> .checkpoint-previous;  .checkpoint-XXXXXXXX -> checkpoint;
    remove .checkpoint-previous

so whenever a crash comes, a complete checkpoint lies under one of those names. A failure
it sees (a full disk, a Ctrl-C) puts the previous checkpoint back and removes the
temporary. `recover` (what `--resume` does first) finds the newest intact checkpoint
wherever a crash left it, moves it to `checkpoint/` and removes the rest. A checkpoint that
is damaged (truncated, bit-flipped: the sizes, the zip files' CRCs and state.json's
checksum tell) or fails to load raises `CheckpointError` naming the file and what to do,
and nothing is overwritten.
"""

import hashlib
import json
import pathlib
import secrets
import shutil
import zipfile
import zlib

import keras
import numpy as np

from zoo.models.saving import load_model
from zoo.runs import atomic_files

STATE_VERSION = 1
CHECKPOINT = "checkpoint"
PREVIOUS = ".checkpoint-previous"
TEMPORARY_PREFIX = ".checkpoint-"
FILES = ("model.keras", "rng.npz")  # written before state.json, which records their sizes


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or made for another configuration."""


def fingerprint(config, vocabulary):
    """A hash of what must not change across a resume: model, corpus, vocabulary."""
    key = json.dumps({"model": config.get("model"), "corpus": config.get("corpus"),
                      "vocabulary": list(vocabulary)}, sort_keys=True)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _rng_variables(model):
    """The model's SeedGenerator states, in the model's (deterministic) variable order."""
    return [v for v in model.variables if "seed_generator_state" in v.path]


def _digest(body):
    """The checksum of a state dict (without its own `sha256`), as JSON reads it back."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def _new_directory(run_dir):
    """A new empty `.checkpoint-XXXXXXXX` in `run_dir` (mode 0777 less the umask)."""
    while True:
        path = run_dir / f"{TEMPORARY_PREFIX}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def save_checkpoint(run_dir, model, state):
    """Write `RUN_DIR/checkpoint` atomically (model, optimizer, RNG, `state` dict).

    Raises the writer's `OSError` (a full disk, a file-size limit) or a Ctrl-C's
    `KeyboardInterrupt` with the previous checkpoint in place and no temporary left."""
    run_dir = pathlib.Path(run_dir)
    final = run_dir / CHECKPOINT
    old = run_dir / PREVIOUS
    tmp = _new_directory(run_dir)
    try:
        model.save(tmp / "model.keras")
        np.savez(tmp / "rng.npz", *[keras.ops.convert_to_numpy(v.value)
                                    for v in _rng_variables(model)])
        for name in FILES:
            atomic_files.fsync_file(tmp / name)
        body = {k: v for k, v in state.items() if k != "sha256"}
        body = json.loads(json.dumps(dict(body, version=STATE_VERSION, files={
            name: (tmp / name).stat().st_size for name in FILES})))
        atomic_files.write_json(tmp / "state.json", dict(body, sha256=_digest(body)))
        atomic_files.fsync_dir(tmp)
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        atomic_files.fsync_dir(run_dir)
    except BaseException:  # a failure or a Ctrl-C: the previous checkpoint stays in place
        if not final.exists() and old.exists():
            old.rename(final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def read_state(run_dir):
    """The `state.json` of RUN_DIR's checkpoint (CheckpointError if absent or corrupt)."""
    path = pathlib.Path(run_dir) / CHECKPOINT / "state.json"
    if not path.exists():
        raise CheckpointError(f"no checkpoint in {run_dir} (expected {path}); start a new run "
                              "instead of --resume.")
    return _read_state_file(path)


def _read_state_file(path):
    """A checkpoint's state.json, checked: JSON, its checksum (when it has one: checkpoints
    written before it was added have none), its format version."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is corrupt ({err}); the run cannot be resumed from it.")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is corrupt (not a JSON object); the run cannot be "
                              "resumed from it.")
    # Checkpoints written since the checksum came have "files" and "sha256" (a flip in
    # either key's name leaves the other one to tell); older ones have neither.
    if ("sha256" in state or "files" in state) and _digest(
            {k: v for k, v in state.items() if k != "sha256"}) != state.get("sha256"):
        raise CheckpointError(f"{path} is corrupt (its content does not match its checksum: "
                              "damaged on the disk); the run cannot be resumed from it.")
    if state.get("version") != STATE_VERSION:
        raise CheckpointError(f"{path} has format version {state.get('version')}, expected "
                              f"{STATE_VERSION}.")
    return state


def check_checkpoint(directory):
    """The state of the checkpoint `directory` after checking it is whole (state.json, the
    recorded sizes, every zip member's CRC); `CheckpointError` naming what is damaged."""
    directory = pathlib.Path(directory)
    path = directory / "state.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no state.json: an incomplete checkpoint "
                              "(its writer was stopped).")
    state = _read_state_file(path)
    sizes = state.get("files") or {}
    for name, what in (("model.keras", "model file"), ("rng.npz", "random-generator file")):
        _check_zip(directory / name, what, sizes.get(name))
    return state


def _unreadable(path, what, reason):
    return CheckpointError(f"the checkpoint's {what} {path} is unreadable (corrupt or "
                           f"truncated: {reason}); the run cannot be resumed from this "
                           "checkpoint.")


def _check_zip(path, what, size=None, members=True):
    """`CheckpointError` unless `path` is a whole zip file (`.keras`, `.npz`) of `size`
    bytes (when recorded) whose members all match their CRCs (`members`: False checks the
    archive's directory only, for a file `check_checkpoint` has read whole already)."""
    if not path.is_file():
        raise CheckpointError(f"the checkpoint's {what} {path} is missing; the run cannot "
                              "be resumed from this checkpoint.")
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise _unreadable(path, what, f"{actual} bytes, the checkpoint recorded {size}")
    if not zipfile.is_zipfile(path):
        raise _unreadable(path, what, "not a complete zip file")
    problem = zip_problem(path) if members else None
    if problem is not None:
        raise _unreadable(path, what, problem)


def zip_problem(path):
    """Why the zip file `path` (`.keras`, `.npz`) cannot be read whole, or None: a member
    that does not match its CRC, or the archive's own error."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as err:
        return " ".join(str(err).split()) or type(err).__name__
    return None if bad is None else f"{bad} does not match its checksum"


def candidates(run_dir):
    """The directories of RUN_DIR that may hold a checkpoint: `checkpoint/`, then
    `.checkpoint-previous` and the `.checkpoint-*` temporaries a crash left."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [run_dir / CHECKPOINT] if (run_dir / CHECKPOINT).is_dir() else []
    found += sorted((p for p in run_dir.glob(f"{TEMPORARY_PREFIX}*")
                     if p.is_dir() and not p.is_symlink()),
                    key=lambda p: (p.name != PREVIOUS, p.name))
    return found


def _status(directories):
    """[(directory, state or None, CheckpointError or None)] for each directory."""
    found = []
    for directory in directories:
        try:
            found.append((directory, check_checkpoint(directory), None))
        except CheckpointError as err:
            found.append((directory, None, err))
    return found


def holds_checkpoint(run_dir):
    """Whether RUN_DIR holds a run to continue with --resume rather than to start over:
    a `checkpoint/`, or an intact checkpoint a crash left under another name."""
    run_dir = pathlib.Path(run_dir)
    return (run_dir / CHECKPOINT).is_dir() or any(
        state is not None for _, state, _ in _status(candidates(run_dir)))


def remove_unusable(run_dir):
    """Remove the `.checkpoint-*` directories that hold no intact checkpoint (a writer
    stopped in them, or damaged); returns their names. Only where nothing else writes
    into RUN_DIR (under its lock), and only when no checkpoint is to be resumed."""
    removed = []
    for directory, state, _ in _status(candidates(run_dir)):
        if directory.name != CHECKPOINT and state is None:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory.name)
    return removed


def recover(run_dir):
    """Make `RUN_DIR/checkpoint` the newest intact checkpoint the run folder holds, wherever
    a crash left it (`checkpoint/`, `.checkpoint-previous`, a complete `.checkpoint-*`),
    and remove the other checkpoint directories. Returns one line saying which checkpoint
    it is and what was removed.

    Raises `CheckpointError`, touching nothing, when none is intact: the damage of
    `checkpoint/` when it exists, else that the run has no (complete) checkpoint."""
    run_dir = pathlib.Path(run_dir)
    final = run_dir / CHECKPOINT
    found = _status(candidates(run_dir))
    intact = [(directory, state) for directory, state, _ in found if state is not None]
    if not intact:
        for directory, _, err in found:
            if directory == final:
                raise err
        if found:
            raise CheckpointError(
                f"{run_dir} holds no complete checkpoint "
                f"({', '.join(d.name for d, _, _ in found)}: incomplete or damaged): its run "
                "was stopped before its first checkpoint was whole, so no epoch can be "
                f"resumed; start the run again (the same command, with --out {run_dir}).")
        read_state(run_dir)  # raises the message for a folder without any checkpoint
    # the newest epoch; of equals, checkpoint/ (its swap had finished)
    chosen, state = max(intact, key=lambda item: (int(item[1].get("epoch", 0)),
                                                  item[0] == final))
    removed = []
    for directory, other, err in found:
        if directory == chosen:
            continue
        why = ("older" if other is not None else
               "incomplete" if not (directory / "state.json").is_file() else "damaged")
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(f"{directory.name} ({why})")
    if chosen != final:
        chosen.rename(final)
    atomic_files.fsync_dir(run_dir)
    where = (f"{final}" if chosen == final else
             f"{final}, recovered from {chosen.name} (the run was stopped while swapping "
             "its checkpoints)")
    line = f"resuming from the checkpoint of epoch {state.get('epoch')} in {where}"
    return line + (f"; removed {', '.join(removed)}" if removed else "")


def load_checkpoint(run_dir, expected_fingerprint):
    """(model, state) from RUN_DIR's checkpoint, after checking it fits this configuration."""
    state = read_state(run_dir)
    if state.get("fingerprint") != expected_fingerprint:
        raise CheckpointError(
            f"the checkpoint in {run_dir} was made with another model, corpus or vocabulary "
            "than its config.json now describes; resume with the original configuration.")
    directory = pathlib.Path(run_dir) / "checkpoint"
    model = _load_checkpoint_model(directory / "model.keras")
    try:
        rng = np.load(directory / "rng.npz")
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user problem
        raise CheckpointError(f"cannot read the checkpoint in {directory}: {err}") from err
    variables = _rng_variables(model)
    if len(rng.files) != len(variables):
        raise CheckpointError(f"{directory}/rng.npz holds {len(rng.files)} random-generator "
                              f"states but the model has {len(variables)}; the checkpoint does "
                              "not match the model.")
    for i, variable in enumerate(variables):
        variable.assign(rng[f"arr_{i}"])
    return model, state


def _load_checkpoint_model(path):
    """The model of a checkpoint; `CheckpointError` naming `path` when it is missing, or not
    a whole `.keras` (zip) file: Keras reports such a file as "File not found". Its members'
    CRCs are not read again: `--resume` checked the checkpoint whole (`recover`) before."""
    _check_zip(path, "model file", members=False)
    try:
        return load_model(path)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise _unreadable(path, "model file",
                          " ".join(str(err).split()) or type(err).__name__) from err
    except Exception as err:  # noqa: BLE001 - e.g. a class this code no longer registers
        reason = " ".join(str(err).split()) or type(err).__name__
        raise CheckpointError(f"cannot load the checkpoint's model file {path}: "
                              f"{reason}") from err
