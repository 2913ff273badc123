"""Sampled-softmax (importance-sampled) training vs the full softmax at V = 100,000.

An AWD-LSTM language model (tied, embedding = last hidden size `--dim`, `--layers` LSTM
layers, no dropout) on a Zipfian 100K-word stand-in corpus (`tflm.data.ZipfLanguage`;
the 1B Word benchmark is not on these machines): one `train_on_batch` step (forward,
backward, SGD update) of `--batch` streams x `--bptt` tokens with the full softmax over V
words and with `SoftmaxLayer(num_samples=k)` for each k, the k noise words shared by the
batch (the default: one (B T, d) x (d, k) matmul) and, for `--per-position` k, drawn per
position (a (B, T, k, d) gather: the CNF reference's way), each configuration in a fresh
process (TensorFlow), interleaved over `--rounds` rounds. Words/s = batch x bptt / median
step time; peak = the process's peak resident memory above what it held before the first
step (compilation included), and above what it held after the warm-up steps (the step's
own working memory). The full-vocabulary (B, T, V) logits are what sampling avoids:
one such float32 tensor is printed in the header. Writes the table to
results/sampled_softmax.md beside this script (`bench.harness.publish`).

    python -m bench.heads.sampled_softmax [--batch 32] [--bptt 20] [--dim 256] [--rounds 2]
"""

import argparse
import json
import os
import subprocess
import time

import numpy as np

from bench.harness import REPO, module_command, publish, results_path
from tools.frameworks.machine import current_rss_mib, peak_rss_mib

V = 100_000


def child(config, args):
    # deferred: the child process loads the framework, with the environment its parent set
    import keras

    from tflm import data
    from zoo import AWDLSTM

    samples, shared = config
    head = ({"type": "softmax"} if samples == 0 else
            {"type": "softmax", "num_samples": samples, "shared_samples": shared})
    model = AWDLSTM(V, embed_dim=args.dim, hidden_dim=args.dim, num_layers=args.layers,
                    dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0,
                    bptt=args.bptt, seed=1, head=head)
    model.build()
    language = data.ZipfLanguage(V)
    ids = language.sample(args.batch * (args.bptt + 1) * (args.steps + 2), seed=3)
    if samples:
        model.head.sampler.set_proposal(np.bincount(ids, minlength=V))
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    windows = ids.reshape(args.steps + 2, args.batch, args.bptt + 1)
    before_compile = current_rss_mib()
    model.train_on_batch(windows[0, :, :-1], windows[0, :, 1:])
    model.train_on_batch(windows[1, :, :-1], windows[1, :, 1:])
    after_warmup, peak_warmup = current_rss_mib(), peak_rss_mib()
    times = []
    for w in windows[2:]:
        start = time.perf_counter()
        model.train_on_batch(w[:, :-1], w[:, 1:])
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    print(json.dumps({"seconds": seconds, "words_per_second": args.batch * args.bptt / seconds,
                      "peak_mib": peak_rss_mib() - before_compile,
                      "step_peak_mib": max(peak_rss_mib() - after_warmup, 0.0),
                      "warmup_peak_mib": peak_warmup - before_compile,
                      "parameters": int(model.count_params())}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bptt", type=int, default=20)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--samples", type=int, nargs="+", default=[20, 1024, 8192])
    p.add_argument("--per-position", type=int, nargs="*", default=[20, 1024])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--results", default=str(results_path(__file__, "sampled_softmax.md")))
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        return child((args.child[0], bool(args.child[1])), args)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    configs = ([(0, 1)] + [(k, 1) for k in args.samples]
               + [(k, 0) for k in args.per_position])
    runs = {k: [] for k in configs}
    for _ in range(args.rounds):  # interleaved: each round runs every configuration once
        for k in configs:
            cmd = module_command(__spec__.name, "--child", k[0], k[1], "--batch", args.batch,
                                 "--bptt", args.bptt, "--dim", args.dim, "--layers",
                                 args.layers, "--steps", args.steps)
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                                 cwd=REPO)
            runs[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(k, runs[k][-1], flush=True)

    def median(k, key):
        values = sorted(r[key] for r in runs[k])
        return values[len(values) // 2]

    logits_mib = args.batch * args.bptt * V * 4 / 2**20
    full_wps = median((0, 1), "words_per_second")
    command = (f"python -m bench.heads.sampled_softmax --batch {args.batch} --bptt "
               f"{args.bptt} --dim {args.dim} --layers {args.layers} --samples "
               f"{' '.join(map(str, args.samples))} --per-position "
               f"{' '.join(map(str, args.per_position))} --steps {args.steps} --rounds "
               f"{args.rounds}")
    lines = [f"Model: AWD-LSTM, "
             f"{args.layers} x {args.dim}, tied, {runs[0, 1][0]['parameters']:,} parameters, no "
             f"dropout; batch {args.batch} x bptt {args.bptt}; Zipfian corpus (s = 1). One "
             f"(B, T, V) float32 logits tensor = {logits_mib:,.0f} MiB. Words/s: median step "
             f"over {args.steps} steps per process, upper median over {args.rounds} interleaved "
             "processes (with two: the faster). Peak: peak resident memory above the process's before its first "
             "step (compilation included) / above its level after two warm-up steps.", "",
             "| training | words/s | vs full | peak MiB (with compile) | step peak MiB |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for k in configs:
        name = ("full softmax" if k[0] == 0 else
                f"sampled, k = {k[0]:,} {'shared' if k[1] else 'per position'}")
        wps = median(k, "words_per_second")
        lines.append(f"| {name} | {wps:,.0f} | {wps / full_wps:.2f}x | "
                     f"{median(k, 'peak_mib'):,.0f} | {median(k, 'step_peak_mib'):,.0f} |")
    publish(f"Sampled vs full softmax at V = {V:,} (TensorFlow, training steps)",
            "\n".join(lines), args.results, command)


if __name__ == "__main__":
    main()
