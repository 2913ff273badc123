"""Data-parallel scaling (Zhang 2018 §7.1, §7.5.1: Table 7.1, Figure 7.1): training words/s and
validation perplexity against the number of replicas, with a fixed per-replica batch (the
global batch grows with the replicas: fewer updates per epoch) and with a fixed global batch
(each replica gets a smaller share: the same updates as one device).

Strategies: `MirroredStrategy` over R = 1, 2, 4 logical CPU devices of one process
(`tflm.distribute.use_logical_cpus`), and `MultiWorkerMirroredStrategy` over 2 local worker
processes (one replica each, talking gRPC on localhost; `tflm.distribute.lm_dataset_for`
gives each worker its own block of streams). Every configuration runs in fresh processes
(TensorFlow fixes its devices at start-up). Model: a small AWD-LSTM (tied softmax, no
dropout, fixed windows of `--bptt`) on the first `--train-tokens` / `--valid-tokens` tokens
of Penn Treebank, SGD at one learning rate for every configuration (tuned for none: the
seed's point is that hyperparameters tuned for one device do not carry over), the same
initial weights (seeded). Words/s = training tokens per epoch / epoch seconds, the median
over epochs 2..E (epoch 1 traces the step); perplexities = exp(mean NLL) of the last
training epoch and of a validation pass after it (batch 20, equal streams per replica).
The `perplexity` that Keras logs under a MirroredStrategy with more than one replica is
the mean of the replicas' perplexities, not exp of the mean NLL (Jensen: a little higher);
it is printed beside ("logged") to show the gap.

On a machine with C physical cores, logical devices and local workers share those cores:
R replicas do R times less work each, on the same cores, so this measures the overhead of
the replication (all-reduce, per-replica dispatch, gRPC between workers), not a speedup.
With GPUs (`--devices gpu`) the replicas are real devices.

    python -m bench.training.scaling [--train-tokens 40000] [--epochs 3] [--replicas 1 2 4]

Writes the table to results/scaling.md and the figure to results/scaling.png beside this
script (`bench.harness.publish`) unless `--no-publish`.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from bench.harness import REPO, module_command, publish, results_path

RESULTS = results_path(__file__, "scaling.md")
EVAL_BATCH = 20  # divisible by every replica count: equal streams per replica
PLOT = results_path(__file__, "scaling.png")
TITLE = ("Data-parallel scaling: MirroredStrategy on logical CPUs, MultiWorkerMirroredStrategy "
         "on local processes (Zhang 2018 Table 7.1 / Figure 7.1)")


def child(spec):
    """One configuration, in this process: prints RESULT {...} (worker 0 only)."""
    # deferred: the child sets its logical devices before TensorFlow starts
    from tflm import distribute
    if spec["strategy"] == "mirrored" and spec["devices"] == "cpu" and spec["replicas"] > 1:
        distribute.use_logical_cpus(spec["replicas"])
    import keras
    import tensorflow as tf

    from tflm import data
    from zoo import AWDLSTM
    if spec["strategy"] == "multi-worker":
        strategy = distribute.get_strategy("multi-worker")
    else:
        kind = "GPU" if spec["devices"] == "gpu" else "CPU"
        names = [d.name for d in tf.config.list_logical_devices(kind)][:spec["replicas"]]
        if len(names) < spec["replicas"]:
            raise SystemExit(f"only {len(names)} {kind} devices for {spec['replicas']} replicas")
        strategy = distribute.get_strategy("mirrored", names)
    ptb = data.load_corpus("ptb", spec["data_dir"])
    train_ids = ptb.train[:spec["train_tokens"]]
    valid_ids = ptb.valid[:spec["valid_tokens"]]
    V = len(ptb.vocabulary)
    train = distribute.lm_dataset_for(strategy, train_ids, spec["global_batch"], spec["bptt"],
                                      train=False)
    valid = distribute.lm_dataset_for(strategy, valid_ids, EVAL_BATCH, spec["bptt"],
                                      train=False)
    keras.utils.set_random_seed(spec["seed"])
    with strategy.scope():
        model = AWDLSTM(V, embed_dim=spec["dim"], hidden_dim=spec["dim"], num_layers=2,
                        dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0,
                        bptt=spec["bptt"], clip_norm=0.25, seed=spec["seed"])
        model.build()
        model.compile(optimizer=keras.optimizers.SGD(spec["lr"]))
    seconds = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.start)

    history = model.fit(train, epochs=spec["epochs"], verbose=0, callbacks=[Timer()]).history
    logs = model.evaluate(valid, verbose=0, return_dict=True)
    streams = spec["global_batch"]
    words = (len(train_ids) - 1) // streams * streams  # the targets of one epoch
    steps = -(-((len(train_ids) - 1) // streams) // spec["bptt"])
    wps = [words / s for s in seconds[1:]] or [words / seconds[0]]
    result = {**spec, "words_per_second": statistics.median(wps), "epoch_seconds": seconds,
              "steps_per_epoch": steps, "train_ppl": math.exp(history["nll"][-1]),
              "valid_ppl": math.exp(logs["nll"]), "valid_ppl_logged": logs["perplexity"],
              "replicas_in_sync": strategy.num_replicas_in_sync,
              "parameters": int(model.count_params())}
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("index", 0) == 0:
        print("RESULT " + json.dumps(result), flush=True)


def _launch(spec, env_extra=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow",
               PYTHONPATH=str(REPO), **(env_extra or {}))
    return subprocess.Popen(module_command(__spec__.name, "--child", json.dumps(spec)),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _collect(procs, timeout):
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"configuration failed:\n{err[-3000:]}")
        results += [json.loads(line[7:]) for line in out.splitlines()
                    if line.startswith("RESULT ")]
    return results[0]


def run_config(spec, timeout=900):
    if spec["strategy"] == "multi-worker":
        # deferred: Keras loads after the arguments are read (`--help` stays fast)
        from tflm.distribute import free_local_ports
        workers = [f"127.0.0.1:{p}" for p in free_local_ports(spec["replicas"])]
        procs = [_launch(spec, {"TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})})
            for i in range(spec["replicas"])]
        return _collect(procs, timeout)
    return _collect([_launch(spec)], timeout)


def configurations(args):
    base = {"train_tokens": args.train_tokens, "valid_tokens": args.valid_tokens,
            "bptt": args.bptt, "dim": args.dim, "lr": args.lr, "epochs": args.epochs,
            "seed": 141, "data_dir": args.data_dir, "devices": args.devices}
    out = []
    for r in args.replicas:
        modes = ["per-replica"] if r == 1 else ["per-replica", "global"]
        for mode in modes:
            batch = args.batch * r if mode == "per-replica" else args.batch
            out.append(dict(base, strategy="mirrored", replicas=r, mode=mode,
                            global_batch=batch))
    if args.workers > 1:
        for mode in ("per-replica", "global"):
            batch = args.batch * args.workers if mode == "per-replica" else args.batch
            out.append(dict(base, strategy="multi-worker", replicas=args.workers, mode=mode,
                            global_batch=batch))
    return out


def table(results, args, load, seconds):
    one = next(r for r in results if r["strategy"] == "mirrored" and r["replicas"] == 1)
    lines = [
        f"Load average before the run {load}; {seconds / 60:.1f} min. Model: AWD-LSTM 2 x "
        f"{args.dim}, tied softmax, "
        f"{one['parameters']:,} parameters, no dropout, fixed windows of {args.bptt}, SGD lr "
        f"{args.lr:g}, clip 0.25; PTB: the first {args.train_tokens:,} training and "
        f"{args.valid_tokens:,} validation tokens; {args.epochs} epochs. Words/s: median over "
        "epochs 2.., training tokens / epoch seconds; perplexities = exp(mean NLL) of the last "
        f"training epoch and of a validation pass after it (batch {EVAL_BATCH}); \"logged\": "
        "the validation `perplexity` Keras logs (under MirroredStrategy the mean of the "
        "replicas' perplexities). **The replicas share the machine's cores** (logical CPU devices of one "
        "process, or worker processes on one host): R replicas split the same work over the "
        "same cores, so the words/s column measures the overhead of replication, not a "
        "speedup.", "",
        "| strategy | replicas | batch fixed | global batch | per replica | updates / epoch "
        "| words/s | vs 1 device | train ppl | valid ppl | valid ppl logged |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        name = "MirroredStrategy (logical CPUs)" if r["strategy"] == "mirrored" else \
            "MultiWorkerMirroredStrategy (local processes)"
        if args.devices == "gpu" and r["strategy"] == "mirrored":
            name = "MirroredStrategy (GPUs)"
        fixed = "-" if r["replicas"] == 1 else r["mode"]
        lines.append(
            f"| {name} | {r['replicas']} | {fixed} | {r['global_batch']} | "
            f"{r['global_batch'] // r['replicas']} | {r['steps_per_epoch']} | "
            f"{r['words_per_second']:,.0f} | {r['words_per_second'] / one['words_per_second']:.2f}x"
            f" | {r['train_ppl']:.2f} | {r['valid_ppl']:.2f} | {r['valid_ppl_logged']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    # deferred: matplotlib loads only when a figure is drawn
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for strategy, marker in (("mirrored", "o"), ("multi-worker", "s")):
        for mode, style in (("per-replica", "-"), ("global", "--")):
            rows = sorted((r for r in results if r["strategy"] == strategy and (
                r["mode"] == mode or (r["replicas"] == 1 and strategy == "mirrored"))),
                key=lambda r: r["replicas"])
            if strategy == "multi-worker":
                rows = [r for r in results if r["strategy"] == "mirrored"
                        and r["replicas"] == 1] + rows
                if len(rows) < 2:
                    continue
            label = f"{strategy}, fixed {mode} batch"
            xs = [r["replicas"] for r in rows]
            a.plot(xs, [r["words_per_second"] for r in rows], style, marker=marker, label=label)
            b.plot(xs, [r["valid_ppl"] for r in rows], style, marker=marker, label=label)
    a.set(xlabel="replicas", ylabel="training words/s", title="speed (shared CPU cores)")
    b.set(xlabel="replicas", ylabel="validation perplexity", title="perplexity")
    for ax in (a, b):
        ax.set_xticks(sorted({r["replicas"] for r in results}))
        ax.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--train-tokens", type=int, default=40_000)
    p.add_argument("--valid-tokens", type=int, default=8_000)
    p.add_argument("--batch", type=int, default=20,
                   help="the one-device batch: per replica (fixed per-replica) or global")
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--workers", type=int, default=2, help="local worker processes (0: none)")
    p.add_argument("--devices", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR"))
    p.add_argument("--no-publish", action="store_true")
    args = p.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    if 1 not in args.replicas:
        p.error("--replicas must include 1 (the baseline)")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    start = time.perf_counter()
    results = []
    for spec in configurations(args):
        r = run_config(spec)
        print(f"{spec['strategy']:12s} R={spec['replicas']} fixed {spec['mode']:11s} "
              f"B={spec['global_batch']:3d}: {r['words_per_second']:8,.0f} words/s, "
              f"valid ppl {r['valid_ppl']:.1f}", flush=True)
        results.append(r)
    text = table(results, args, load, time.perf_counter() - start)
    if args.no_publish:
        publish(TITLE, text, None)
    else:
        publish(TITLE, text, RESULTS)
        plot(results, PLOT)
        print(f"wrote {RESULTS} and {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
