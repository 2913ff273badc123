"""Shortened reproductions of the Zaremba presets (Zhang 2018): few epochs, optional slices.

Runs `python -m zoo.train --preset PRESET --epochs N` (the preset unchanged otherwise; the
first N tokens of each split with `--train-tokens` / `--valid-tokens` on machines too small
for full epochs), or reads a run directory such a command already wrote (`--run-dir`), and
writes a table to results/<preset>.md beside this script (`bench.harness.publish`; one file
per preset, e.g. results/zaremba_small_ptb.md): every epoch's learning rate, training and
validation perplexity and words/s, the best model's test perplexity, next to the preset's
published figures (which are those of the full schedule: 13 / 39 / 55 epochs).

    python -m bench.reproductions.zaremba_ptb --preset zaremba_small_ptb --epochs 3
    python -m bench.reproductions.zaremba_ptb --preset zaremba_medium_ptb --epochs 2 \\
        --train-tokens 100000 --valid-tokens 20000
    python -m bench.reproductions.zaremba_ptb --preset zaremba_small_ptb --run-dir RUN
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

from bench.harness import REPO, publish, results_path


def train_command(args, out):
    cmd = [sys.executable, "-m", "zoo.train", "--preset", args.preset, "--epochs",
           str(args.epochs), "--data-dir", args.data_dir, "--out", str(out), "--quiet"]
    if args.train_tokens:
        cmd += ["--set", f"corpus.max_train_tokens={args.train_tokens}"]
    if args.valid_tokens:
        cmd += ["--set", f"corpus.max_valid_tokens={args.valid_tokens}",
                "--set", f"corpus.max_test_tokens={args.valid_tokens}"]
    return cmd


def table(args, metrics, command, seconds, load):
    """The results file's title and body: every epoch, the best model's test perplexity and
    the published figures."""
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    from zoo.presets import load_preset
    preset = load_preset(args.preset)
    pub = preset["published"]
    train = preset["training"]
    title = f"{args.preset}: {len(metrics['history'])} of {train['epochs']} epochs"
    lines = [
        f"Training command: `{command}`  ",
        f"Load average at the end {load}"
        + (f"; wall time {seconds / 60:.1f} min (training, validation and the batch-1 test "
           "pass)" if seconds else
           f"; {sum(h['epoch_seconds'] for h in metrics['history']) / 60:.1f} min of "
           "training epochs") + ".  ",
        f"Data: PTB{'' if not args.train_tokens else f', first {args.train_tokens:,} training tokens'}"
        f"{'' if not args.valid_tokens else f', first {args.valid_tokens:,} validation / test tokens'}; "
        f"{metrics['parameters']:,} parameters (published {pub['parameters']:,}).",
        "",
        "| epoch | lr | train ppl (dropout on) | valid ppl | words/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for h in metrics["history"]:
        lines.append(f"| {h['epoch']} | {h['learning_rate']:.4g} | {h['perplexity']:.2f} | "
                     f"{h['val_perplexity']:.2f} | {h.get('words_per_second', float('nan')):,.0f} |")
    lines += [
        "",
        f"Best epoch {metrics['best_epoch']}: valid {metrics['valid_perplexity']:.2f}, test "
        f"{metrics['test_perplexity']:.2f} (batch {metrics['evaluation']['test_batch_size']}). "
        f"Published after all {train['epochs']} epochs (Zhang 2018, GTX1060): train "
        f"{pub.get('train', '-')}, valid {pub.get('valid', '-')}, test {pub.get('test', '-')}, "
        f"{pub.get('words_per_second', '-'):,} words/s.",
        "",
    ]
    return title, "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="zaremba_small_ptb")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-tokens", type=int)
    p.add_argument("--valid-tokens", type=int)
    p.add_argument("--run-dir", help="report this finished run instead of training one")
    p.add_argument("--seconds", type=float, help="wall time of --run-dir's run, if known")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--out", default="runs/repro_zaremba")
    p.add_argument("--results", default=None,
                   help="the results file (default results/<preset>.md beside this script)")
    args = p.parse_args()
    if args.run_dir:
        out = pathlib.Path(args.run_dir)
        config = json.loads((out / "config.json").read_text())
        args.preset = config.get("preset", args.preset)
        args.epochs = int(config["training"]["epochs"])
        args.train_tokens = config["corpus"].get("max_train_tokens")
        args.valid_tokens = config["corpus"].get("max_valid_tokens")
        command = "python " + " ".join(train_command(args, out)[1:])
        seconds = args.seconds
    else:
        out = pathlib.Path(args.out) / args.preset
        cmd = train_command(args, out)
        command = "python " + " ".join(cmd[1:])
        start = time.time()
        proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"zoo.train failed:\n{proc.stderr[-3000:]}")
        seconds = time.time() - start
    metrics = json.loads((out / "metrics.json").read_text())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    publish(*table(args, metrics, command, seconds, load),
            args.results or results_path(__file__, f"{args.preset}.md"))


if __name__ == "__main__":
    main()
