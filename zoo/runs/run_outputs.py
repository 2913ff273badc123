"""A training run's result files, each written whole or not at all, and the one line a
failed write gives: the file, why, what the run folder still holds, how to go on.

  best.keras     at every epoch that improves on the validation perplexity (`save_best`)
  checkpoint/    after every epoch (`save_checkpoint`, over `zoo.runs.checkpoint`)
  final.keras    at the end (`save_final`), then metrics.json (`write_metrics`)
  config.json    rewritten when `--resume` gives a new `--epochs` (`rewrite_config`)

(A new run's config.json and vocab.txt: `zoo.runs.run_dir`.) Every file goes through
`zoo.runs.atomic_files`, so a failure at any byte leaves the previous file whole. A failed
write (an `OSError`: a full disk, a file-size limit) raises `WriteError`, which
`python -m zoo.train` prints as one line (exit 2), e.g.

    cannot write runs/r/best.keras (File too large); kept intact: the previous best.keras
    (epoch 3), the checkpoint of epoch 4; raise the file-size limit (ulimit -f), then
    continue with: python -m zoo.train --resume runs/r
"""

import contextlib
import errno
import json
import pathlib

from zoo.runs import atomic_files, checkpoint

# Every file zoo.train writes at a run folder's top (a temporary a kill left beside one of
# them is removed under the folder's lock: zoo.runs.resume, zoo.runs.run_dir).
RESULT_FILES = ("config.json", "vocab.txt", "best.keras", "final.keras", "metrics.json")

_REMEDIES = {errno.EFBIG: "raise the file-size limit (ulimit -f)",
             errno.ENOSPC: "free space on the disk", errno.EDQUOT: "free space in your quota",
             errno.EACCES: "make the run folder writable",
             errno.EROFS: "move the run folder to a writable disk"}


def save_best(model, out, previous_epoch):
    """Save `model` as `out/best.keras`; `previous_epoch` is the epoch of the best.keras it
    replaces (None when there is none)."""
    path = pathlib.Path(out) / "best.keras"
    with failing_with_what_is_kept(path, previous_epoch):
        atomic_files.save_model(model, path)


def save_checkpoint(out, model, state):
    """The epoch checkpoint (`zoo.runs.checkpoint.save_checkpoint`); best.keras holds the
    epoch of `state["best"]`."""
    try:
        checkpoint.save_checkpoint(out, model, state)
    except OSError as err:
        raise failed(pathlib.Path(out) / checkpoint.CHECKPOINT, err,
                     (state.get("best") or {}).get("epoch"),
                     what=f"the checkpoint of epoch {state.get('epoch')} into") from err


def save_final(model, out, best_epoch):
    """Save `model` as `out/final.keras` (after the last epoch)."""
    path = pathlib.Path(out) / "final.keras"
    with failing_with_what_is_kept(path, best_epoch):
        atomic_files.save_model(model, path)


def write_metrics(out, results):
    """Write `results` as `out/metrics.json`; a failure names the figures it computed, so
    that they are not lost with the file."""
    path = pathlib.Path(out) / "metrics.json"
    try:
        atomic_files.write_json(path, results)
    except OSError as err:
        figures = ", ".join(f"{key.replace('_', ' ')} {results[key]:.2f}" for key in
                            ("valid_perplexity", "test_perplexity") if key in results)
        raise failed(path, err, results.get("best_epoch"),
                     lost=f"the results ({figures}) were computed but not saved" if figures
                     else None) from err


def rewrite_config(out, config, best_epoch):
    """Rewrite `out/config.json` (a resume's new --epochs)."""
    path = pathlib.Path(out) / "config.json"
    with failing_with_what_is_kept(path, best_epoch):
        atomic_files.write_json(path, config)


@contextlib.contextmanager
def failing_with_what_is_kept(path, best_epoch):
    """Within the block, an `OSError` writing `path` becomes `failed(path, ...)`."""
    try:
        yield
    except OSError as err:
        raise failed(path, err, best_epoch) from err


def failed(path, err, best_epoch, what=None, lost=None):
    """The `WriteError` for `path` (in a run folder) whose write failed with `err`: what
    the folder still holds (best.keras holds `best_epoch`) and how to go on."""
    out = path.parent
    held = kept(out, best_epoch, failed_name=path.name)
    resumable = _checkpoint_epoch(out) is not None
    remedy = _REMEDIES.get(getattr(err, "errno", None), "remove the cause")
    todo = (f"{remedy}, then continue with: python -m zoo.train --resume {out}" if resumable
            else f"{remedy}, then start the run again")
    if not resumable:
        kept_line = "nothing of the run is kept (no epoch had been checkpointed)"
    else:
        kept_line = "kept intact: " + ", ".join(held)
    line = f"cannot write {what + ' ' if what else ''}{path} ({atomic_files.reason(err)})"
    if lost:
        line += f"; {lost}"
    return atomic_files.WriteError(f"{line}; {kept_line}; {todo}")


def kept(out, best_epoch=None, failed_name=None):
    """What the run folder `out` holds, as phrases ("the checkpoint of epoch 4", "best.keras
    (epoch 3)", ...); the file named `failed_name` is "the previous" one."""
    out = pathlib.Path(out)
    held = []
    epoch = _checkpoint_epoch(out)
    if epoch is not None:
        held.append(f"the previous checkpoint (epoch {epoch})"
                    if failed_name == checkpoint.CHECKPOINT else
                    f"the checkpoint of epoch {epoch}")
    for name in ("best.keras", "final.keras", "metrics.json"):
        if not (out / name).is_file():
            continue
        detail = {"best.keras": f" (epoch {best_epoch})" if best_epoch is not None else "",
                  "metrics.json": _metrics_detail(out / name)}.get(name, "")
        held.append(f"{'the previous ' if name == failed_name else ''}{name}{detail}")
    if failed_name == "config.json" and (out / "config.json").is_file():
        held.append("the previous config.json")
    return held


def _checkpoint_epoch(out):
    try:
        return checkpoint.read_state(out)["epoch"]
    except (checkpoint.CheckpointError, KeyError, OSError):
        return None


def _metrics_detail(path):
    try:
        history = json.loads(path.read_text(encoding="utf-8")).get("history") or []
        return f" (the results at epoch {history[-1]['epoch']})"
    except (OSError, ValueError, AttributeError, IndexError, KeyError, TypeError):
        return ""
