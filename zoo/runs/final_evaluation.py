"""The passes a run ends with: the best model on the validation and test splits, at the
protocol's batch sizes and bptt (`training.final_evaluation`), under XLA where it pays."""

import math

from tflm import data
from zoo.runtime import interrupt

XLA_MIN_WINDOWS = 500
"""`training.xla_evaluation: "auto"` compiles an evaluation pass with XLA (TensorFlow) from
this many windows: a compile costs ~2-4 s on the CPU of bench/training/results/reference_throughput.md and saves
~3-4 ms per batch-1 window there (the PTB test split: 2,355 windows, 30 -> 20-22 s)."""


def xla_pays(setting, ids, batch, bptt):
    """`model.xla_evaluation` for a pass over `ids` at `batch` x `bptt`: `setting` true or
    false as given, "auto" when the pass has at least `XLA_MIN_WINDOWS` windows of `bptt`
    (the protocol's: XLA pays per time step, whatever window `zoo.runs.eval_window` computes
    with; at 700-token windows the PTB test pass took 19.7 s op by op and 15.4 s under XLA,
    one CPU)."""
    if setting != "auto":
        return bool(setting)
    return len(ids) // max(batch * bptt, 1) >= XLA_MIN_WINDOWS


def final_evaluation(best_model, corpus, training, eval_window, pad, pad_to_compiled, best,
                     best_validated_as_saved, timer):
    """The final figures of a run: `{"evaluation": protocol, "valid_perplexity": ...,
    "test_perplexity": ...}` (+ bits per character on a character-level corpus).

    `training`: the run's `TrainingSettings`; `eval_window(bptt, batch)`: the window a pass
    computes with; `best`: the best epoch's logs. When best.keras holds the very weights
    the best epoch validated (`best_validated_as_saved`) and the final protocol is the
    training validation's, that epoch's figure is the validation result (the reference
    reports it too) and the pass is not repeated."""
    final_bptt = training.final_bptt
    results = {"evaluation": {"bptt": final_bptt, "windows": {}}}
    for split, size in (("valid", training.final_valid_batch_size),
                        ("test", training.final_test_batch_size)):
        results["evaluation"][f"{split}_batch_size"] = size
        window = eval_window(final_bptt, size)
        results["evaluation"]["windows"][split] = window
        if (split == "valid" and best_validated_as_saved and size == training.eval_batch_size
                and window == eval_window(training.bptt, training.eval_batch_size)
                and best.get("val_perplexity") is not None):
            results["valid_perplexity"] = float(best["val_perplexity"])
            results["evaluation"]["valid_from"] = f"epoch {best['epoch']}'s validation"
            continue
        ds = data.lm_batches(corpus.split(split), size, window, train=False,
                             pad_to_multiple=pad)
        best_model.xla_evaluation = xla_pays(training.xla_evaluation, corpus.split(split),
                                             size, final_bptt)
        best_model.pad_to_compiled_lengths = pad_to_compiled
        best_model.make_test_function(force=True)  # XLA or not, per split
        with timer.phase(f"evaluate_{split}"):
            results[f"{split}_perplexity"] = float(best_model.evaluate(
                ds, verbose=0, return_dict=True,
                callbacks=[interrupt.CheckCtrlC()])["perplexity"])
    if getattr(corpus, "level", "word") == "char":  # bits per character = log2(perplexity)
        for split in ("valid", "test"):
            results[f"{split}_bpc"] = math.log2(results[f"{split}_perplexity"])
    return results
