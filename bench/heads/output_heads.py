"""Benchmark the output heads: forward+backward time and peak memory relative to softmax.

    python -m bench.heads.output_heads                   # TensorFlow, V=10,000, B=12, T=70, d=280
    python -m bench.heads.output_heads --quick           # small sizes, a smoke run
    python -m bench.heads.output_heads --backend torch   # re-executes itself, KERAS_BACKEND=torch

What is measured (head only, no LSTM body; the input is a random (B, T, d) context tensor):

* time: median wall time of one `model.train_on_batch` step (forward, backward through the
  head and the tied embedding, SGD update) after warm-up steps, all heads timed in this one
  process, one after the other. Ratio = head time / softmax time.
* memory, GPU: the backend's device peak-allocation counter (TensorFlow
  `tf.config.experimental.get_memory_info`, PyTorch `torch.cuda.max_memory_allocated`, JAX
  `memory_stats()["peak_bytes_in_use"]`) over the training steps, minus what is allocated
  before the first step (weights, data). Measured in a fresh subprocess per head.
* memory, CPU: in a fresh subprocess per head, the process's peak resident set (VmHWM from
  /proc/self/status) minus its resident set after building the model and the data and before
  the first step. This counts the step's activations, gradients and temporaries, plus the
  one-off tracing/compilation memory of the first step (roughly the same for every head) and
  whatever the allocator keeps; it is an upper bound on the head's working memory, compared
  across heads under identical conditions.

Writes a markdown table to stdout and to results/heads.md beside this script (or --output),
with machine, versions and the command line (`bench.harness.publish`, which keeps the notes
written below its marker).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from bench.harness import REPO, module_command, publish, results_path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="tensorflow", choices=["tensorflow", "torch", "jax"])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--bptt", type=int, default=None)
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--steps", type=int, default=None,
                   help="timed rounds (one step per head per round)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--heads", default=None,
                   help="comma-separated subset of head names (softmax is always included)")
    p.add_argument("--no-memory", action="store_true", help="skip the per-head memory runs")
    p.add_argument("--jit-compile", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--output", default=None, help="markdown file (default results/heads.md "
                   "beside this script; '-' for none)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def sizes(args):
    if args.quick:
        d = dict(vocab=2000, batch=4, bptt=20, dim=64, steps=3)
    else:
        d = dict(vocab=10_000, batch=12, bptt=70, dim=280, steps=7)
    for k in d:
        if getattr(args, k) is not None:
            d[k] = getattr(args, k)
    return d


def head_specs(quick):
    """name -> (constructor name, kwargs). All tied to a TiedEmbedding(V, d)."""
    plif_k = 10_000 if quick else 100_000
    specs = {
        "softmax": ("SoftmaxLayer", {}),
        "gss(-1.5,2.5)": ("GSSHead", dict(c=-1.5, k=2.5)),
        f"plif(K={plif_k})": ("PLIFHead", dict(num_intervals=plif_k, bound=20.0)),
    }
    for k in (1, 5, 10, 15):
        specs[f"mos-{k}"] = ("MoSLayer", dict(num_experts=k))
    specs["moc-15"] = ("MoCLayer", dict(num_experts=15))
    specs["mixtape-4"] = ("MixtapeLayer", dict(num_components=4, gate_dim=64))
    shared = 300 if quick else 3000
    specs[f"mixtape-4 (S={shared})"] = ("MixtapeLayer", dict(num_components=4, gate_dim=64,
                                                             shared_gate_rank=shared))
    return specs


# ---------------------------------------------------------------------------------------
# Work done under the chosen backend
# ---------------------------------------------------------------------------------------

def build(name, cfg, jit_compile):
    # deferred: the child process loads the framework, with the environment its parent set
    import keras
    import tflm
    from tflm import layers as L

    keras.utils.set_random_seed(0)
    cls_name, kwargs = head_specs(cfg["quick"])[name]
    emb = L.TiedEmbedding(cfg["vocab"], cfg["dim"])
    head = getattr(L, cls_name)(embedding=emb, **kwargs)
    inp = keras.Input((cfg["bptt"], cfg["dim"]), batch_size=cfg["batch"])
    model = keras.Model(inp, head(inp))
    jit = {"auto": "auto", "true": True, "false": False}[jit_compile]
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=tflm.losses.NLL(), jit_compile=jit)
    cfg["resolved_jit_compile"] = bool(getattr(model, "jit_compile", False))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(cfg["batch"], cfg["bptt"], cfg["dim"])).astype("float32")
    y = rng.integers(0, cfg["vocab"], size=(cfg["batch"], cfg["bptt"])).astype("int32")
    return model, x, y


def sync():
    # deferred: the child process loads the framework, with the environment its parent set
    import keras
    if keras.backend.backend() == "torch":
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def step(model, x, y):
    loss = model.train_on_batch(x, y)
    sync()
    return float(loss)


def time_heads(names, cfg, args):
    """Median step time per head; heads are timed round-robin (one step each per round) so
    that load changes on a shared machine hit every head alike."""
    built = {}
    for name in names:
        model, x, y = build(name, cfg, args.jit_compile)
        for _ in range(args.warmup):
            step(model, x, y)
        built[name] = (model, x, y)
    times = {name: [] for name in names}
    for _ in range(cfg["steps"]):
        for name in names:
            model, x, y = built[name]
            t0 = time.perf_counter()
            step(model, x, y)
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name in names:
        t = sorted(times[name])
        out[name] = dict(median_s=t[len(t) // 2], min_s=t[0], max_s=t[-1])
    return out


def _rss_kb(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def gpu_kind():
    # deferred: the child process loads the framework, with the environment its parent set
    import keras
    b = keras.backend.backend()
    if b == "tensorflow":
        import tensorflow as tf
        return "GPU:0" if tf.config.list_physical_devices("GPU") else None
    if b == "torch":
        import torch
        return "cuda" if torch.cuda.is_available() else None
    import jax
    return "gpu" if jax.devices()[0].platform == "gpu" else None


def memory_child(name, cfg, args):
    """Run in a fresh process: peak memory of the training steps of one head."""
    # deferred: the child process loads the framework, with the environment its parent set
    import keras
    model, x, y = build(name, cfg, args.jit_compile)
    gpu = gpu_kind()
    b = keras.backend.backend()
    if gpu and b == "tensorflow":
        import tensorflow as tf
        base = tf.config.experimental.get_memory_info(gpu)["current"]
        tf.config.experimental.reset_memory_stats(gpu)
    elif gpu and b == "torch":
        import torch
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    elif gpu:
        import jax
        base = jax.devices()[0].memory_stats()["bytes_in_use"]
    else:
        base = _rss_kb("VmRSS") * 1024
    for _ in range(1 + args.warmup):
        step(model, x, y)
    if gpu and b == "tensorflow":
        peak = tf.config.experimental.get_memory_info(gpu)["peak"]
    elif gpu and b == "torch":
        peak = torch.cuda.max_memory_allocated()
    elif gpu:
        peak = jax.devices()[0].memory_stats()["peak_bytes_in_use"]
    else:
        peak = _rss_kb("VmHWM") * 1024
    return dict(peak_bytes=peak, base_bytes=base, delta_bytes=peak - base,
                kind=("device peak allocation (" + gpu + ")") if gpu else "peak RSS (VmHWM)")


def run_child(name, cfg, args):
    cmd = module_command(__spec__.name, "--child", json.dumps([name, cfg]),
                         "--backend", args.backend, "--warmup", args.warmup,
                         "--jit-compile", args.jit_compile)
    env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return dict(error=(proc.stderr or proc.stdout)[-800:])


def versions():
    # deferred: the child process loads the framework, with the environment its parent set
    import keras
    out = {"python": platform.python_version(), "keras": keras.__version__,
           "numpy": np.__version__, "backend": keras.backend.backend()}
    b = keras.backend.backend()
    if b == "tensorflow":
        import tensorflow as tf
        out["tensorflow"] = tf.__version__
    elif b == "torch":
        import torch
        out["torch"] = torch.__version__
    else:
        import jax
        out["jax"] = jax.__version__
    return out


def fmt_mb(b):
    return f"{b / 2**20:,.0f}"


def main(argv=None):
    args = parse_args(argv)
    if os.environ.get("KERAS_BACKEND", "tensorflow") != args.backend:
        env = dict(os.environ, KERAS_BACKEND=args.backend,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])))
        os.execve(sys.executable, module_command(__spec__.name, *sys.argv[1:]), env)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    if args.child:
        name, cfg = json.loads(args.child)
        print("RESULT " + json.dumps(memory_child(name, cfg, args)), flush=True)
        return

    cfg = sizes(args)
    cfg["quick"] = args.quick
    specs = head_specs(args.quick)
    names = list(specs)
    if args.heads:
        wanted = {"softmax"} | {h.strip() for h in args.heads.split(",")}
        unknown = wanted - set(names)
        if unknown:
            raise SystemExit(f"unknown heads {sorted(unknown)}; choose from {names}")
        names = [n for n in names if n in wanted]

    gpu = gpu_kind()
    print(f"# backend={args.backend} device={'GPU' if gpu else 'CPU'} sizes={cfg}", flush=True)
    load_before = os.getloadavg()
    results = time_heads(names, cfg, args)
    for name in names:
        r = results[name]
        print(f"time   {name:22s} {r['median_s'] * 1e3:9.1f} ms/step (min {r['min_s'] * 1e3:.1f}, "
              f"max {r['max_s'] * 1e3:.1f})", flush=True)
    if not args.no_memory:
        for name in names:
            results[name].update(run_child(name, cfg, args))
            r = results[name]
            msg = r.get("error", "").strip().splitlines()[-1:] if "error" in r else None
            print(f"memory {name:22s} " + (f"ERROR {msg}" if msg is not None else
                  f"{fmt_mb(r['delta_bytes'])} MB over baseline, peak {fmt_mb(r['peak_bytes'])} MB"),
                  flush=True)

    load_after = os.getloadavg()
    base = results["softmax"]
    elems = cfg["batch"] * cfg["bptt"] * cfg["vocab"]
    lines = [
        "| head | ms/step (median) | min-max ms | time vs softmax (median) | (min) "
        "| step memory MB | memory vs softmax |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in names:
        r = results[name]
        t_ratio = r["median_s"] / base["median_s"]
        if "delta_bytes" in r and "delta_bytes" in base:
            mem, m_ratio = fmt_mb(r["delta_bytes"]), f"{r['delta_bytes'] / base['delta_bytes']:.2f}x"
        else:
            mem, m_ratio = "n/a", "n/a"
        lines.append(f"| {name} | {r['median_s'] * 1e3:,.1f} | {r['min_s'] * 1e3:,.0f}-"
                     f"{r['max_s'] * 1e3:,.0f} | {t_ratio:.2f}x | "
                     f"{r['min_s'] / base['min_s']:.2f}x | {mem} | {m_ratio} |")
    table = "\n".join(lines)
    mem_kind = next((r["kind"] for r in results.values() if "kind" in r), None)
    mem_text = ("Memory: not measured (--no-memory)." if mem_kind is None else
                f"Memory: {mem_kind} of a fresh process per head, minus its level after building "
                "the model and\ndata (see the module docstring of bench/heads/output_heads.py for "
                "what this includes).")
    report = f"""Platform: {platform.system()} {platform.machine()}
Versions: {json.dumps(versions())}
Device: {'GPU' if gpu else 'CPU'}; jit_compile={args.jit_compile} (resolved: {cfg.get('resolved_jit_compile')})
Sizes: V={cfg['vocab']:,}, batch={cfg['batch']}, bptt={cfg['bptt']}, d={cfg['dim']} (one (B, T, V)
tensor = {elems:,} floats = {elems * 4 / 2**20:,.0f} MB in float32); {cfg['steps']} timed rounds after
{args.warmup} warm-up steps; tied embedding; head only (no LSTM body).
Load average (1/5/15 min) before timing: {"/".join(f"{v:.1f}" for v in load_before)}, after:
{"/".join(f"{v:.1f}" for v in load_after)} (other processes share the CPUs when this is high).

Time: median over rounds of one `train_on_batch` step (forward + backward + SGD update); all
heads are built in one process and timed round-robin, one step each per round.
{mem_text}

{table}
"""
    print()
    out = args.output or results_path(__file__, "heads.md")
    publish("Output-head benchmark", report, None if out == "-" else out)


if __name__ == "__main__":
    main()
