"""`python -m zoo.evaluate`: the perplexity of a saved model, as training reports it.

    python -m zoo.evaluate RUN_DIR|MODEL.keras [--split test|valid] [--batch-size 1]
        [--bptt T] [--window auto|bptt|T] [--corpus NAME] [--data-dir DIR] [--json OUT]
        [--quiet]

The pass is the one `python -m zoo.train` ends with (`zoo.runs.training`): the split batchified
into `--batch-size` streams (the references' test protocol, batch 1, is the default), cut
into windows of `--bptt` (default: the run's final-evaluation bptt, else 70), the state
carried from window to window, evaluation mode, `model.evaluate`; computed at the longer
windows `--window` names (default: as the run did, `zoo.runs.eval_window`), which give the same
log-probabilities when the state carries; perplexity =
exp(total NLL / tokens predicted), and for a character-level corpus (`ptb-char`) bits per
character, bpc = total NLL / (tokens ln 2) = log2(perplexity). With the run's own batch
size and bptt it reproduces `metrics.json` exactly.

Writes: the line printed, the result appended to `RUN_DIR/evaluations.json` (a list: one
entry per evaluation, with the model, split, protocol and perplexity) and `--json OUT` when
given, and the perplexity as a TensorBoard scalar of the run (`evaluate/<split>_perplexity`
in `RUN_DIR/logs/evaluation`, at the evaluated model's epoch) for a zoo run.

Other evaluations of a saved model: `python -m zoo.dynamic_eval` (dynamic evaluation),
`python -m zoo.cache_pointer` (the continuous cache pointer), `python -m tools.qmatrix`
(the log-probability matrix).
"""

import argparse
import json
import math
import time

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime import progress
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.user_errors import one_line_errors

EVALUATIONS_FILE = "evaluations.json"


def run_window(training, split_bptt, batch_size, vocab_size, carries_state, setting=None):
    """The window `zoo.train` computes a pass at `batch_size` x `split_bptt` with
    (`zoo.runs.eval_window.window_for_run`), a bad `setting` as a `UserError`."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.eval_window import window_for_run
    try:
        return window_for_run(training, split_bptt, batch_size, vocab_size, carries_state,
                              setting)
    except ValueError as err:
        raise UserError(f"--window: {err}") from err


def evaluate(run, split="test", batch_size=1, bptt=None, verbose=0, window=None):
    """Evaluate `run` (a `zoo.runs.saved_run.SavedRun`) on `split`; returns the result dict.
    `window`: the window computed with ("auto", "bptt" or an integer; default the run's
    setting, else "auto"): the perplexity is the bptt windows' (`zoo.runs.eval_window`)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from tflm import data
    from zoo.runs.builders import pad_to_multiple

    bptt = run.training.final_bptt if bptt is None else int(bptt)
    if batch_size < 1 or bptt < 1:
        raise UserError(f"--batch-size and --bptt must be positive; got {batch_size}, {bptt}.")
    window = run_window(run.training, bptt, batch_size, run.model.vocab_size,
                        getattr(run.model, "carry_state", True), window)
    ids = run.corpus.split(split)
    if len(ids) < 2 * batch_size:
        raise UserError(f"the {split} split has {len(ids)} tokens; --batch-size {batch_size} "
                        f"needs at least {2 * batch_size} (an input and a target per stream).")
    pad = pad_to_multiple(run.training)
    ds = data.lm_batches(ids, batch_size, window, train=False, pad_to_multiple=pad)
    start = time.perf_counter()
    logs = run.model.evaluate(ds, verbose=verbose, return_dict=True)
    seconds = time.perf_counter() - start
    tokens = (len(ids) // batch_size - 1) * batch_size
    return {"model": str(run.model_path), "corpus": run.corpus.name, "split": split,
            "batch_size": batch_size, "bptt": bptt, "window": window,
            "perplexity": float(logs["perplexity"]),
            "loss": math.log(float(logs["perplexity"])), "tokens": tokens,
            "seconds": seconds, "words_per_second": tokens / max(seconds, 1e-9),
            **({"bpc": math.log2(float(logs["perplexity"]))}
               if getattr(run.corpus, "level", "word") == "char" else {})}


def record(run, result):
    """Append `result` to the run's evaluations.json (kept when unreadable: a new name),
    rewritten atomically (`zoo.runs.atomic_files`): a failed write (`WriteError`, one
    line) leaves the earlier evaluations whole."""
    path = run.run_dir / EVALUATIONS_FILE
    entries = []
    if path.exists():
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            path = path.with_name(f"evaluations-{int(time.time())}.json")
    entries.append(result)
    kept = (f"the {len(entries) - 1} earlier evaluations in it are intact" if path.exists()
            else "no earlier evaluation was lost")
    with atomic_files.failing_in_one_line(path, kept, "the result is the line above; free "
                                          "space (or make the folder writable) and evaluate "
                                          "again to record it"):
        atomic_files.write_json(path, entries)
    return path


def _window(text):
    return text if text in ("auto", "bptt") else int(text)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m zoo.evaluate",
                                description="Perplexity of a saved language model, as "
                                            "`python -m zoo.train` reports it.")
    p.add_argument("target", metavar="RUN_DIR|MODEL.keras")
    p.add_argument("--split", default="test", choices=["valid", "test"])
    p.add_argument("--batch-size", type=int, default=1,
                   help="parallel streams (1: the references' test protocol)")
    p.add_argument("--bptt", type=int, help="the protocol's window length (default: the "
                   "run's, else 70)")
    p.add_argument("--window", type=_window, help='the window computed with: "auto" '
                   '(longer windows, the same perplexity: zoo.runs.eval_window), "bptt", or a '
                   "length (default: the run's training.eval_window, else auto)")
    p.add_argument("--corpus", help="the corpus, when not the run's own")
    p.add_argument("--data-dir")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


@one_line_errors("zoo.evaluate")
def main(argv=None):
    """The command line; returns 0, or 2 after a one-line error (`zoo.runtime.user_errors`;
    a result computed before a late failure is printed first)."""
    start_command()
    args = build_parser().parse_args(argv)
    imports_done()  # the frameworks' objects: no full GC walks them
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.run_scalars import evaluated_epoch, log_scalars
    from zoo.runs.saved_run import open_for_command
    prog = "zoo.evaluate"
    run = open_for_command(args, prog)  # --json checked before the passes
    result = evaluate(run, args.split, args.batch_size, args.bptt,
                      verbose=0 if args.quiet else progress.verbosity(),
                      window=args.window)
    bpc = f"{args.split} bpc {result['bpc']:.3f}, " if "bpc" in result else ""
    print(f"{bpc}{args.split} perplexity {result['perplexity']:.2f} (batch {result['batch_size']}, "
          f"bptt {result['bptt']}, {result['tokens']} tokens, "
          f"{result['words_per_second']:.0f} words/s) of {run.model_path}")
    if run.config is not None:
        record(run, result)  # a failed write is one line; the result is printed above
        log_scalars(run.run_dir, {f"evaluate/{args.split}_perplexity": result["perplexity"]},
                    evaluated_epoch(run.run_dir, run.model_path))
    if args.json:
        atomic_files.write_result_json(args.json, result)
    return 0


if __name__ == "__main__":
    run_command(main)
