"""The continuous cache pointer (Grave et al. 2017), as salesforce/awd-lstm-lm `pointer.py`
runs it on a trained model.

At position i (batch 1, state carried), with h_i the last LSTM layer's output and the
history of the last `window` positions j (their outputs h_j and the words w_{j+1} that
followed them):

    a_ij = softmax_j(theta * h_j . h_i)                     over the history
    p_ptr(w) = sum_j a_ij [w_{j+1} = w]
    p(w) = lambda * p_ptr(w) + (1 - lambda) * p_vocab(w)

with p_vocab the model's own distribution (any head). Perplexity = exp(mean -log p(next)).

The reference's semantics, kept so that its settings give its numbers: the text is read in
chunks of `bptt` positions (5000 for PTB); the history is the positions before i, cut to
the last `window` at the end of each chunk; the pointer is used only where more than
`window` positions lie in the history of the chunk (`start + idx > window`), so the first
`window + 1` positions of the text, and the first position of every later chunk, are scored
by the model alone. The reference divides the total NLL by the number of tokens, one more
than it scores (a relative 1/N difference in the exponent); here by the tokens scored.

Published (valid / test perplexity, AWD-LSTM + continuous cache pointer; Merity et al. 2018,
cited by Yang et al. 2018 Tables 1, 2): PTB 53.9 / 52.8 with `--lambdasm 0.1 --theta 1.0
--window 500 --bptt 5000`; WT2 53.8 / 52.0 with `--lambdasm 0.1279 --theta 0.662 --window
3785 --bptt 2000`. The presets carry them (`cache_pointer`).

CLI:
    python -m zoo.cache_pointer RUN_DIR|MODEL.keras [--split test|valid] [--window W]
        [--theta T] [--lambdasm L] [--bptt B] [--corpus NAME] [--data-dir DIR] [--json OUT]
"""

import argparse
import dataclasses
import math
import time

import numpy as np

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.progress import verbosity
from zoo.runtime.user_errors import one_line_errors

# pointer.py's argparse defaults (its WT2 values).
DEFAULTS = {"window": 3785, "theta": 0.6625523432485668, "lambdasm": 0.12785920428335693,
            "bptt": 5000}


@dataclasses.dataclass
class Settings:
    window: int = DEFAULTS["window"]
    theta: float = DEFAULTS["theta"]
    lambdasm: float = DEFAULTS["lambdasm"]
    bptt: int = DEFAULTS["bptt"]

    def check(self):
        for name in ("window", "bptt"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"cache pointer: {name} must be a positive integer; got "
                                f"{value!r}.")
        if not (isinstance(self.theta, (int, float)) and math.isfinite(self.theta)):
            raise UserError(f"cache pointer: theta must be a finite number; got "
                            f"{self.theta!r}.")
        if not (isinstance(self.lambdasm, (int, float)) and 0 <= self.lambdasm <= 1):
            raise UserError(f"cache pointer: lambdasm must be in [0, 1]; got "
                            f"{self.lambdasm!r}.")
        return self


def _softmax_rows(scores, valid):
    scores = np.where(valid, scores, -np.inf)
    top = scores.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.where(valid, np.exp(scores - top), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    return weights / np.where(total > 0, total, 1.0)


def pointer_chunk(history_h, history_next, chunk_h, chunk_next, vocab_target_probs, settings):
    """The mixed probability of each chunk position's next word (float64).

    Args:
        history_h, history_next: (S, d) outputs and (S,) next words before the chunk
            (S <= window).
        chunk_h, chunk_next: (T, d) outputs and (T,) next words of the chunk.
        vocab_target_probs: (T,) the model's probability of each next word.
    """
    start = len(history_next)
    hs = np.concatenate([history_h, chunk_h]).astype(np.float64)
    words = np.concatenate([history_next, chunk_next])
    T, window = len(chunk_next), settings.window
    position = start + np.arange(T)                     # index of each query in `hs`
    j = np.arange(len(words))
    valid = (j[None, :] >= position[:, None] - window) & (j[None, :] < position[:, None])
    attention = _softmax_rows(settings.theta * (chunk_h.astype(np.float64) @ hs.T), valid)
    same = words[None, :] == chunk_next[:, None]
    p_ptr = (attention * same).sum(axis=1)
    use = position > window
    lam = settings.lambdasm
    return np.where(use, lam * p_ptr + (1 - lam) * vocab_target_probs, vocab_target_probs)


def evaluate_with_pointer(model, ids, settings, progress=False):
    """Perplexity of `model` on the token ids `ids` with the cache pointer; returns
    {"perplexity", "loss", "tokens", "seconds", "words_per_second",
    "model_perplexity"} (the last: the same pass without the pointer)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    import keras

    settings.check()
    ids = np.asarray(ids, dtype=np.int32)
    if len(ids) < 2:
        raise UserError(f"the cache pointer needs at least 2 tokens; got {len(ids)}.")
    if not model.built:
        model.build()
    positions = len(ids) - 1
    bar = keras.utils.Progbar(positions, unit_name="token",
                                 verbose=verbosity()) if progress else None
    d = model.state_sizes()[-1]
    history_h, history_next = np.zeros((0, d)), np.zeros((0,), np.int64)
    states, nll, nll_model, start, t0 = None, 0.0, 0.0, 0, time.perf_counter()
    while start < positions:
        T = min(settings.bptt, positions - start)
        x = ids[None, start:start + T]
        target = ids[start + 1:start + 1 + T].astype(np.int64)
        out = model.backbone(x, states=states, training=False)
        log_probs = model.head_log_probs(out, training=False)
        states = out["states"]
        hidden = keras.ops.convert_to_numpy(out["raw_layer_outputs"][-1])[0].astype(np.float64)
        lp = keras.ops.convert_to_numpy(log_probs)[0].astype(np.float64)
        vocab_p = np.exp(lp[np.arange(T), target])
        p = pointer_chunk(history_h, history_next, hidden, target, vocab_p, settings)
        nll -= float(np.log(p).sum())
        nll_model -= float(np.log(vocab_p).sum())
        history_h = np.concatenate([history_h, hidden])[-settings.window:]
        history_next = np.concatenate([history_next, target])[-settings.window:]
        start += T
        if bar is not None:
            bar.update(start)
    seconds = time.perf_counter() - t0
    return {"perplexity": math.exp(nll / positions), "loss": nll / positions,
            "model_perplexity": math.exp(nll_model / positions), "tokens": positions,
            "seconds": seconds, "words_per_second": positions / max(seconds, 1e-9)}


def settings_for(run, overrides):
    values = dict(DEFAULTS)
    preset = (run.config or {}).get("cache_pointer") or {}
    values.update({k: v for k, v in preset.items() if k in DEFAULTS})
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values).check()


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m zoo.cache_pointer",
        description="Evaluate a saved language model with the continuous cache pointer "
                    "(Grave et al. 2017; salesforce/awd-lstm-lm pointer.py).")
    p.add_argument("target", metavar="RUN_DIR|MODEL.keras")
    p.add_argument("--split", default="test", choices=["valid", "test"])
    p.add_argument("--window", type=int, help="positions in the cache")
    p.add_argument("--theta", type=float, help="scale of the pointer's logits h_j . h_i")
    p.add_argument("--lambdasm", type=float, help="weight of the pointer distribution")
    p.add_argument("--bptt", type=int, help="chunk length of the pass")
    p.add_argument("--corpus", help="the corpus, when not the run's own")
    p.add_argument("--data-dir")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


@one_line_errors("zoo.cache_pointer")
def main(argv=None):
    start_command()
    args = build_parser().parse_args(argv)
    imports_done()
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.run_scalars import evaluated_epoch, log_scalars
    from zoo.runs.saved_run import open_for_command
    prog = "zoo.cache_pointer"
    run = open_for_command(args, prog)  # --json checked before the passes
    if not hasattr(run.model, "head_log_probs"):
        raise UserError(f"{run.model_path}: the cache pointer needs a zoo AWD-LSTM "
                        "model (its last layer's outputs).")
    settings = settings_for(run, {"window": args.window, "theta": args.theta,
                                  "lambdasm": args.lambdasm, "bptt": args.bptt})
    result = evaluate_with_pointer(run.model, run.corpus.split(args.split), settings,
                                   progress=not args.quiet)
    result.update(split=args.split, model=str(run.model_path), corpus=run.corpus.name,
                  settings=dataclasses.asdict(settings))
    print(f"{args.split} perplexity with the cache pointer: {result['perplexity']:.2f} "
          f"(the model alone: {result['model_perplexity']:.2f}; window {settings.window}, "
          f"theta {settings.theta:g}, lambda {settings.lambdasm:g}; {result['tokens']} "
          "tokens)")
    if run.config is not None:
        log_scalars(run.run_dir, {f"cache_pointer/{args.split}_perplexity":
                                  result["perplexity"]},
                    evaluated_epoch(run.run_dir, run.model_path))
    if args.json:
        atomic_files.write_result_json(args.json, result)
    return 0


if __name__ == "__main__":
    run_command(main)
