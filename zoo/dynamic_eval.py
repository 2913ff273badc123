"""Dynamic evaluation: the model keeps learning from the text it has just scored.

Krause et al. 2018 ("Dynamic Evaluation of Neural Sequence Models"), as the MoS code runs
it (zihangdai/mos `dynamiceval.py`, Krause's "old" hyperparameter scaling; Yang et al. 2018
Tables 1, 2, 9):

1. Gradient statistics on the training split, batchified into `batch_size` (100) streams and
   cut into windows of `bptt` (5), the state carried across windows: for every parameter
   tensor p, MS_p = sqrt(sum_windows g_p^2), g_p the gradient of the window's mean NLL.
   Then gsum = sum_p mean(MS_p) and decrate_p = MS_p / gsum.
2. Evaluation at batch 1, windows of `bptt`, state carried from zeros: decrate_p is clipped
   at 1 / lambda; each window is scored with the current parameters theta, then

       theta_p += lambda * decrate_p * (theta0_p - theta_p) - eta * g_p / (MS_p + eps)

   with theta0 the parameters before dynamic evaluation and g_p the gradient of the window's
   mean NLL. Every token is scored before the update that uses it; the first token of the
   split is never scored; perplexity = exp(total NLL / scored tokens) (the reference weights
   the short last window by its length: the same number).

Both passes run in evaluation mode: no dropout of any kind. (The PyTorch-0.4 port of the
MoS code sets `use_dropout = False` under `model.train()`, which leaves WeightDrop's
DropConnect on; the original PyTorch-0.2 code that produced the published numbers runs
`model.eval()`.)

Scalings (`scaling=`):
- "old" (the MoS code, the default; Krause's `--oldhyper`): as above.
- "new" (benkrause/dynamic-evaluation, the paper's equations): MS_p = sqrt(sum g_p^2 / n)
  with n the number of statistics windows, gsum = mean_p mean(MS_p). The same run in new
  units: lambda_new = lambda_old / P, eta_new = eta_old / sqrt(n), eps_new = eps_old /
  sqrt(n), P the number of parameter tensors (`old_to_new`, `new_to_old`).
- "lamb" (deepmind/lamb `lamb/dyneval.py`, the Mogrifier LSTM's dynamic evaluation, Melis
  et al. 2020): MS_p = sqrt(sum g_p^2 / n) as "new", but gsum is the mean over every
  element of every tensor, gsum = sum_p sum(MS_p) / sum_p size(p), so a large tensor
  weighs more than in "new". The update is the same: lamb's decay_rate is lambda, its
  min(1, decay_rate MS_p / gsum) is lambda min(decrate_p, 1 / lambda). Its defaults
  (`lamb_flags.py`: learning rate 0.001, decay 0.02, epsilon 1e-5) are in the Mogrifier
  presets; lamb tunes them per model (`tune_dyneval.sh`) and publishes no tuned values.

Parameter tensors: `model.trainable_variables`, a tied embedding once (as the reference's
one shared parameter). The number P and so gsum depend on how the parameters are split into
tensors: a model built as the reference (`init="pytorch", lstm_biases=2`) has the
reference's tensors (Keras' LSTM kernel and recurrent kernel are PyTorch's weight_ih and
weight_hh transposed; the mean of MS is the same).

Differences from the reference, stated: the reference's loop stops one token early when
(len(split) - 1) mod bptt == 1 (that last token is never scored); here every token from the
second on is scored. The statistics pass follows the reference exactly (its loop also skips
a last window of one position).

Published (valid / test perplexity): PTB AWD-LSTM-MoS 48.33 / 47.69 (from 56.54 / 54.44),
WT2 42.41 / 40.68 (from 63.88 / 61.45); AWD-LSTM (Krause) PTB 51.6 / 51.1, WT2 46.4 / 44.3.

CLI:
    python -m zoo.dynamic_eval RUN_DIR|MODEL.keras [--split test|valid] [--lamb L]
        [--lr ETA] [--epsilon EPS] [--scaling old|new|lamb] [--batch-size 100] [--bptt 5]
        [--max-batches N] [--corpus NAME] [--data-dir DIR] [--json OUT] [--quiet]
The settings default to the `dynamic_evaluation` part of the run's preset (the published
ones), else to the MoS code's defaults (lambda 0.02, eta 0.002, eps 0.001).
"""

import argparse
import dataclasses
import math
import sys
import time

import numpy as np

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.progress import verbosity
from zoo.runtime.user_errors import one_line_errors

DEFAULTS = {"lamb": 0.02, "lr": 0.002, "epsilon": 0.001, "batch_size": 100, "bptt": 5,
            "scaling": "old"}
SCALINGS = ("old", "new", "lamb")


@dataclasses.dataclass
class Settings:
    """Dynamic-evaluation hyperparameters (the MoS code's names: `--lamb`, `--lr`,
    `--epsilon`, `--batch_size`, `--bptt`, `--max_batches`)."""

    lamb: float = DEFAULTS["lamb"]
    lr: float = DEFAULTS["lr"]
    epsilon: float = DEFAULTS["epsilon"]
    batch_size: int = DEFAULTS["batch_size"]
    bptt: int = DEFAULTS["bptt"]
    scaling: str = DEFAULTS["scaling"]
    max_batches: int = None

    def check(self):
        for name in ("lamb", "lr", "epsilon"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise UserError(f"dynamic evaluation: {name} must be a number > 0; got "
                                f"{value!r}.")
        for name in ("batch_size", "bptt"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"dynamic evaluation: {name} must be a positive integer; "
                                f"got {value!r}.")
        if self.max_batches is not None and self.max_batches < 1:
            raise UserError("dynamic evaluation: max_batches must be >= 1 (or unset: the "
                            "whole training split).")
        if self.scaling not in SCALINGS:
            raise UserError(f"dynamic evaluation: scaling must be one of "
                            f"{', '.join(SCALINGS)}; got {self.scaling!r}.")
        return self


def old_to_new(lamb, lr, epsilon, num_tensors, num_batches):
    """The same dynamic evaluation in the "new" units: (lambda, eta, eps)."""
    root = math.sqrt(num_batches)
    return lamb / num_tensors, lr / root, epsilon / root


def new_to_old(lamb, lr, epsilon, num_tensors, num_batches):
    """The inverse of `old_to_new`."""
    root = math.sqrt(num_batches)
    return lamb * num_tensors, lr * root, epsilon * root


@dataclasses.dataclass
class Statistics:
    """What the statistics pass leaves: MS_p and decrate_p per parameter tensor (NumPy),
    the number of windows n and the mean training NLL over them."""

    ms: list
    decrate: list
    num_batches: int
    train_loss: float


def _segments(num_positions, bptt):
    """Window starts and lengths over `num_positions` positions, the reference's way: all
    `bptt` long but the last, a last window of one position left out."""
    starts, i = [], 0
    while i < num_positions - 1:
        starts.append((i, min(bptt, num_positions - i)))
        i += bptt
    return starts


def gradient_statistics(model, train_ids, settings, progress=False):
    """Step 1: MS_p and decrate_p from the training split (`Statistics`)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    import keras

    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from tflm import backends
    from tflm.data import batchify

    settings.check()
    backend = backends.current()
    streams = batchify(np.asarray(train_ids), settings.batch_size)
    segments = _segments(streams.shape[1] - 1, settings.bptt)
    if settings.max_batches:
        segments = segments[:settings.max_batches]
    variables = model.trainable_variables
    # float32 sums on the backend's device, as the reference's (no copy per window)
    sums = [keras.ops.zeros(v.shape, "float32") for v in variables]
    bar = keras.utils.Progbar(len(segments), unit_name="window",
                                 verbose=verbosity()) if progress else None
    states, total = None, 0.0
    for k, (i, length) in enumerate(segments):
        loss, grads, states = backend.window_gradients(
            model, streams[:, i:i + length], streams[:, i + 1:i + 1 + length], states)
        sums = [acc + keras.ops.square(keras.ops.cast(g, "float32"))
                for acc, g in zip(sums, grads)]
        total += float(keras.ops.convert_to_numpy(loss))
        if bar is not None:
            bar.update(k + 1)
    sums = [keras.ops.convert_to_numpy(acc).astype(np.float64) for acc in sums]
    n = len(segments)
    ms = [np.sqrt(s) if settings.scaling == "old" else np.sqrt(s / n) for s in sums]
    if settings.scaling == "old":
        gsum = sum(float(m.mean()) for m in ms)
    elif settings.scaling == "new":
        gsum = sum(float(m.mean()) for m in ms) / len(ms)
    else:  # "lamb": the mean over all elements
        gsum = sum(float(m.sum()) for m in ms) / sum(m.size for m in ms)
    if gsum <= 0:
        raise UserError("dynamic evaluation: every gradient on the training split is zero; "
                        "the model cannot be adapted.")
    decrate = [m / gsum for m in ms]
    return Statistics(ms=[m.astype(np.float32) for m in ms],
                      decrate=[d.astype(np.float32) for d in decrate], num_batches=n,
                      train_loss=total / max(n, 1))


def dynamic_evaluate(model, ids, settings, statistics, progress=False, restore=True):
    """Step 2 on the token ids of a split; returns {"perplexity", "loss", "tokens",
    "seconds", "words_per_second"}. The model's weights are restored afterwards unless
    `restore=False` (then they are the adapted ones)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    import keras

    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from tflm import backends

    settings.check()
    backend = backends.current()
    ids = np.asarray(ids, dtype=np.int32)
    if len(ids) < 2:
        raise UserError(f"dynamic evaluation needs at least 2 tokens; the split has "
                        f"{len(ids)}.")
    variables = model.trainable_variables
    theta0 = [keras.ops.convert_to_numpy(v).copy() for v in variables]
    # theta <- (1 - a) theta + a theta0 - b g  with  a = lambda * min(decrate, 1 / lambda),
    # b = eta / (MS + eps): the update of the docstring with its constants folded.
    a_np = [settings.lamb * np.minimum(d, 1.0 / settings.lamb) for d in statistics.decrate]
    keep = [keras.ops.convert_to_tensor(1.0 - a, v.dtype) for a, v in zip(a_np, variables)]
    anchor = [keras.ops.convert_to_tensor(a * t, v.dtype)
              for a, t, v in zip(a_np, theta0, variables)]
    step = [keras.ops.convert_to_tensor(settings.lr / (m + settings.epsilon), v.dtype)
            for m, v in zip(statistics.ms, variables)]
    lengths = _eval_lengths(len(ids) - 1, settings.bptt)
    bar = keras.utils.Progbar(len(ids) - 1, unit_name="token",
                                 verbose=verbosity()) if progress else None
    states, nll, start, t0 = None, 0.0, 0, time.perf_counter()
    try:
        for length in lengths:
            x = ids[None, start:start + length]
            y = ids[None, start + 1:start + 1 + length]
            loss, grads, states = backend.window_gradients(model, x, y, states)
            nll += float(keras.ops.convert_to_numpy(loss)) * length
            for v, g, k, c, s in zip(variables, grads, keep, anchor, step):
                v.assign(k * v.value + c - s * keras.ops.cast(g, v.dtype))
            start += length
            if bar is not None:
                bar.update(start)
    finally:
        if restore:
            for v, t in zip(variables, theta0):
                v.assign(t)
    seconds = time.perf_counter() - t0
    tokens = len(ids) - 1
    return {"perplexity": math.exp(nll / tokens), "loss": nll / tokens, "tokens": tokens,
            "seconds": seconds, "words_per_second": tokens / max(seconds, 1e-9)}


def _eval_lengths(num_positions, bptt):
    full, rest = divmod(num_positions, bptt)
    return [bptt] * full + ([rest] if rest else [])


def static_perplexity(model, ids, bptt):
    """Perplexity at batch 1 with windows of `bptt`, no adaptation (the comparison)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    import keras

    ids = np.asarray(ids, dtype=np.int32)
    states, nll, start = None, 0.0, 0
    for length in _eval_lengths(len(ids) - 1, bptt):
        log_probs, states = model.forward_with_state(ids[None, start:start + length], states,
                                                     training=False)
        block = keras.ops.convert_to_numpy(log_probs)[0]
        nll -= float(block[np.arange(length), ids[start + 1:start + 1 + length]].sum())
        start += length
    return math.exp(nll / (len(ids) - 1))


def settings_for(run, overrides):
    """`Settings` from the run's preset (`dynamic_evaluation`), then the command line."""
    values = dict(DEFAULTS)
    preset = (run.config or {}).get("dynamic_evaluation") or {}
    values.update({k: v for k, v in preset.items() if k in DEFAULTS or k == "max_batches"})
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values).check()


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m zoo.dynamic_eval",
        description="Dynamic evaluation (Krause et al. 2018, as the MoS code runs it) of a "
                    "saved language model.")
    p.add_argument("target", metavar="RUN_DIR|MODEL.keras")
    p.add_argument("--split", default="test", choices=["valid", "test"])
    p.add_argument("--lamb", type=float, help="decay towards the original weights, lambda")
    p.add_argument("--lr", type=float, help="learning rate eta")
    p.add_argument("--epsilon", type=float, help="stabilizer eps")
    p.add_argument("--scaling", choices=list(SCALINGS),
                   help="hyperparameter units: old (MoS code, default), new (Krause's) or "
                        "lamb (deepmind/lamb's, the Mogrifier LSTM's)")
    p.add_argument("--batch-size", type=int, help="streams of the statistics pass (100)")
    p.add_argument("--bptt", type=int, help="window length of both passes (5)")
    p.add_argument("--max-batches", type=int,
                   help="statistics from the first N training windows only")
    p.add_argument("--corpus", help="the corpus, when not the run's own")
    p.add_argument("--data-dir")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


@one_line_errors("zoo.dynamic_eval")
def main(argv=None):
    start_command()
    args = build_parser().parse_args(argv)
    imports_done()
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.run_scalars import evaluated_epoch, log_scalars
    from zoo.runs.saved_run import open_for_command
    prog = "zoo.dynamic_eval"
    run = open_for_command(args, prog)  # --json checked before the passes
    settings = settings_for(run, {"lamb": args.lamb, "lr": args.lr,
                                  "epsilon": args.epsilon, "scaling": args.scaling,
                                  "batch_size": args.batch_size, "bptt": args.bptt,
                                  "max_batches": args.max_batches})
    train = run.corpus.split("train")
    if len(train) < 2 * settings.batch_size:
        raise UserError(f"the training split has {len(train)} tokens; the statistics "
                        f"pass needs at least {2 * settings.batch_size} (--batch-size "
                        f"{settings.batch_size}).")
    progress = not args.quiet
    if progress:
        print(f"{prog}: gradient statistics on the training split "
              f"(batch {settings.batch_size}, bptt {settings.bptt})", file=sys.stderr)
    stats = gradient_statistics(run.model, train, settings, progress=progress)
    if progress:
        print(f"{prog}: dynamic evaluation of {args.split} (batch 1, bptt "
              f"{settings.bptt})", file=sys.stderr)
    result = dynamic_evaluate(run.model, run.corpus.split(args.split), settings, stats,
                              progress=progress)
    result.update(split=args.split, model=str(run.model_path), corpus=run.corpus.name,
                  settings=dataclasses.asdict(settings), statistics_windows=stats.num_batches,
                  parameter_tensors=len(stats.ms))
    print(f"{args.split} perplexity with dynamic evaluation: {result['perplexity']:.2f} "
          f"({result['tokens']} tokens, {result['words_per_second']:.0f} words/s; lambda "
          f"{settings.lamb}, eta {settings.lr}, eps {settings.epsilon}, {settings.scaling} "
          "scaling)")
    if run.config is not None:
        log_scalars(run.run_dir, {f"dynamic_eval/{args.split}_perplexity":
                                  result["perplexity"]},
                    evaluated_epoch(run.run_dir, run.model_path))
    if args.json:
        atomic_files.write_result_json(args.json, result)
    return 0


if __name__ == "__main__":
    run_command(main)
