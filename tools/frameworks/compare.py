"""Speed, perplexity and memory of one preset across TensorFlow, JAX, PyTorch and native PyTorch.

    python tools/compare_frameworks.py --preset awd_lstm_mos_ptb \\
        --backends tensorflow,jax,torch,torch-native --steps 50 [--epochs 2] \\
        [--device cpu|gpu] [--precision float32|mixed_bfloat16] [--jit] [--plot] --out DIR

Writes DIR/results.json and DIR/results.md and prints the table. Method:

- **Same start everywhere** (`tools.frameworks.start`). An `init` worker (TensorFlow when
  installed) loads the corpus, batchifies it, cuts the windows of every epoch with
  `tflm.data.window_starts` (the rule of `lm_windows` / `lm_dataset`), builds the preset's
  `zoo.AWDLSTM` and saves its weights by role (`tools.frameworks.roles`: embedding,
  lstm{i}.kernel, ..., head.latent_kernel) and the data to DIR/*.npz. Every backend then
  runs in its own process (Keras picks its backend at import) and loads those weights (the
  native model maps them by role: transposes, b_hh = 0), so parameter counts, data, batch
  order, seeds and number of steps are the same. The preset and `--set` are resolved as
  `python -m zoo.train` resolves them (`zoo.runs.config`).
- **Keras backends** (tensorflow, jax, torch; `tools.frameworks.keras_runner`) train with
  `model.fit` on the library's own path: `LanguageModel`'s train step (NLL + AR/TAR,
  global-norm clip, L2, T/bptt), carried LSTM state, `tflm.optimizers.SGD`; the windows come
  from `tflm.data` (`lm_dataset` on TensorFlow, a `keras.utils.PyDataset` of `lm_windows`
  on JAX / PyTorch), padded to a multiple of 4 positions on JAX (`--pad-to-multiple`) and
  run, as `zoo.train` runs them, at lengths compiled already: nearly every training window
  at one length (`--compiled-lengths auto`, `zoo.runs.builders.set_window_shapes`; `each`: one
  compile per padded length). The padding is masked and its cost is part of the measured
  speed. `--lstm-kernel` selects the LSTM kernel (the model's
  `use_cudnn`); the table says which ran. **torch-native** (`tools.frameworks.torch_native`,
  `native_runner`) is plain PyTorch, `torch.lstm` with the weight-dropped matrix,
  global-norm clipping, `torch.optim.SGD` (the salesforce/awd-lstm-lm loop).
- **Speed** (`tools.frameworks.timing`). Words/s of one step = B * T / wall time of that
  step, ending with a blocking fetch of the loss; reported as the median over the steps
  after `--warmup` steps ("train words/s"), and the median over the steps that did not
  (re)trace or compile ("steady"; TensorFlow and JAX retrace per new window shape, counted
  by `model.traced_steps`); "end-to-end" = all tokens of the timed steps / their total time,
  warm-up and compiles included. Every step's own loss is recorded (the Keras step logs it
  with `model.log_window_values`). Evaluation words/s: one timed pass over the
  validation windows (`--eval-windows`, default all) after a warm-up pass on the first and
  last window shapes.
- **Perplexity** on the validation split after the same steps (and after each of
  `--epochs` full epochs, from the same initial weights, with the training wall time; the
  figure `--plot` draws validation perplexity against that time for every backend).
- **Memory.** Peak GPU allocator memory on a GPU, else the worker's peak RSS (`ru_maxrss`):
  the whole process's, framework runtime included (Keras and its backend's libraries, with
  their thread pools: ~500 MiB for Keras on PyTorch before any model exists), plus what
  glibc keeps under `--malloc keep`. The table adds what the
  run itself added ("run +N": peak RSS - RSS after the imports, before data and model;
  `peak_rss_added_mib`, with `rss_after_imports_mib` and `rss_after_build_mib`, in the
  JSON). Gigabytes of peak RSS for a model of 0.2 M parameters are the runtimes and the
  activations of the step (B x T x V log-probabilities and their gradients), not the
  weights.
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
reason; when no requested backend's package is installed, the command stops with a one-line
error before it prepares anything. Importable: `run(argv)` returns the results dict;
`tools.frameworks.report` has `format_table`, `markdown`, `plot_curves`, `flops_per_token`.
"""

import argparse
import concurrent.futures
import datetime
import os
import pathlib
import platform
import shlex
import sys

from tools.frameworks.machine import cpu_model, memory_gib
from tools.frameworks.processes import (BACKENDS, backend_available, pick_init_backend,
                                        run_worker)
from tools.frameworks.report import (agreement, flops_per_token, format_table, markdown,
                                     plot_curves)
from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.user_errors import check_output_dir, one_line_errors
from zoo.runs.config import resolve_config as resolve_preset

DROPOUTS = ("dropout", "dropout_h", "dropout_i", "dropout_e", "weight_dropout")
_USE_CUDNN = {"auto": "auto", "fused": True, "portable": False}


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
    p.add_argument("--compiled-lengths", choices=["auto", "each"], default="auto",
                   help="JAX: auto (default) runs a window padded to a length compiled "
                        "already, nearly every training window at one length, as python -m "
                        "zoo.train does; each: one compiled step per padded length")
    p.add_argument("--lstm-kernel", choices=["auto", "fused", "portable"], default="auto",
                   help="Keras backends: the LSTM kernel (the model's use_cudnn): auto "
                        "(default; fused where the backend has one), fused (cuDNN on a GPU, "
                        "PyTorch's oneDNN kernel on a CPU; an error where none), portable "
                        "(the keras.ops loop)")
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


def resolve_config(preset, overrides=(), no_dropout=False, lstm_kernel="auto"):
    """The preset with `--set` overrides, as `python -m zoo.train` resolves it
    (`zoo.runs.config`), then every dropout 0 (`no_dropout`) and the LSTM kernel."""
    config = resolve_preset(preset, overrides)
    config["preset"] = pathlib.Path(str(preset)).stem
    # The native peer (torch_native) has one trained LSTM bias, as Keras: a reproduction
    # preset's PyTorch parametrization (lstm_biases=2) is compared in that form here; parity
    # with the reference code itself is tests/zoo/runs/test_reference_parity.py's job.
    zaremba = config["model"].get("kind") == "zaremba"  # the PTB tutorial's model
    if not zaremba:
        config["model"]["lstm_biases"] = 1
    if no_dropout:
        for key in (("dropout",) if zaremba else DROPOUTS):
            config["model"][key] = 0.0
        if isinstance(config["model"].get("head"), dict) and \
                "latent_dropout" in config["model"]["head"]:
            config["model"]["head"]["latent_dropout"] = 0.0
    if lstm_kernel != "auto":
        config["model"]["use_cudnn"] = _USE_CUDNN[lstm_kernel]
    return config


def _machine():
    cpu, mem = cpu_model(), memory_gib()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "memory_gib": mem, "python": platform.python_version(),
            "load_average_start": [round(x, 2) for x in load] if load else None}


def _check(args):
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
    return names


def run(argv=None):
    """Run the comparison; returns the results dict (also written to OUT/results.json)."""
    args = build_parser().parse_args(argv)
    names = _check(args)
    config = resolve_config(args.preset, args.set, args.no_dropout, args.lstm_kernel)
    out = pathlib.Path(args.out)
    check_output_dir(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    common = {
        "config": config, "steps": args.steps, "warmup": args.warmup, "epochs": args.epochs,
        "device": args.device, "precision": args.precision, "jit": args.jit,
        "eval_windows": args.eval_windows, "window_lengths": args.window_lengths,
        "pad_to_multiple": args.pad_to_multiple, "compiled_lengths": args.compiled_lengths,
        "threads": args.threads, "malloc": args.malloc, "data_dir": args.data_dir,
        "data_path": str(out / "data.npz"),
        "weights_path": str(out / "init_weights.npz"), "save_weights": args.save_weights,
    }
    available = {name: backend_available(name) for name in names}
    if not any(ok for ok, _ in available.values()):
        raise UserError("none of --backends can run here (" + "; ".join(
            f"{name}: {reason}" for name, (_, reason) in available.items())
            + "); install one of them, or name one that is installed.")
    init_backend = pick_init_backend()
    if init_backend is None:
        raise UserError("no Keras backend (tensorflow, jax or torch) is installed; the "
                        "initial weights come from the Keras model.")
    init = run_worker(dict(common, phase="init", backend=init_backend,
                           result_path=str(out / "result_init.json")), out, args.timeout)
    if init.get("status") != "ok":
        raise UserError(f"could not prepare the initial weights and data on "
                        f"{init_backend}: {init.get('reason')} (log: {out / 'logs'})")

    def one(name):
        ok, reason = available[name]
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
                                            "window_lengths", "pad_to_multiple",
                                            "compiled_lengths", "threads", "malloc")}
        | {"no_dropout": args.no_dropout, "lstm_kernel": args.lstm_kernel},
        "out": str(out), "init": init, "flops": flops, "backends": rows,
        "agreement": agreement(rows, init),
    }
    atomic_files.write_json(out / "results.json", results, indent=1)
    atomic_files.write_text(out / "results.md", markdown(results))
    if args.plot:
        results["plot"] = plot_curves(results, out / "valid_perplexity_vs_time.png")
    return results


@one_line_errors("compare_frameworks")
def main(argv=None):
    """The command line; returns 0, 1 when a backend failed, 2 after a one-line error
    (`zoo.runtime.user_errors`)."""
    results = run(argv)
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
