"""Epoch checkpoints that a killed run resumes from, written so the last good one survives.

A checkpoint is a directory `RUN_DIR/checkpoint/` with
  model.keras      model weights and optimizer state (ASGD averages included)
  rng.npz          the dropout `SeedGenerator` states (not part of `.keras` files)
  state.json       epoch reached, history, best-so-far, trigger state, config fingerprint

It is written into a fresh temporary directory and then swapped in with renames, so a crash
while saving leaves the previous checkpoint in place; a checkpoint that fails to load raises
`CheckpointError` naming the file and what to do, and nothing is overwritten.
"""

import hashlib
import json
import pathlib
import shutil
import tempfile
import zipfile
import zlib

import keras
import numpy as np

from zoo.models.saving import load_model

STATE_VERSION = 1


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


def save_checkpoint(run_dir, model, state):
    """Write `RUN_DIR/checkpoint` atomically (model, optimizer, RNG, `state` dict)."""
    run_dir = pathlib.Path(run_dir)
    final = run_dir / "checkpoint"
    old = run_dir / ".checkpoint-previous"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=run_dir))
    try:
        model.save(tmp / "model.keras")
        np.savez(tmp / "rng.npz", *[keras.ops.convert_to_numpy(v.value)
                                    for v in _rng_variables(model)])
        (tmp / "state.json").write_text(json.dumps(dict(state, version=STATE_VERSION), indent=2))
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:  # a failure or a Ctrl-C: the previous checkpoint stays in place
        if not final.exists() and old.exists():
            old.rename(final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_state(run_dir):
    """The `state.json` of RUN_DIR's checkpoint (CheckpointError if absent or corrupt)."""
    path = pathlib.Path(run_dir) / "checkpoint" / "state.json"
    if not path.exists():
        raise CheckpointError(f"no checkpoint in {run_dir} (expected {path}); start a new run "
                              "instead of --resume.")
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is corrupt ({err}); the run cannot be resumed from it.")
    if state.get("version") != STATE_VERSION:
        raise CheckpointError(f"{path} has format version {state.get('version')}, expected "
                              f"{STATE_VERSION}.")
    return state


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
    a whole `.keras` (zip) file: Keras reports such a file as "File not found"."""
    def unreadable(reason):
        return CheckpointError(f"the checkpoint's model file {path} is unreadable (corrupt or "
                               f"truncated: {reason}); the run cannot be resumed from this "
                               "checkpoint.")
    if not path.is_file():
        raise CheckpointError(f"the checkpoint's model file {path} is missing; the run cannot "
                              "be resumed from this checkpoint.")
    if not zipfile.is_zipfile(path):
        raise unreadable("not a complete .keras zip file")
    try:
        return load_model(path)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise unreadable(" ".join(str(err).split()) or type(err).__name__) from err
    except Exception as err:  # noqa: BLE001 - e.g. a class this code no longer registers
        reason = " ".join(str(err).split()) or type(err).__name__
        raise CheckpointError(f"cannot load the checkpoint's model file {path}: "
                              f"{reason}") from err
