"""Training throughput of the `awd_lstm_ptb` preset shape: words/s and peak memory.

Runs N training steps of the preset's model (V = 10,000, 400 / 1150 / 400, batch 20,
bptt 70, SGD lr 30, all dropouts on) on PTB when it is found (else random tokens of the
same vocabulary), in a fresh process per backend, and reports the median words/s over the
steps after warm-up, peak memory (GPU allocator peak when on a GPU, else the process's peak
RSS), and whether the cuDNN kernel was used. Prints a markdown table and writes it to
results/awd_lstm.md beside this script (`bench.harness.publish`).

    python -m bench.training.awd_lstm --steps 20 [--backends tensorflow,torch] [--batch 20]
"""

import argparse
import json
import os
import subprocess
import sys

from bench.harness import REPO, publish, results_path

WORKER = r"""
import json, os, resource, sys, time
import numpy as np
import keras
import zoo
from tflm import data
args = json.loads({args!r})
keras.utils.set_random_seed(0)
model = zoo.from_preset("awd_lstm_ptb")
model.compile(optimizer=keras.optimizers.SGD(30.0))
try:
    corpus = data.load_corpus("ptb", data_dir=args["data_dir"], download=False); ids = corpus.train; source = "ptb"
except Exception:
    ids = np.random.default_rng(0).integers(0, 10000, size=400_000).astype("int32"); source = "random"
batch, bptt = args["batch"], args["bptt"]
windows = list(data.lm_windows(ids, batch, bptt, train=True, seed=141, epoch=0))
times, tokens = [], []
for step in range(args["steps"]):
    x, y = windows[step % len(windows)]
    t0 = time.perf_counter()
    logs = model.train_on_batch(x, y, return_dict=True)
    float(logs["loss"])
    times.append(time.perf_counter() - t0); tokens.append(x.size)
warm = args["warmup"]
wps = [n / t for n, t in zip(tokens[warm:], times[warm:])]
backend = keras.backend.backend()
peak, gpu, cudnn = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, False, False
if backend == "torch":
    import torch
    if torch.cuda.is_available():
        gpu = True; peak = torch.cuda.max_memory_allocated() / 2**20
        cudnn = torch.backends.cudnn.is_available()
elif backend == "tensorflow":
    import tensorflow as tf
    if tf.config.list_physical_devices("GPU"):
        gpu = True; peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20; cudnn = True
elif backend == "jax":
    import jax
    dev = jax.devices()[0]
    if dev.platform == "gpu":
        gpu = True; peak = dev.memory_stats()["peak_bytes_in_use"] / 2**20; cudnn = True
print("RESULT " + json.dumps(dict(backend=backend, words_per_second=float(np.median(wps)),
      peak_mib=peak, on_gpu=gpu, cudnn=cudnn, params=int(model.count_params()),
      steps=len(times), first_step_s=times[0], final_loss=float(logs["loss"]), data=source)))
"""


def run_backend(backend, args):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    code = WORKER.format(args=json.dumps(vars(args)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=REPO)  # `python -c` imports from its working directory
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"backend": backend, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--bptt", type=int, default=70)
    p.add_argument("--backends", default="tensorflow")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--results", default=str(results_path(__file__, "awd_lstm.md")))
    args = p.parse_args()
    rows = [run_backend(b, args) for b in args.backends.split(",")]
    lines = [f"Batch {args.batch}, bptt {args.bptt} (random lengths), median over steps after "
             f"{args.warmup} warm-up steps.", "",
             "| backend | device | words/s | peak memory (MiB) | cuDNN | params | data |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['backend']} | - | failed: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['backend']} | {'GPU' if r['on_gpu'] else 'CPU'} | "
                     f"{r['words_per_second']:,.0f} | {r['peak_mib']:,.0f} "
                     f"({'GPU allocator peak' if r['on_gpu'] else 'peak RSS'}) | "
                     f"{'yes' if r['cudnn'] else 'no'} | {r['params']:,} | {r['data']} |")
    publish("awd_lstm_ptb training throughput", "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
