"""MoS head: batched (one (B, T, K, V) tensor) vs sequential (running log-sum-exp) mixture.

`sequential` is `MoSLayer(mixture="sequential")`: a running log-sum-exp forward and the
recomputing gradient of `tflm.layers.mos_recompute`; `sequential-autodiff` is the same
forward differentiated by TensorFlow's autodiff (`sequential_mixture_log_probs`, what
`sequential` was before the recomputing gradient and still is under AdvSoft in training).

At the MoS PTB preset's head size (B=12, T=70, K=15, V=10,000, L=280, input 620) each
configuration runs in a fresh process: the head's forward pass (evaluation / Q_theta export)
and a forward + backward pass (training), timed (median of `--repeats` after one warm-up) with
the process's peak resident memory above what it held after the warm-up's inputs were made.
One (B, T, K, V) float32 tensor is 504 MB. Writes the table to results/mos_memory.md beside
this script (`bench.harness.publish`).

    python -m bench.heads.mos_memory [--batch 12] [--repeats 3]
"""

import argparse
import json
import os
import subprocess
import time

import numpy as np

from bench.harness import REPO, module_command, publish, results_path
from tools.frameworks.machine import current_rss_mib, peak_rss_mib

K, V, L, D_IN, T = 15, 10_000, 280, 620, 70
MIXTURES = ("batched", "sequential-autodiff", "sequential")


def child(mixture, mode, batch, repeats):
    # deferred: the child process loads the framework, with the environment its parent set
    import tensorflow as tf

    import tflm.layers.mos as mos
    from tflm.layers import MoSLayer, TiedEmbedding
    if mixture == "sequential-autodiff":
        mos.recomputed_mixture_log_probs = lambda project, variables, h, log_prior: \
            mos.sequential_mixture_log_probs(lambda k: project(h[:, :, k]), log_prior, K)
    head = MoSLayer(K, embedding=TiedEmbedding(V, L),
                    mixture="batched" if mixture == "batched" else "sequential")
    g = tf.constant(np.random.default_rng(0).normal(size=(batch, T, D_IN)).astype("float32"))
    head(g[:1, :2])
    weights = head.trainable_weights

    @tf.function
    def forward():
        return tf.reduce_sum(head(g)[..., :1])

    @tf.function
    def train():
        with tf.GradientTape() as tape:
            loss = -tf.reduce_mean(head(g)[..., 0])
        return tape.gradient(loss, weights)

    step = forward if mode == "forward" else train
    step.get_concrete_function()
    base = current_rss_mib()
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": float(np.median(times)), "peak_mib": peak_rss_mib() - base}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", default=str(results_path(__file__, "mos_memory.md")))
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(*args.child, args.batch, args.repeats)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    rows = {}
    for mode in ("forward", "training"):
        for mixture in MIXTURES:
            out = subprocess.run(module_command(__spec__.name, "--child", mixture, mode,
                                                "--batch", args.batch, "--repeats",
                                                args.repeats),
                                 env=env, capture_output=True, text=True, check=True, cwd=REPO)
            rows[mode, mixture] = json.loads(out.stdout.strip().splitlines()[-1])
    tensor_mib = args.batch * T * K * V * 4 / 2**20
    load = os.getloadavg()
    title = (f"MoS mixture: batched vs sequential (B={args.batch}, T={T}, K={K}, V={V:,}, "
             f"L={L}; one B*T*K*V float32 tensor = {tensor_mib:,.0f} MiB), TensorFlow")
    lines = ["Peak: the process's peak resident "
             "memory above what it held before the timed steps (MiB; in B*T*K*V tensors). "
             f"Load average at the start: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}.",
             "",
             "| pass | mixture | seconds (median) | peak MiB | peak / tensor | time ratio | "
             "memory ratio |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for mode in ("forward", "training"):
        base = rows[mode, "batched"]
        for mixture in MIXTURES:
            r = rows[mode, mixture]
            lines.append(f"| {mode} | {mixture} | {r['seconds']:.3f} | {r['peak_mib']:,.0f} | "
                         f"{r['peak_mib'] / tensor_mib:.2f} | "
                         f"{r['seconds'] / base['seconds']:.2f} | "
                         f"{r['peak_mib'] / max(base['peak_mib'], 1e-9):.2f} |")
    publish(title, "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
