"""Cost of the ODE output heads (Andonov 2019; issue 13) on this machine, with TensorFlow.

    python -m bench.heads.flow_heads step [--hidden 1150] [--batch 20] [--bptt 70]
    python -m bench.heads.flow_heads ccnf-eval [--hidden 1150] [--bptt 10] [--chunks 1000 2500]
    python -m bench.heads.flow_heads tolerance --run node=RUN_DIR --run cnf=RUN_DIR

`step`: one training step (`model.train_on_batch`: forward, backward, clipping, update) of
the full AWD-LSTM (PTB preset sizes: embed 400, 3 layers, V = 10,000, batch 20, bptt 70, the
preset's dropouts) on random tokens, for the heads softmax, node (NeuralODELogits), cnf
(CNFHead on a softmax base) and ccnf (ConditionalCNFHead, importance-sampled with
num_samples = 20 and a unigram proposal of the random data), each at its defaults (dopri5,
rtol = atol = 1e-5, adjoint gradients; Hutchinson's trace in the flows' training). Every
configuration runs in a fresh subprocess: time = median of `--steps` steps after `--warmup`
steps; NFE = the head's `nfe` in the step's logs (the forward solve's evaluations of f; the
adjoint's backward solve is not counted there). Memory, in MiB, two counters: TensorFlow's
CPU allocator (`tf.config.experimental.get_memory_info("CPU:0")`, peak reset with
`reset_memory_stats`; it sees large allocations only, and reads 0 for tiny models) and the
process's peak resident set (`resource.getrusage(...).ru_maxrss`, reset by writing 5 to
`/proc/self/clear_refs`). "first step" = the peak over the warm-up above the level after the
build (includes tracing the step), "step" = the peak over the timed steps above the level
just before them (the RSS figure undercounts: memory the allocator kept is already resident).
`--plot PNG` draws time and memory per head.

The heads' zero-initialised output weights (W of node, W_out of the flows; zero so that a
head attached to a trained model starts at its distribution) make f = 0 at the start, the
cheapest case for an adaptive solver. `--field random` (default) draws them like their
input weights (Glorot uniform) so that f is a generic non-zero field, as after training;
`--field init` keeps the zeros.

`ccnf-eval`: the conditional flow's full-vocabulary evaluation (every word's flow per
position, the exact trace; `model.test_on_batch`) at batch 1 on windows of `--bptt` tokens,
with `vocab_chunk` words per solve; seconds and NFE per token, peak memory, and the cost of
the thesis' 400-token evaluation and of the whole PTB test split (82,430 tokens) from it.

`tolerance`: NFE and time of one evaluation pass over a split vs rtol = atol, for trained
runs (`python -m zoo.train` directories; their `best.keras`): the saved model is loaded
afresh for every tolerance and `head.solver["rtol"]`, `["atol"]` set before its first call.
NFE per window is the mean over the pass's windows (a callback reads `nfe` after each batch).
Perplexity differences are against the tightest tolerance. The dataset is
`tflm.data.lm_dataset` with tf.data's autotuning switched off (`tf.data.Options`;
`--autotune` keeps it): with it on, `model.evaluate` of a tflm model sometimes returns only
after an idle wait that rounds the pass up to (2^n - 1) x 10 ms (0.63, 2.55, 20.47, 40.95 s
seen here; no CPU used during the wait, after `on_test_end`, while the pass's tf.data
iterator is released), which would swamp the differences measured here.

Each mode prints a table and writes it, with the machine, the load average and the command
line, to its own results file beside this script (`bench.harness.publish`; `--results`):
results/flow_heads_step_random.md and results/flow_heads_step_init.md (`step` with each
`--field`), results/flow_heads_ccnf_eval.md, results/flow_heads_tolerance.md; `tolerance`
also writes a plot (`--plot`, default results/flow_heads_tolerance.png).
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import time

import numpy as np

from bench.harness import REPO, module_command, publish, results_path

HEADS = {
    "softmax": {"type": "softmax"},
    "node": {"type": "node"},
    "cnf": {"type": "cnf", "base": "softmax"},
    "ccnf": {"type": "ccnf", "num_samples": 20},
}
PTB_TEST_TOKENS = 82_430
MEMORY_TEXT = (
    "Memory (MiB): \"TF peak\" = TensorFlow's CPU allocator counter "
    "(`tf.config.experimental.get_memory_info(\"CPU:0\")`, reset with `reset_memory_stats`): "
    "its peak over the timed step(s) above what it held before them (\"step\"), or over the "
    "warm-up above what it held after the build (\"first step\"); \"RSS peak\" = the "
    "process's peak resident set (`ru_maxrss`, reset through /proc/self/clear_refs) above its "
    "resident set at the same points. The RSS step figure undercounts: memory the allocator "
    "kept from the warm-up is already resident; the first-step figure includes tracing.")


# ---------------------------------------------------------------------------------------
# In the child processes
# ---------------------------------------------------------------------------------------

def _status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _maxrss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak():
    """Reset the peak resident set (VmHWM and ru_maxrss) to the current one (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _tf_memory():
    """TensorFlow's CPU allocator counter {"current", "peak"} in bytes, or None."""
    # deferred: the child process loads the framework, with the environment its parent set
    import tensorflow as tf
    try:
        return tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, RuntimeError):
        return None


def _tf_reset():
    # deferred: the child process loads the framework, with the environment its parent set
    import tensorflow as tf
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except (ValueError, RuntimeError):
        pass


def _ptb_config(hidden, head, lr, embed=400):
    # deferred: the child process loads the framework, with the environment its parent set
    import zoo
    config = zoo.load_preset("awd_lstm_ptb")
    config["model"].update(hidden_dim=hidden, embed_dim=embed, head=head)
    config["training"].update(lr=lr)
    return config


def _randomize_field(model, seed=0):
    """Glorot-uniform values for the zero-initialised output weights of f."""
    head = model.head
    names = {"NeuralODELogits": ("w",), "CNFHead": ("w_out",),
             "ConditionalCNFHead": ("w_out",)}.get(type(head).__name__, ())
    rng = np.random.default_rng(seed)
    for name in names:
        var = getattr(head, name)
        fan_in, fan_out = var.shape
        limit = (6.0 / (fan_in + fan_out)) ** 0.5
        var.assign(rng.uniform(-limit, limit, size=var.shape).astype("float32"))
    return list(names)


def _build(hidden, head, batch, bptt, field, lr, vocab=10_000, embed=400, seed=141):
    # deferred: the child process loads the framework, with the environment its parent set
    import keras

    from zoo.runs.builders import build_model, make_optimizer
    from zoo.runs.initial_weights import set_training_word_counts
    from zoo.runs.settings import RunSettings
    keras.utils.set_random_seed(seed)
    config = _ptb_config(hidden, head, lr, embed)
    config["training"]["bptt"] = bptt
    settings = RunSettings.from_config(config)
    model = build_model(settings, vocab)
    model.build()
    rng = np.random.default_rng(seed)
    data = rng.integers(0, vocab, size=(batch, 8 * bptt + 1)).astype("int32")
    set_training_word_counts(model, data.ravel(), vocab)
    randomized = _randomize_field(model) if field == "random" else []
    model.compile(optimizer=make_optimizer(settings.training))
    windows = [(data[:, i:i + bptt], data[:, i + 1:i + bptt + 1])
               for i in range(0, 8 * bptt, bptt)]
    return model, windows, randomized


def _measure(model, windows, warmup, steps, step_fn):
    """Run `warmup` then `steps` batches; times, NFE, losses and the peaks in MiB: RSS and
    TensorFlow's CPU allocator, over the warm-up above the level after the build ("first"),
    and over the timed batches above the level just before them ("step")."""
    mib = 2.0 ** 20
    base_rss = _status_mib("VmRSS")
    reset = _reset_peak()
    _tf_reset()
    tf_base = _tf_memory()
    times, nfes, losses, first = [], [], [], None
    for i in range(warmup + steps):
        if i == warmup:
            warm_peak = _maxrss_mib()
            before = _status_mib("VmRSS")
            reset = reset and _reset_peak()
            tf_warm = _tf_memory()
            _tf_reset()
            tf_before = _tf_memory()
        x, y = windows[i % len(windows)]
        start = time.perf_counter()
        logs = step_fn(x, y, return_dict=True)
        seconds = time.perf_counter() - start
        if i == 0:
            first = seconds
        if i >= warmup:
            times.append(seconds)
            nfes.append(float(logs.get("nfe", float("nan"))))
            losses.append(float(logs["loss"]))
    peak = _maxrss_mib()
    tf_end = _tf_memory()
    times.sort()
    out = {"median_s": times[len(times) // 2], "min_s": times[0], "max_s": times[-1],
           "first_step_s": first, "nfe": nfes, "loss": losses, "peak_reset": reset,
           "first_step_mib": warm_peak - base_rss,
           "step_mib": (peak - before) if reset else float("nan"),
           "base_rss_mib": base_rss, "tf_first_mib": float("nan"), "tf_step_mib": float("nan")}
    if tf_base and tf_end and tf_end["peak"] > 0:
        out["tf_first_mib"] = (tf_warm["peak"] - tf_base["current"]) / mib
        out["tf_step_mib"] = (tf_end["peak"] - tf_before["current"]) / mib
        out["tf_after_build_mib"] = tf_base["current"] / mib
    return out


def child_step(spec):
    model, windows, randomized = _build(spec["hidden"], spec["head"], spec["batch"],
                                        spec["bptt"], spec["field"], spec["lr"],
                                        vocab=spec["vocab"], embed=spec["embed"])
    out = _measure(model, windows, spec["warmup"], spec["steps"], model.train_on_batch)
    out.update(randomized=randomized)
    return out


def child_ccnf_eval(spec):
    head = {"type": "ccnf", "num_samples": 20, "vocab_chunk": spec["chunk"]}
    model, windows, randomized = _build(spec["hidden"], head, 1, spec["bptt"], spec["field"],
                                        0.01, vocab=spec["vocab"], embed=spec["embed"])
    out = _measure(model, windows, spec["warmup"], spec["windows"], model.test_on_batch)
    out.update(randomized=randomized)
    return out


def child_tolerance(spec):
    # deferred: the child process loads the framework, with the environment its parent set
    import keras
    import tensorflow as tf

    import tflm  # noqa: F401  (registers the layers)
    import zoo
    from tflm import data as tdata
    from zoo.runs.saved_run import open_run

    run = open_run(spec["run"])
    ids = np.asarray(getattr(run.corpus, spec["split"]))
    results = []
    for rtol in spec["rtols"]:
        model = zoo.load_model(str(pathlib.Path(spec["run"]) / "best.keras"))
        model.head.solver["rtol"] = rtol
        model.head.solver["atol"] = rtol
        dataset = tdata.lm_dataset(ids, spec["batch"], spec["bptt"], train=False)
        if not spec["autotune"]:  # see the module docstring: tf.data's autotune stall
            options = tf.data.Options()
            options.autotune.enabled = False
            dataset = dataset.with_options(options)
        nfe = []

        class Collect(keras.callbacks.Callback):
            def on_test_batch_end(self, batch, logs=None):
                nfe.append(float(logs["nfe"]))

        model.evaluate(dataset.take(1), verbose=0)  # trace the test step
        passes = []
        for _ in range(spec["repeats"]):
            nfe.clear()
            start = time.perf_counter()
            logs = model.evaluate(dataset, verbose=0, return_dict=True, callbacks=[Collect()])
            passes.append(time.perf_counter() - start)
        seconds = float(np.median(passes))
        results.append({"rtol": rtol, "seconds": seconds, "min_s": float(min(passes)),
                        "max_s": float(max(passes)), "nfe_mean": float(np.mean(nfe)),
                        "nfe_max": float(np.max(nfe)), "windows": len(nfe),
                        "perplexity": float(logs["perplexity"]), "tokens": int(ids.size - 1)})
    return results


# ---------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------

def run_child(mode, spec):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    cmd = module_command(__spec__.name, "--child", mode, json.dumps(spec))
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT "):])
            if isinstance(out, dict):
                out["wall_s"] = time.perf_counter() - start
            return out
    return {"error": (proc.stderr or proc.stdout).strip()[-1500:]}


def context():
    """The frameworks' versions and the load at the start, for a results file."""
    import keras  # deferred: the parent loads the frameworks only once it has a table to write
    import tensorflow as tf  # deferred: as keras
    load = "/".join(f"{v:.2f}" for v in os.getloadavg())
    return (f"TensorFlow {tf.__version__}, Keras {keras.__version__}, CPU. Load average "
            f"(1/5/15 min) at the start: {load}.")


def fmt(v, digits=1):
    if v is None or v != v:
        return "n/a"
    return f"{max(v, 0.0) if abs(v) < 1 else v:,.{digits}f}"


def main_step(args):
    title = (f"Training step of the full AWD-LSTM per head (embed {args.embed}, hidden "
             f"{args.hidden}, 3 layers, V = {args.vocab:,}, bptt {args.bptt})")
    start = context()
    rows = []
    for name in args.heads:
        batch = args.batch
        for override in args.head_batch:
            head, b = override.split("=")
            if head == name:
                batch = int(b)
        spec = dict(hidden=args.hidden, head=HEADS[name], batch=batch, bptt=args.bptt,
                    vocab=args.vocab, embed=args.embed,
                    field=args.field, lr=args.lr, steps=args.steps, warmup=args.warmup)
        print(f"# {name}: {spec}", flush=True)
        r = run_child("step", spec)
        r.update(name=name, batch=batch)
        print(json.dumps(r), flush=True)
        rows.append(r)
    load_end = os.getloadavg()
    soft = next((r for r in rows if r["name"] == "softmax" and "error" not in r), None)
    lines = [start, "",
             f"Random tokens; the awd_lstm_ptb preset's dropouts, weight decay, clip 0.25, "
             f"SGD at lr {args.lr}; dopri5, rtol = atol = 1e-5, adjoint gradients; flows with "
             f"Hutchinson's trace (Gaussian) in training; field: `{args.field}` (see the "
             f"script's docstring). Median of {args.steps} steps after {args.warmup} warm-up "
             f"step(s), each head in its own process. " + MEMORY_TEXT + " Load average at "
             f"the end: " + "/".join(f"{v:.2f}" for v in load_end) + ".", "",
             "| head | batch | s/step (median) | min-max s | first step s | vs softmax | "
             "NFE per step (forward solve) | TF peak MiB, step | TF peak MiB, first step | "
             "RSS peak MiB, step | RSS peak MiB, first step |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['batch']} | error: "
                         f"{r['error'].splitlines()[-1][:120]} | | | | | | | | |")
            continue
        ratio = (f"{r['median_s'] / soft['median_s']:.1f}x" if soft and soft["batch"] == r[
            "batch"] else "n/a")
        nfe = sorted(set(int(n) for n in r["nfe"] if n == n))
        nfe_text = "-" if not nfe else ("/".join(str(n) for n in nfe))
        lines.append(f"| {r['name']} | {r['batch']} | {r['median_s']:.2f} | "
                     f"{r['min_s']:.2f}-{r['max_s']:.2f} | {r['first_step_s']:.1f} | {ratio} | "
                     f"{nfe_text} | {fmt(r['tf_step_mib'], 0)} | {fmt(r['tf_first_mib'], 0)} | "
                     f"{fmt(r['step_mib'], 0)} | {fmt(r['first_step_mib'], 0)} |")
    if args.plot:
        plot_steps({f"field {args.field}": rows}, args.plot)
        lines += ["", f"Plot: {os.path.relpath(args.plot, REPO)}."]
    publish(title, "\n".join(lines), args.results)


def plot_steps(groups, path):
    """Grouped bars per head: seconds per training step and TensorFlow's step peak memory,
    one group per {label: rows} entry (e.g. the two --field settings)."""
    # deferred: matplotlib loads only when a figure is drawn
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    width = 0.8 / len(groups)
    for g, (label, rows) in enumerate(groups.items()):
        rows = [r for r in rows if "error" not in r]
        x = np.arange(len(rows)) + g * width
        nfe = [("" if r["nfe"][0] != r["nfe"][0] else f"{int(r['nfe'][0])}") for r in rows]
        bars = axes[0].bar(x, [r["median_s"] for r in rows], width, label=label)
        axes[0].bar_label(bars, labels=[f"NFE {n}" if n else "" for n in nfe], fontsize=7)
        axes[1].bar(x, [r["tf_step_mib"] / 1024 for r in rows], width, label=label)
        for ax in axes:
            ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, [r["name"] for r in rows])
    axes[0].set_ylabel("seconds per training step (median)")
    axes[1].set_ylabel("TF CPU allocator peak per step (GiB)")
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    first = next(iter(groups.values()))[0]
    fig.suptitle(f"AWD-LSTM (PTB sizes), batch {first['batch']}, bptt 70: one training step "
                 "on this CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main_ccnf_eval(args):
    title = "Conditional CNF (ccnf): full-vocabulary evaluation at batch 1"
    start = context()
    rows = []
    for chunk in args.chunks:
        spec = dict(hidden=args.hidden, chunk=None if chunk == 0 else chunk, bptt=args.bptt,
                    vocab=args.vocab, embed=args.embed,
                    field=args.field, windows=args.windows, warmup=args.warmup)
        print(f"# ccnf eval: {spec}", flush=True)
        r = run_child("ccnf-eval", spec)
        r.update(chunk=chunk)
        print(json.dumps(r), flush=True)
        rows.append(r)
    load_end = os.getloadavg()
    lines = [start, "",
             f"AWD-LSTM embed {args.embed}, hidden {args.hidden}, 3 layers, V = {args.vocab:,}; "
             f"windows of "
             f"{args.bptt} tokens at batch 1 (`model.test_on_batch`), every word's flow per "
             f"position with the exact trace, dopri5 rtol = atol = 1e-5; field `{args.field}`;"
             f" median of {args.windows} windows after {args.warmup} warm-up window(s), each "
             f"chunk size in its own process. NFE per window = the sum over the chunks' "
             f"solves. " + MEMORY_TEXT.replace("step", "window") + " Load average at the "
             f"end: " + "/".join(f"{v:.2f}" for v in load_end) + ".", "",
             "| vocab_chunk | s/window (median) | s/token | NFE per window | "
             "TF peak MiB, window | RSS peak MiB, window | RSS peak MiB, first window | "
             "400 tokens (thesis) | PTB test (82,430 tokens) |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        chunk = f"{args.vocab:,} (one solve)" if r["chunk"] == 0 else f"{r['chunk']:,}"
        if "error" in r:
            lines.append(f"| {chunk} | error: {r['error'].splitlines()[-1][:120]} "
                         "| | | | | | | |")
            continue
        per_token = r["median_s"] / args.bptt
        nfe = "/".join(str(int(n)) for n in sorted(set(r["nfe"])))
        lines.append(f"| {chunk} | {r['median_s']:.1f} | {per_token:.2f} | {nfe} | "
                     f"{fmt(r['tf_step_mib'], 0)} | {fmt(r['step_mib'], 0)} | "
                     f"{fmt(r['first_step_mib'], 0)} | "
                     f"{400 * per_token / 60:.1f} min | "
                     f"{PTB_TEST_TOKENS * per_token / 3600:.1f} h |")
    publish(title, "\n".join(lines), args.results)


def main_tolerance(args):
    title = f"Solver cost vs tolerance on trained heads ({args.split} split)"
    start = context()
    results = {}
    for item in args.run:
        label, run = item.split("=", 1)
        spec = dict(run=run, split=args.split, batch=args.batch, bptt=args.bptt,
                    rtols=args.rtols, repeats=args.repeats, autotune=args.autotune)
        print(f"# {label}: {spec}", flush=True)
        out = run_child("tolerance", spec)
        print(json.dumps(out), flush=True)
        results[label] = out
    load_end = os.getloadavg()
    lines = [start, "",
             f"One evaluation pass over the {args.split} split at batch {args.batch}, bptt "
             f"{args.bptt} (the model loaded afresh per tolerance, its first window run "
             f"once untimed to trace the step; median and range of {args.repeats} passes; "
             f"tf.data autotuning {'on' if args.autotune else 'off'}); "
             f"dopri5 with rtol = atol; node: NFE of each "
             f"window's solve of the logits; cnf: of the flow of the output embeddings (one "
             f"solve per window, exact trace in evaluation); ccnf: of every word's flow per "
             f"position, the whole vocabulary in one solve. Δ ppl: against the tightest "
             f"tolerance. Load average at the end: "
             + "/".join(f"{v:.2f}" for v in load_end) + ".", "",
             "| head (run) | rtol = atol | NFE per window (mean) | max | seconds per pass "
             "(median) | min-max s | ms per window | perplexity | Δ ppl |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, rows in results.items():
        if isinstance(rows, dict) and "error" in rows:
            lines.append(f"| {label} | error: {rows['error'].splitlines()[-1][:150]} "
                         "| | | | | | | |")
            continue
        ref = min(rows, key=lambda r: r["rtol"])["perplexity"]
        for r in rows:
            lines.append(f"| {label} | {r['rtol']:.0e} | {r['nfe_mean']:.1f} | "
                         f"{r['nfe_max']:.0f} | {r['seconds']:.2f} | "
                         f"{r['min_s']:.2f}-{r['max_s']:.2f} | "
                         f"{1e3 * r['seconds'] / r['windows']:.1f} | {r['perplexity']:.4f} | "
                         f"{r['perplexity'] - ref:+.2e} |")
    if args.plot:
        plot_tolerance(results, args.plot)
        lines += ["", f"Plot: {os.path.relpath(args.plot, REPO)}."]
    publish(title, "\n".join(lines), args.results)


def plot_tolerance(results, path):
    # deferred: matplotlib loads only when a figure is drawn
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for label, rows in results.items():
        if isinstance(rows, dict):
            continue
        rt = [r["rtol"] for r in rows]
        axes[0].plot(rt, [r["nfe_mean"] for r in rows], "o-", label=label)
        axes[1].plot(rt, [r["seconds"] for r in rows], "o-", label=label)
    axes[1].set_yscale("log")
    for ax, ylabel in zip(axes, ("NFE per window (mean)", "seconds per evaluation pass")):
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("rtol = atol")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("dopri5 cost vs tolerance, trained heads on the synthetic language")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=None,
                   help="the results file (default: the mode's in results/ beside this script)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="mode")
    s = sub.add_parser("step", help="training step per head at the PTB sizes")
    s.add_argument("--hidden", type=int, default=1150)
    s.add_argument("--embed", type=int, default=400)
    s.add_argument("--vocab", type=int, default=10_000)
    s.add_argument("--batch", type=int, default=20)
    s.add_argument("--bptt", type=int, default=70)
    s.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    s.add_argument("--head-batch", nargs="*", default=[], metavar="HEAD=B",
                   help="a smaller batch for a head too slow at --batch")
    s.add_argument("--steps", type=int, default=3)
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument("--lr", type=float, default=0.01)
    s.add_argument("--field", choices=["random", "init"], default="random")
    s.add_argument("--plot", default=None, help="PNG of time and memory per head")
    e = sub.add_parser("ccnf-eval", help="ccnf full-vocabulary evaluation at batch 1")
    e.add_argument("--hidden", type=int, default=1150)
    e.add_argument("--embed", type=int, default=400)
    e.add_argument("--vocab", type=int, default=10_000)
    e.add_argument("--bptt", type=int, default=10)
    e.add_argument("--chunks", type=int, nargs="+", default=[1000, 2500],
                   help="vocab_chunk values (0: the whole vocabulary in one solve)")
    e.add_argument("--windows", type=int, default=2)
    e.add_argument("--warmup", type=int, default=1)
    e.add_argument("--field", choices=["random", "init"], default="random")
    t = sub.add_parser("tolerance", help="NFE and time vs rtol on trained runs")
    t.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR")
    t.add_argument("--rtols", type=float, nargs="+", default=[1e-3, 1e-4, 1e-5, 1e-6])
    t.add_argument("--split", default="valid", choices=["valid", "test"])
    t.add_argument("--repeats", type=int, default=3, help="timed passes per tolerance")
    t.add_argument("--autotune", action="store_true",
                   help="keep tf.data autotuning on (see the module docstring)")
    t.add_argument("--batch", type=int, default=10)
    t.add_argument("--bptt", type=int, default=35)
    t.add_argument("--plot", default=str(results_path(__file__, "flow_heads_tolerance.png")))
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.child:
        mode, spec = args.child[0], json.loads(args.child[1])
        fn = {"step": child_step, "ccnf-eval": child_ccnf_eval,
              "tolerance": child_tolerance}[mode]
        print("RESULT " + json.dumps(fn(spec)), flush=True)
        return
    if args.results is None:
        name = {"step": f"flow_heads_step_{getattr(args, 'field', 'random')}.md",
                "ccnf-eval": "flow_heads_ccnf_eval.md",
                "tolerance": "flow_heads_tolerance.md"}[args.mode]
        args.results = results_path(__file__, name)
    {"step": main_step, "ccnf-eval": main_ccnf_eval, "tolerance": main_tolerance}[
        args.mode](args)


if __name__ == "__main__":
    main()
