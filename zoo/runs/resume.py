"""Resuming a run: what `--resume RUN` may change, and when a run is finished.

A resumed run continues with RUN's own configuration (config.json) from its last epoch
checkpoint, so that it ends exactly where the uninterrupted run would have. Flags that would
change that result are refused (`FIXED_FLAGS`): other settings make a new run, which can
start from RUN's weights with `--init-from RUN/best.keras`. What may be given:

  --epochs N    the run's total number of epochs: more than config.json's extend the run,
                fewer end it early (never fewer than the checkpoint has done); the new
                number is written into config.json
  --data-dir, --strategy, --quiet    where the corpus lies and how the run is executed

A run is finished when its checkpoint has done all the epochs of config.json (or the
non-monotonic rule of a finetuning run stopped it) and its metrics.json holds the results
of those epochs. Resuming it is refused, saying how to extend it, instead of rewriting its
results; a run killed (or stopped by a failed write) after its last checkpoint but before
its metrics.json was written (or rewritten, when it was being extended) only writes its
outputs.

Before any of that, `recover_run` repairs what a crash may have left in the folder: the
newest intact checkpoint is put back in `checkpoint/` (`zoo.runs.checkpoint.recover`) and
the temporaries of killed writes are removed.
"""

import json
import pathlib

from zoo.errors import UserError
from zoo.runs import atomic_files, checkpoint
from zoo.runs.run_outputs import RESULT_FILES
from zoo.runs.settings import TrainingSettings

# argparse destination -> flag: what a resume may not change.
FIXED_FLAGS = (("preset", "--preset"), ("corpus", "--corpus"), ("head", "--head"),
               ("batch_size", "--batch-size"), ("seed", "--seed"), ("precision", "--precision"),
               ("set", "--set"), ("init_from", "--init-from"), ("finetune", "--finetune"),
               ("out", "--out"))


def refuse_fixed_flags(args):
    """Raise `UserError` when `--resume` comes with a flag from `FIXED_FLAGS`."""
    given = [flag for dest, flag in FIXED_FLAGS if getattr(args, dest, None) not in (None, [])]
    if given:
        raise UserError(
            f"--resume {args.resume} continues that run with its own configuration, so "
            f"{', '.join(given)} cannot be given with it (only --epochs, --data-dir, "
            "--strategy, --export-preset and --quiet can); to train with other settings start "
            "a new run, e.g. "
            f"with --init-from {pathlib.Path(args.resume) / 'best.keras'}.")


def recover_run(run_dir):
    """Repair RUN_DIR after a crash, under its lock: the newest intact checkpoint into
    `checkpoint/`, the temporaries of killed writes removed. Returns the one line that
    says which checkpoint the run resumes from (and what was removed); `CheckpointError`,
    with nothing touched, when no checkpoint is intact."""
    line = checkpoint.recover(run_dir)
    orphans = atomic_files.remove_orphans(run_dir, RESULT_FILES)
    return line + (f"; removed the unfinished writes {', '.join(orphans)}" if orphans else "")


def read_config(run_dir):
    """RUN_DIR's config.json (`CheckpointError` when it is missing or corrupt)."""
    path = pathlib.Path(run_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise checkpoint.CheckpointError(f"{path} is missing; the run cannot be resumed "
                                         "without its configuration.") from None
    except json.JSONDecodeError as err:
        raise checkpoint.CheckpointError(f"{path} is corrupt ({err}); the run cannot be "
                                         "resumed from it.") from None
    if not isinstance(config, dict):
        raise checkpoint.CheckpointError(f"{path} is corrupt (a JSON {type(config).__name__}, "
                                         "not the object of settings zoo.train wrote); the "
                                         "run cannot be resumed from it.")
    return config


def _progress(run_dir):
    """(checkpoint state, config, epochs done, epochs planned, stopped by the rule)."""
    state = checkpoint.read_state(run_dir)
    config = read_config(run_dir)
    training = config.setdefault("training", {})
    return (state, config, int(state["epoch"]), TrainingSettings.from_dict(training).epochs,
            bool((state.get("trigger") or {}).get("stopped")))


def is_finished(run_dir, epochs=None):
    """Whether RUN_DIR has trained every epoch (of `epochs` when given), or was stopped by
    the non-monotonic rule, and written its results: a `--resume` would have nothing to do."""
    state, config, done, planned, stopped = _progress(run_dir)
    total = planned if epochs is None else epochs
    return bool((stopped or done >= total) and results_cover(run_dir, done))


def resume_config(run_dir, epochs=None):
    """(config, state, changed): RUN_DIR's configuration with `--epochs` applied, its
    checkpoint state, and whether config.json must be rewritten (the epochs changed).

    Raises `CheckpointError` for a missing or corrupt checkpoint or configuration, and
    `UserError` for a finished run or an `epochs` below what the checkpoint has done."""
    run_dir = pathlib.Path(run_dir)
    state, config, done, planned, stopped = _progress(run_dir)
    training = config["training"]
    if epochs is not None and epochs < done:
        raise UserError(f"--epochs {epochs} is fewer than the {done} epochs {run_dir} has "
                        "already trained (with --resume, --epochs is the run's new total).")
    if stopped and epochs is not None and epochs > done:
        raise UserError(f"{run_dir} was stopped by the non-monotonic rule after epoch {done}; "
                        "a stopped run cannot be extended with --epochs.")
    total = planned if epochs is None else epochs
    if (stopped or done >= total) and results_cover(run_dir, done):
        if stopped:
            raise UserError(f"{run_dir} is a finished run: the non-monotonic rule stopped it "
                            f"after epoch {done} (results in {run_dir / 'metrics.json'}); "
                            "there is nothing to resume.")
        raise UserError(f"{run_dir} is a finished run ({done} of {done} epochs; results in "
                        f"{run_dir / 'metrics.json'}); to train it further, give the new "
                        f"total: --resume {run_dir} --epochs N with N > {done}.")
    check_best_model(run_dir, state)
    changed = total != planned
    training["epochs"] = total
    return config, state, changed


def results_cover(run_dir, done):
    """Whether RUN_DIR's metrics.json holds the results of the checkpoint's `done` epochs
    (not those of a shorter run it was extending, and not unreadable: then a resume writes
    it again)."""
    path = pathlib.Path(run_dir) / "metrics.json"
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, or unreadable
        return False
    history = metrics.get("history") if isinstance(metrics, dict) else None
    if not history:
        return True
    return int(history[-1].get("epoch", 0)) >= done


def check_best_model(run_dir, state):
    """`CheckpointError` when the best model a resumed run evaluates at its end (RUN_DIR's
    best.keras, the checkpoint's best epoch) is missing or damaged: refused before any
    training instead of after it."""
    best = state.get("best")
    if not best:
        return
    path = pathlib.Path(run_dir) / "best.keras"
    what = f"{path} (the best model, epoch {best.get('epoch')})"
    fix = ("the resumed run evaluates it at its end, so nothing was resumed; put it back from "
           "a copy, or start a new run from the checkpoint's weights with --init-from "
           f"{pathlib.Path(run_dir) / checkpoint.CHECKPOINT / 'model.keras'}")
    if not path.is_file():
        raise checkpoint.CheckpointError(f"{what} is missing; {fix}.")
    bad = checkpoint.zip_problem(path)
    if bad is not None:
        raise checkpoint.CheckpointError(f"{what} is unreadable (corrupt or truncated: {bad}); "
                                         f"{fix}.")
