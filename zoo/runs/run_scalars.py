"""Figures computed after training, written as TensorBoard scalars of the run.

Training writes `RUN_DIR/logs/train` and `RUN_DIR/logs/validation` (Keras' TensorBoard
callback). The evaluation commands (`zoo.evaluate`, dynamic evaluation, word similarity)
add theirs to `RUN_DIR/logs/evaluation`, so `tensorboard --logdir RUN_DIR/logs` shows them
beside the training curves. The step is the epoch of the model evaluated: the run's best
epoch (`metrics.json`) for `best.keras`, else its last.
"""

import json
import pathlib

EVALUATION_DIR = "evaluation"


def evaluated_epoch(run_dir, model_path):
    """The epoch the model `model_path` of `run_dir` is from, or 0 when unknown."""
    metrics = pathlib.Path(run_dir) / "metrics.json"
    if not metrics.exists():
        return 0
    try:
        results = json.loads(metrics.read_text(encoding="utf-8"))
    except ValueError:
        return 0
    if pathlib.Path(model_path).name == "best.keras":
        return int(results.get("best_epoch") or 0)
    history = results.get("history") or []
    return int(history[-1].get("epoch", len(history))) if history else 0


def log_scalars(run_dir, values, step):
    """Write `values` ({tag: number}) to `run_dir/logs/evaluation` at `step`; returns the
    folder. Tags are slash-separated groups, e.g. "dynamic_eval/test_perplexity"."""
    # deferred: the tensorboard package, only when scalars are logged
    from tflm.event_files import EventWriter

    folder = pathlib.Path(run_dir) / "logs" / EVALUATION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with EventWriter(folder) as writer:
        for tag, value in values.items():
            writer.scalar(tag, value, step)
    return folder
