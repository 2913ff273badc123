"""Speed, perplexity and memory of one preset across TensorFlow, JAX, PyTorch and native PyTorch.

    python tools/compare_frameworks.py --preset awd_lstm_mos_ptb \\
        --backends tensorflow,jax,torch,torch-native --steps 50 [--epochs 2] \\
        [--device cpu|gpu] [--precision float32|mixed_bfloat16] [--jit] [--plot] --out DIR

Writes DIR/results.json and DIR/results.md and prints the table. Method:

- **Same start everywhere.** An `init` worker (TensorFlow when installed) loads the corpus,
  batchifies it, cuts the windows of every epoch with `tflm.data.window_starts` (the rule of
  `lm_windows` / `lm_dataset`), builds the preset's `zoo.AWDLSTM` and saves its weights by
  role (embedding, lstm{i}.kernel, ..., head.latent_kernel) and the data to DIR/*.npz. Every
  backend then runs in its own process (Keras picks its backend at import) and loads those
  weights (the native model maps them by role: transposes, b_hh = 0), so parameter counts,
  data, batch order, seeds and number of steps are the same.
- **Keras backends** (tensorflow, jax, torch) train with `model.fit` on the library's own
  path: `LanguageModel`'s train step (NLL + AR/TAR, global-norm clip, L2, T/bptt), carried
  LSTM state, `tflm.optimizers.SGD`; data as tf.data on TensorFlow (how `lm_dataset` builds
  it) and a `keras.utils.PyDataset` of NumPy windows on JAX / PyTorch, padded to a multiple
  of 4 positions on JAX (`--pad-to-multiple`, as `zoo.train` does: one compile per padded
  length; the padding is masked and its cost is part of the measured speed). **torch-native** is
  `tools/torch_native.py`: plain PyTorch, `torch.lstm` with the weight-dropped matrix,
  global-norm clipping, `torch.optim.SGD` (the salesforce/awd-lstm-lm loop).
- **Speed.** Words/s of one step = B * T / wall time of that step, ending with a blocking
  fetch of the loss; reported as the median over the steps after `--warmup` steps
  ("train words/s"), and the median over the steps that did not (re)trace or compile
  ("steady"; TensorFlow and JAX retrace per new window shape, counted by the number of
  Python executions of the train step); "end-to-end" = all tokens of the timed steps / their
  total time, warm-up and compiles included. Evaluation words/s: one timed pass over the
  validation windows (`--eval-windows`, default all) after a warm-up pass on the first and
  last window shapes.
- **Perplexity** on the validation split after the same steps (and after each of
  `--epochs` full epochs, from the same initial weights, with the training wall time; the
  figure `--plot` draws validation perplexity against that time for every backend).
- **Memory.** Peak GPU allocator memory on a GPU, else the worker's peak RSS (which includes
  the framework runtime; "RSS after build" is given beside it).
- **Floor.** FLOPs per token from the layer sizes (matmul parameters P touched per token:
  4n(in + n) per LSTM layer, V d for a tied softmax, d K L + d K + K V L for MoS), training
  = 6 P, evaluation = 2 P; floor words/s = the device's measured GEMM rate (float32 n^3 GEMM
  in each worker: NumPy on a CPU, torch on a GPU) / FLOPs per token.
- **Process settings, the same for every backend.** `--threads N` pins the intra/inter-op
  pools (OMP/MKL/OpenBLAS, TF_NUM_*, XLA's Eigen pool, torch.set_num_threads): on a shared
  2-core machine the default (one thread per core) made PyTorch's small ops wait on a busy
  core (25x slower here), so use `--threads 1` there. `--malloc keep` (default) stops glibc
  from returning tensors over 32 MiB to the OS after every step, which otherwise costs
  PyTorch on a CPU half its step time with a MoS head (page faults); TF and XLA keep their
  own arenas either way.
- **Fairness.** With every dropout off (`--no-dropout`) all backends compute the same
  function: the first-step loss must agree to float tolerance (`agreement` in the JSON).
  With dropout on the random streams differ (keras.random per backend vs torch.Generator),
  so perplexities agree only statistically.

A backend whose package is not installed, or that cannot run the preset (GPU requested and
none visible; a head the native peer does not implement), is reported as skipped with the
reason. Importable: `run(argv)` returns the results dict; `format_table`, `markdown`,
`plot_curves`, `flops_per_token`.
"""

import argparse
import concurrent.futures
import copy
import datetime
import importlib.util
import json
import math
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python tools/compare_frameworks.py`
    sys.path.insert(0, str(REPO))

from tools.machine import cpu_model, memory_gib  # noqa: E402
PRESET_DIR = REPO / "zoo" / "presets"
WORKER = REPO / "tools" / "framework_worker.py"
BACKENDS = ("tensorflow", "jax", "torch", "torch-native")
_PACKAGE = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch", "torch-native": "torch"}
_DROPOUTS = ("dropout", "dropout_h", "dropout_i", "dropout_e", "weight_dropout")


class UserError(Exception):
    """A mistake in the command line; printed as one line."""


def build_parser():
    p = argparse.ArgumentParser(prog="python tools/compare_frameworks.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="awd_lstm_mos_ptb", help="preset name or JSON path")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--steps", type=int, default=20, help="training windows timed (default 20)")
    p.add_argument("--warmup", type=int, default=3,
                   help="first steps left out of the median (default 3)")
    p.add_argument("--epochs", type=int, default=0,
                   help="also train E full epochs from the same start (default 0)")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default="float32")
    p.add_argument("--jit", action="store_true",
                   help="XLA on TensorFlow, torch.compile on PyTorch (JAX is always jitted)")
    p.add_argument("--eval-windows", type=int, default=0,
                   help="validation windows to evaluate (default 0 = all)")
    p.add_argument("--window-lengths", choices=["variable", "fixed"], default="variable",
                   help="variable: the AWD-LSTM random lengths (default); fixed: all = bptt")
    p.add_argument("--pad-to-multiple", default="auto", metavar="M",
                   help="Keras backends: pad each window to a multiple of M positions "
                        "(tflm.data pad_to_multiple; the padding is masked). auto (default): "
                        "4 on JAX (a compile per padded length, not per length), 1 elsewhere, "
                        "as python -m zoo.train does")
    p.add_argument("--no-dropout", action="store_true",
                   help="every dropout 0 (deterministic: the losses must agree)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset field, e.g. --set model.hidden_dim=256")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads per framework (intra- and inter-op; BLAS; XLA): the same "
                        "for every backend. Default 0 = each framework's default")
    p.add_argument("--malloc", choices=["keep", "system"], default="keep",
                   help="keep (default): glibc keeps freed memory in the process "
                        "(MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge), so tensors larger "
                        "than 32 MiB are not mmapped and page-faulted in again at every step "
                        "(2x on PyTorch CPU with a MoS head); system: glibc defaults")
    p.add_argument("--data-dir", help="corpus directory (default $TFLM_DATA_DIR)")
    p.add_argument("--jobs", type=int, default=1,
                   help="backends run at once (default 1; >1 spoils the timings)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per backend")
    p.add_argument("--save-weights", action="store_true",
                   help="save every backend's weights after the steps (DIR/weights_*.npz)")
    p.add_argument("--plot", action="store_true",
                   help="DIR/valid_perplexity_vs_time.png (needs --epochs and matplotlib)")
    p.add_argument("--out", required=True, help="output directory")
    return p


# ---- configuration ------------------------------------------------------------------------
def load_preset_file(name):
    """The preset JSON (name in zoo/presets or a path), read without importing Keras."""
    path = pathlib.Path(name)
    if not (path.suffix == ".json" and path.exists()):
        path = PRESET_DIR / f"{name}.json"
    if not path.exists():
        names = sorted(p.stem for p in PRESET_DIR.glob("*.json"))
        raise UserError(f"unknown preset {name!r}; available: {', '.join(names)} (or a path "
                        "to a preset JSON file).")
    return json.loads(path.read_text()), path.stem


def apply_override(config, item):
    """KEY=VALUE with a dotted KEY; VALUE parsed as JSON when it can be."""
    if "=" not in item:
        raise UserError(f"--set expects KEY=VALUE, got {item!r}.")
    key, raw = item.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part, {}), dict):
            raise UserError(f"--set {item}: {part!r} is not a section.")
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def resolve_config(preset, overrides=(), no_dropout=False):
    config, name = load_preset_file(preset)
    config = copy.deepcopy(config)
    config["preset"] = name
    for item in overrides:
        apply_override(config, item)
    if no_dropout:
        for key in _DROPOUTS:
            config["model"][key] = 0.0
        if isinstance(config["model"].get("head"), dict) and \
                "latent_dropout" in config["model"]["head"]:
            config["model"]["head"]["latent_dropout"] = 0.0
    return config


def _head_spec(model_cfg):
    head = model_cfg.get("head", "softmax")
    if isinstance(head, str):
        return head.lower(), {}
    head = dict(head)
    return str(head.pop("type", "softmax")).lower(), head


def flops_per_token(config, vocab_size):
    """Matmul parameters touched per token and the FLOPs of a training / evaluation token.

    P = sum over LSTM layers 4 n (in + n) + head, head = V d (tied softmax), d K L + d K +
    K V L (MoS, MoC without the K V L), with d the last layer's size and L the embedding size
    (tied). Forward = 2 P FLOPs per token, training (forward + backward) = 6 P.
    """
    m = config["model"]
    embed, hidden = int(m.get("embed_dim", 400)), int(m.get("hidden_dim", 1150))
    layers = int(m.get("num_layers", 3))
    tied = bool(m.get("tie_weights", True))
    last = int(m.get("last_dim") or (embed if tied else hidden))
    lstm = 0
    for i in range(layers):
        size_in = embed if i == 0 else hidden
        n = last if i == layers - 1 else hidden
        lstm += 4 * n * (size_in + n)
    name, opts = _head_spec(m)
    latent = embed if tied else last
    v = int(vocab_size)
    if name in ("mos", "moc"):
        k = int(opts.get("num_experts", 15))
        head = last * k * latent + last * k + (k * v * latent if name == "mos" else v * latent)
    elif name == "doc":
        head = None
    else:
        head = v * latent
    if head is None:
        return {"lstm_params": lstm, "head_params": None, "params_per_token": None,
                "train_flops_per_token": None, "eval_flops_per_token": None,
                "note": f"no FLOP model for head {name!r}"}
    p = lstm + head
    return {"lstm_params": lstm, "head_params": head, "params_per_token": p,
            "train_flops_per_token": 6 * p, "eval_flops_per_token": 2 * p}


# ---- running the workers ------------------------------------------------------------------
def backend_available(name):
    """(True, "") or (False, reason) without importing the framework."""
    if name not in BACKENDS:
        return False, f"unknown backend (choose from {', '.join(BACKENDS)})"
    package = _PACKAGE[name]
    if importlib.util.find_spec(package) is None:
        return False, f"Python package {package!r} is not installed"
    if name != "torch-native" and importlib.util.find_spec("keras") is None:
        return False, "Python package 'keras' is not installed"
    return True, ""


def _worker_env(backend, device, threads=0, malloc="keep"):
    env = dict(os.environ)
    if malloc == "keep":
        env["MALLOC_MMAP_MAX_"] = "0"
        env["MALLOC_TRIM_THRESHOLD_"] = str(2 ** 40)
    if threads:
        n = str(int(threads))
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
            env[key] = n
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "multi_thread_eigen" not in f
                 and "intra_op_parallelism" not in f]
        flags.append(f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'}")
        env["XLA_FLAGS"] = " ".join(flags)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if backend != "torch-native":
        env["KERAS_BACKEND"] = backend
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["JAX_PLATFORMS"] = "cpu"
    return env


def run_worker(spec, out, timeout):
    """Run one worker process; returns its result dict (failed/timeout reported)."""
    name = spec["backend"] if spec["phase"] == "run" else "init"
    spec_path = out / f"spec_{name}.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log_path = out / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = _worker_env(spec["backend"], spec["device"], spec.get("threads", 0),
                      spec.get("malloc", "keep"))
    started = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run([sys.executable, str(WORKER), str(spec_path)], cwd=REPO,
                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            return {"backend": spec["backend"], "status": "failed",
                    "reason": f"timed out after {timeout:.0f} s (log: {log_path})"}
    result_path = pathlib.Path(spec["result_path"])
    if not result_path.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        return {"backend": spec["backend"], "status": "failed",
                "reason": f"worker exited with code {code} and no result: {' | '.join(tail)}"}
    result = json.loads(result_path.read_text())
    result["process_wall_s"] = time.perf_counter() - started
    result["log"] = str(log_path)
    return result


def _pick_init_backend():
    for name in ("tensorflow", "jax", "torch"):
        if backend_available(name)[0]:
            return name
    raise UserError("no Keras backend (tensorflow, jax or torch) is installed; the initial "
                    "weights come from the Keras model.")


def _machine():
    cpu, mem = cpu_model(), memory_gib()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": mem, "python": platform.python_version(),
            "load_average_start": [round(x, 2) for x in load] if load else None}


def run(argv=None):
    """Run the comparison; returns the results dict (also written to OUT/results.json)."""
    args = build_parser().parse_args(argv)
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names:
        raise UserError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}.")
    if args.steps < 1:
        raise UserError(f"--steps must be >= 1; got {args.steps}.")
    if args.pad_to_multiple != "auto" and not (
            args.pad_to_multiple.isdigit() and int(args.pad_to_multiple) >= 1):
        raise UserError("--pad-to-multiple must be auto or a positive integer; got "
                        f"{args.pad_to_multiple!r}.")
    if args.plot and args.epochs < 1:
        raise UserError("--plot draws validation perplexity per epoch: pass --epochs >= 1.")
    config = resolve_config(args.preset, args.set, args.no_dropout)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    common = {
        "config": config, "steps": args.steps, "warmup": args.warmup, "epochs": args.epochs,
        "device": args.device, "precision": args.precision, "jit": args.jit,
        "eval_windows": args.eval_windows, "window_lengths": args.window_lengths,
        "pad_to_multiple": args.pad_to_multiple, "threads": args.threads, "malloc": args.malloc, "data_dir": args.data_dir,
        "data_path": str(out / "data.npz"),
        "weights_path": str(out / "init_weights.npz"), "save_weights": args.save_weights,
    }
    init_backend = _pick_init_backend()
    init = run_worker(dict(common, phase="init", backend=init_backend,
                           result_path=str(out / "result_init.json")), out, args.timeout)
    if init.get("status") != "ok":
        raise RuntimeError(f"could not prepare the initial weights and data on "
                           f"{init_backend}: {init.get('reason')} (log: {out / 'logs'})")

    def one(name):
        ok, reason = backend_available(name)
        if not ok:
            return {"backend": name, "status": "skipped", "reason": reason}
        spec = dict(common, phase="run", backend=name,
                    result_path=str(out / f"result_{name}.json"),
                    weights_after_path=str(out / f"weights_{name}.npz"))
        return run_worker(spec, out, args.timeout)

    if args.jobs > 1:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(one, names))
    else:
        rows = [one(name) for name in names]

    flops = flops_per_token(config, init["vocab_size"])
    for row in rows:
        rate = row.get("matmul_flops")
        if row.get("status") == "ok" and rate and flops["train_flops_per_token"]:
            row["floor_train_words_per_s"] = rate / flops["train_flops_per_token"]
            row["floor_eval_words_per_s"] = rate / flops["eval_flops_per_token"]
            if row.get("train_words_per_s"):
                row["fraction_of_floor"] = row["train_words_per_s"] / row[
                    "floor_train_words_per_s"]
    native = next((r for r in rows if r["backend"] == "torch-native"
                   and r.get("status") == "ok"), None)
    for row in rows:
        if native and row.get("status") == "ok":
            for key in ("train_words_per_s", "eval_words_per_s"):
                if row.get(key) and native.get(key):
                    row[f"{key}_vs_native"] = row[key] / native[key]

    machine["load_average_end"] = ([round(x, 2) for x in os.getloadavg()]
                                   if hasattr(os, "getloadavg") else None)
    results = {
        "command": "python tools/compare_frameworks.py " + " ".join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine, "preset": config["preset"], "config": config,
        "settings": {k: common[k] for k in ("steps", "warmup", "epochs", "device",
                                            "precision", "jit", "eval_windows",
                                            "window_lengths", "pad_to_multiple", "threads",
                                            "malloc")}
        | {"no_dropout": args.no_dropout},
        "out": str(out), "init": init, "flops": flops, "backends": rows,
        "agreement": agreement(rows, init),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    if args.plot:
        results["plot"] = plot_curves(results, out / "valid_perplexity_vs_time.png")
    return results


def agreement(rows, init=None):
    """Parameter counts and first-step losses across the backends that ran."""
    ok = [r for r in rows if r.get("status") == "ok"]
    params = {r["backend"]: r.get("params") for r in ok}
    if init is not None:
        params = {"init (Keras)": init.get("params"), **params}
    first = {r["backend"]: r.get("first_step_loss") for r in ok
             if r.get("first_step_loss") is not None}
    out = {"params": params, "params_agree": len(set(params.values())) <= 1,
           "first_step_loss": first}
    if first:
        values = list(first.values())
        ref = values[0]
        out["first_step_loss_max_rel_diff"] = max(abs(v - ref) / abs(ref) for v in values)
    return out


# ---- reporting ----------------------------------------------------------------------------
def _fmt(value, spec=",.0f", none="-"):
    if value is None:
        return none
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


COLUMNS = ("backend", "status", "train words/s", "steady words/s", "end-to-end words/s",
           "eval words/s",
           "valid ppl", "first-step loss", "params", "peak MiB", "cuDNN", "jit", "pad",
           "traces",
           "floor train w/s", "of floor", "train vs native")


def table_rows(results):
    rows = []
    for r in results["backends"]:
        if r.get("status") != "ok":
            reason = " ".join(str(r.get("reason", "")).split())
            if len(reason) > 160:
                reason = reason[:157] + "..."
            rows.append([r["backend"], f"{r.get('status')}: {reason}"]
                        + [""] * (len(COLUMNS) - 2))
            continue
        traced = r.get("train_traces")
        rows.append([
            r["backend"], "ok", _fmt(r.get("train_words_per_s")),
            _fmt(r.get("train_words_per_s_steady")),
            _fmt(r.get("train_words_per_s_end_to_end")), _fmt(r.get("eval_words_per_s")),
            _fmt(r.get("valid_perplexity_after_steps"), ".3f"),
            _fmt(r.get("first_step_loss"), ".6f"), _fmt(r.get("params"), ","),
            f"{_fmt(r.get('peak_memory_mib'))} ({r.get('memory_kind', '')})",
            r.get("cudnn", "-"), r.get("jit", "-"), str(r.get("pad_to_multiple", 1)),
            "eager" if traced is None else str(traced),
            _fmt(r.get("floor_train_words_per_s")),
            _fmt(r.get("fraction_of_floor"), ".1%"),
            _fmt(r.get("train_words_per_s_vs_native"), ".2f") + (
                "x" if r.get("train_words_per_s_vs_native") else ""),
        ])
    return rows


def format_table(results):
    """A plain-text table (what the CLI prints)."""
    rows = [list(COLUMNS)] + table_rows(results)
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown(results):
    """The markdown report: command, machine, settings, the table, epochs, agreement."""
    s, m, f = results["settings"], results["machine"], results["flops"]
    init = results["init"]
    model = results["config"]["model"]
    training = results["config"]["training"]
    versions = {}
    for r in results["backends"]:
        versions.update(r.get("versions") or {})
    lines = [
        f"### compare_frameworks: {results['preset']} ({results['date'][:10]})", "",
        f"`{results['command']}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m.get('memory_gib')} GiB; device "
        f"{s['device']}; load average at start {m.get('load_average_start')}, at end "
        f"{m.get('load_average_end')}.",
        f"Versions: {', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}.",
        f"Model: V={init['vocab_size']:,}, embed {model.get('embed_dim')}, hidden "
        f"{model.get('hidden_dim')} x {model.get('num_layers')} layers, last "
        f"{model.get('last_dim') or model.get('embed_dim')}, head {model.get('head')}; "
        f"batch {training.get('batch_size')}, bptt {training.get('bptt')} "
        f"({s['window_lengths']} lengths), eval batch {training.get('eval_batch_size')}; "
        f"corpus {init.get('corpus')} ({init.get('train_tokens'):,} train tokens); "
        f"precision {s['precision']}; dropout {'off' if s['no_dropout'] else 'on'}; "
        f"CPU threads per framework: {s.get('threads') or 'framework default'}; glibc "
        f"malloc: {s.get('malloc', 'system')}.",
        f"Steps: {s['steps']} (median over steps after {s['warmup']} warm-up steps); "
        f"evaluation over {s['eval_windows'] or 'all'} validation windows.",
    ]
    if f.get("train_flops_per_token"):
        lines.append(
            f"Arithmetic: {f['params_per_token']:,} matmul parameters per token (LSTM "
            f"{f['lstm_params']:,}, head {f['head_params']:,}) = "
            f"{f['train_flops_per_token'] / 1e6:,.1f} MFLOP per training token, "
            f"{f['eval_flops_per_token'] / 1e6:,.1f} MFLOP per evaluation token; floor = "
            "measured float32 GEMM rate / FLOPs per token.")
    rates = {r["backend"]: r.get("matmul_flops") for r in results["backends"]
             if r.get("matmul_flops")}
    if rates:
        lines.append("Measured GEMM rate (GFLOP/s, per worker): " + ", ".join(
            f"{k} {v / 1e9:,.0f}" for k, v in rates.items()) + ".")
    lines += ["", _md_table(COLUMNS, table_rows(results))]
    curves = [r for r in results["backends"] if r.get("epochs")]
    if curves:
        lines += ["", "Epochs (validation perplexity after each epoch; training wall time, "
                  "compiles included, evaluation excluded):", ""]
        header = ["epoch"] + [f"{r['backend']} val ppl (time s)" for r in curves]
        n = max(len(r["epochs"]) for r in curves)
        rows = []
        for i in range(n):
            row = [str(i)]
            for r in curves:
                if i < len(r["epochs"]):
                    e = r["epochs"][i]
                    row.append(f"{e['val_perplexity']:.3f} ({e['train_time_s']:.1f})")
                else:
                    row.append("")
            rows.append(row)
        lines.append(_md_table(header, rows))
    a = results["agreement"]
    lines += ["", f"Parameter counts agree: {'yes' if a['params_agree'] else 'NO'} "
              f"({', '.join(f'{k} {v:,}' for k, v in a['params'].items() if v)})."]
    if a.get("first_step_loss"):
        lines.append("First-step loss: " + ", ".join(
            f"{k} {v:.7f}" for k, v in a["first_step_loss"].items())
            + f" (max relative difference {a['first_step_loss_max_rel_diff']:.2e}).")
        if not s["no_dropout"]:
            lines.append(
                "Dropout is on: every backend draws its masks from its own random stream "
                "(keras.random SeedGenerator: TF stateless Philox, JAX threefry, torch "
                "generator; torch-native: one torch.Generator), so losses and perplexities "
                "agree only statistically. Run with --no-dropout for the exact check.")
    return "\n".join(lines) + "\n"


def plot_curves(results, path):
    """Validation perplexity against training wall time, one line per backend."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = 0
    for r in results["backends"]:
        if r.get("epochs"):
            ax.plot([e["train_time_s"] for e in r["epochs"]],
                    [e["val_perplexity"] for e in r["epochs"]], marker="o", label=r["backend"])
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("validation perplexity")
    ax.set_yscale("log")
    ax.set_title(f"{results['preset']} ({results['settings']['device']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main(argv=None):
    try:
        results = run(argv)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(results))
    a = results["agreement"]
    print(f"\nparameter counts agree: {a['params_agree']}; first-step loss max relative "
          f"difference: {a.get('first_step_loss_max_rel_diff', float('nan')):.2e}"
          + ("" if results["settings"]["no_dropout"] else
             " (dropout on: different random streams, statistical agreement only)"))
    print(f"wrote {pathlib.Path(results['out']) / 'results.json'} and results.md")
    failed = [r["backend"] for r in results["backends"] if r.get("status") == "failed"]
    if failed:
        print(f"failed: {', '.join(failed)} (see the logs in the output directory)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
