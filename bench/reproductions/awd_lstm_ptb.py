"""Shortened reproduction of `awd_lstm_ptb`: same hyperparameters, few epochs, optional slices.

Runs `zoo.train` with the preset unchanged except the number of epochs and (on machines too
small for full epochs) the first N tokens of train / valid, then writes the validation
perplexity per epoch and the epoch time to results/awd_lstm_ptb.md beside this script
(`bench.harness.publish`).

    python -m bench.reproductions.awd_lstm_ptb --epochs 2 \
        [--train-tokens 40000 --valid-tokens 8000] [--data-dir DIR] [--backend tensorflow|torch]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from bench.harness import REPO, publish, results_path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-tokens", type=int)
    p.add_argument("--valid-tokens", type=int)
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--backend", default="tensorflow")
    p.add_argument("--results", default=str(results_path(__file__, "awd_lstm_ptb.md")))
    args = p.parse_args()
    out = pathlib.Path(tempfile.mkdtemp(prefix="repro-ptb-")) / "run"
    sets = []
    if args.train_tokens:
        sets += ["--set", f"corpus.max_train_tokens={args.train_tokens}"]
    if args.valid_tokens:
        sets += ["--set", f"corpus.max_valid_tokens={args.valid_tokens}",
                 "--set", f"corpus.max_test_tokens={args.valid_tokens}",
                 "--set", "training.test_batch_size=10"]
    cmd = [sys.executable, "-m", "zoo.train", "--preset", "awd_lstm_ptb", "--epochs",
           str(args.epochs), "--data-dir", args.data_dir, "--out", str(out), "--quiet", *sets]
    env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"zoo.train failed:\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    lines = [f"KERAS_BACKEND={args.backend}; preset hyperparameters unchanged "
             f"(24.2M parameters, batch 20, bptt 70, SGD lr 30 then NT-ASGD); "
             f"train tokens used: {args.train_tokens or 'all 929,589'}; "
             f"valid tokens: {args.valid_tokens or 'all 73,760'}. Total wall time "
             f"{time.time() - start:.0f} s.", "",
             "| epoch | train ppl (dropout on) | valid ppl | epoch time (s) | words/s |",
             "| --- | --- | --- | --- | --- |"]
    for h in metrics["history"]:
        lines.append(f"| {h['epoch']} | {h['perplexity']:.1f} | {h['val_perplexity']:.1f} | "
                     f"{h['epoch_seconds']:.0f} | {h['words_per_second']:,.0f} |")
    publish("Shortened awd_lstm_ptb reproduction", "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
