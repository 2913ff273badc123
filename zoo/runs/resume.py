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
non-monotonic rule of a finetuning run stopped it) and its metrics.json is written.
Resuming it is refused, saying how to extend it, instead of rewriting its results; a run
killed after its last checkpoint but before metrics.json only writes its outputs.
"""

import json
import pathlib

from zoo.errors import UserError
from zoo.runs import checkpoint
from zoo.runs.settings import TrainingSettings

# argparse destination -> flag: what a resume may not change.
FIXED_FLAGS = (("preset", "--preset"), ("corpus", "--corpus"), ("head", "--head"),
               ("batch_size", "--batch-size"), ("seed", "--seed"), ("set", "--set"),
               ("init_from", "--init-from"), ("finetune", "--finetune"), ("out", "--out"))


def refuse_fixed_flags(args):
    """Raise `UserError` when `--resume` comes with a flag from `FIXED_FLAGS`."""
    given = [flag for dest, flag in FIXED_FLAGS if getattr(args, dest, None) not in (None, [])]
    if given:
        raise UserError(
            f"--resume {args.resume} continues that run with its own configuration, so "
            f"{', '.join(given)} cannot be given with it (only --epochs, --data-dir, "
            "--strategy and --quiet can); to train with other settings start a new run, e.g. "
            f"with --init-from {pathlib.Path(args.resume) / 'best.keras'}.")


def read_config(run_dir):
    """RUN_DIR's config.json (`CheckpointError` when it is missing or corrupt)."""
    path = pathlib.Path(run_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise checkpoint.CheckpointError(f"{path} is missing; the run cannot be resumed "
                                         "without its configuration.") from None
    except json.JSONDecodeError as err:
        raise checkpoint.CheckpointError(f"{path} is corrupt ({err}); the run cannot be "
                                         "resumed from it.") from None


def resume_config(run_dir, epochs=None):
    """(config, state, changed): RUN_DIR's configuration with `--epochs` applied, its
    checkpoint state, and whether config.json must be rewritten (the epochs changed).

    Raises `CheckpointError` for a missing or corrupt checkpoint or configuration, and
    `UserError` for a finished run or an `epochs` below what the checkpoint has done."""
    run_dir = pathlib.Path(run_dir)
    state = checkpoint.read_state(run_dir)
    config = read_config(run_dir)
    training = config.setdefault("training", {})
    done, planned = int(state["epoch"]), TrainingSettings.from_dict(training).epochs
    stopped = bool((state.get("trigger") or {}).get("stopped"))
    if epochs is not None and epochs < done:
        raise UserError(f"--epochs {epochs} is fewer than the {done} epochs {run_dir} has "
                        "already trained (with --resume, --epochs is the run's new total).")
    if stopped and epochs is not None and epochs > done:
        raise UserError(f"{run_dir} was stopped by the non-monotonic rule after epoch {done}; "
                        "a stopped run cannot be extended with --epochs.")
    total = planned if epochs is None else epochs
    if (stopped or done >= total) and (run_dir / "metrics.json").exists():
        if stopped:
            raise UserError(f"{run_dir} is a finished run: the non-monotonic rule stopped it "
                            f"after epoch {done} (results in {run_dir / 'metrics.json'}); "
                            "there is nothing to resume.")
        raise UserError(f"{run_dir} is a finished run ({done} of {done} epochs; results in "
                        f"{run_dir / 'metrics.json'}); to train it further, give the new "
                        f"total: --resume {run_dir} --epochs N with N > {done}.")
    changed = total != planned
    training["epochs"] = total
    return config, state, changed
