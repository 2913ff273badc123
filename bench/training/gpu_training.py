"""Training on a GPU: tflm's Keras backends and its PyTorch peer against salesforce/awd-lstm-lm.

    python -m bench.training.gpu_training --reference /path/to/awd-lstm-lm \
        [--backends jax,torch,torch-native] [--repeats 1] [--steps 120] [--warmup 10] \
        [--device gpu] [--out /tmp/gpu_training] [--no-publish]

Issue 17's configuration (`bench.training.reference_throughput`: AWD-LSTM 200 / 400 x 3 /
200 tied, batch 20, bptt 35, the PTB command's dropouts, SGD lr 30, clip 0.25), on the GPU
where the published code would run with CUDA. `python -m zoo.train` reads its windows with
`tf.data`, and the GPU image this was written for has PyTorch and JAX but no TensorFlow, so
tflm is timed by `tools/compare_frameworks.py` instead: the same model and train step
(`LanguageModel.train_step`, `model.fit`), `--steps` training windows of the preset's random
lengths, the first `--warmup` left out.

Per system, the median step: the reference's `ms/batch` lines (`--log-interval 1`; its first
line covers two batches and is left out), tflm's per-step timer (a step that traced or
compiled is left out; it is counted in "first steps s"). Words/s at the median step =
the mean window's tokens / the median step. Runs alternate: the reference, then each tflm
backend, `--repeats` times; medians over the repeats. Writes the table to
results/gpu_training.md beside this script (`bench.harness.publish`) unless `--no-publish`;
`--report OUT/runs.json` prints it again from the results file a run wrote
(results/gpu_training.json is the H200 run's).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from bench.harness import REPO, publish, results_path
from bench.training import reference_throughput as throughput
from tools.frameworks.machine import machine_line

SETS = [f"model.embed_dim={throughput.EMBED}", f"model.hidden_dim={throughput.HIDDEN}",
        f"training.bptt={throughput.BPTT}", f"training.batch_size={throughput.BATCH}"]
LABEL = {"reference": "salesforce reference (PyTorch, native)",
         "jax": "tflm, JAX", "torch": "tflm, Keras on PyTorch",
         "torch-native": "tflm's PyTorch peer (tools/frameworks)",
         "tensorflow": "tflm, TensorFlow"}


def reference_run(args, data, work, tag, words):
    """One reference run (`bench_reference_throughput.run_reference`): its median batch."""
    result = throughput.run_reference(args, data, work, args.threads, tag)
    return {"median_step_ms": result["median_batch_ms"],
            "tokens_per_step": words / result["batches"], "first_steps_s": None,
            "loop_words_per_s": words / result["train_seconds"], "valid": result["valid"],
            "wall": result["wall"], "memory_mib": None}


def tflm_runs(args, work, tag):
    """One `compare_frameworks` run over `args.backends`; a row per backend."""
    out = work / f"frameworks_{tag}"
    cmd = [sys.executable, "-m", "tools.compare_frameworks", "--preset",
           "awd_lstm_ptb", "--backends", args.backends, "--device", args.device,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--eval-windows", "20",
           "--data-dir", str(args.data_dir), "--out", str(out), "--timeout", str(args.timeout)]
    for s in SETS:
        cmd += ["--set", s]
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    rows = {}
    for b in json.loads((out / "results.json").read_text())["backends"]:
        if b.get("status") != "ok":
            print(f"{b['backend']}: {b.get('status')} (log {b.get('log')})", flush=True)
            continue
        traced = b.get("step_traced") or [False] * len(b["step_times_s"])
        steady = [t for i, (t, tr) in enumerate(zip(b["step_times_s"], traced))
                  if i >= b["warmup"] and not tr]
        first = [t for i, (t, tr) in enumerate(zip(b["step_times_s"], traced)) if i == 0 or tr]
        rows[b["backend"]] = {
            "median_step_ms": 1e3 * statistics.median(steady),
            "tokens_per_step": statistics.mean(b["step_tokens"]),
            "first_steps_s": sum(first), "traces": b.get("train_traces"),
            "loop_words_per_s": None, "valid": b["valid_perplexity_after_steps"],
            "wall": b.get("process_wall_s"), "memory_mib": b.get("peak_memory_mib"),
            "memory_kind": b.get("memory_kind"), "device": b.get("device"),
            "kernel": f"{b.get('lstm_kernel')} (cuDNN {b.get('cudnn')}), {b.get('jit')}"}
    return rows


def title(args):
    where = "a GPU" if args.device == "gpu" else "the CPU"
    return (f"Training on {where} against salesforce/awd-lstm-lm, AWD-LSTM {throughput.EMBED} "
            f"/ {throughput.HIDDEN} x 3 / {throughput.EMBED} tied, batch {throughput.BATCH}, "
            f"bptt {throughput.BPTT}")


def command_line(args):
    """The command as the results file shows it (the reference's checkout left out)."""
    return (f"python -m bench.training.gpu_training --reference AWD_LSTM_LM_CHECKOUT "
            f"--backends {args.backends} --repeats {args.repeats} --steps {args.steps} "
            f"--warmup {args.warmup} --device {args.device}")


def report(args, runs, minutes, device_name, host=None):
    """The results file's body: the device, the table, the reference's whole run."""
    med = {}
    for system, rs in runs.items():
        step = statistics.median(r["median_step_ms"] for r in rs)
        tokens = statistics.mean(r["tokens_per_step"] for r in rs)
        med[system] = {"step": step, "wps": tokens / step * 1e3, "rows": rs}
    ref = med.get("reference")
    lines = [f"Device: {device_name}; host: {host or machine_line()}. {minutes:.0f} min in all. "
             f"The reference at commit {args.reference_commit or 'unknown'}.", "",
             "Median step over the timed steps (the reference: its `ms/batch` lines; tflm: "
             f"`tools/compare_frameworks.py`, {args.steps} windows, the first {args.warmup} "
             "and any that traced left out), medians of "
             f"{args.repeats} alternating run(s). Words/s = mean window tokens / median step. "
             "First steps s: the steps that traced or compiled (JAX: a program per window "
             "length it ran at).", "",
             "| system | median step ms | words/s | vs reference | first steps s | valid ppl "
             "after | peak memory MiB | LSTM kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for system in ["reference", *args.backends.split(",")]:
        m = med.get(system)
        if m is None:
            continue
        r = m["rows"][0]
        ratio = f"{m['wps'] / ref['wps']:.2f}x" if ref else "-"
        first = ("-" if r["first_steps_s"] is None else
                 f"{statistics.median(x['first_steps_s'] for x in m['rows']):.1f}")
        memory = ("-" if r["memory_mib"] is None else
                  f"{r['memory_mib']:,.0f} ({r['memory_kind']})")
        valid = statistics.median(x["valid"] for x in m["rows"])
        kernel = r.get("kernel", "torch.nn.LSTM (cuDNN on a GPU) under its WeightDrop")
        lines.append(f"| {LABEL.get(system, system)} | {m['step']:.2f} | {m['wps']:,.0f} | "
                     f"{ratio} | {first} | {valid:,.1f} | {memory} | {kernel} |")
    if ref:
        loop = statistics.median(r["loop_words_per_s"] for r in ref["rows"])
        wall = statistics.median(r["wall"] for r in ref["rows"])
        lines += ["", f"The reference's whole training loop (its first batches included) ran "
                      f"at {loop:,.0f} words/s; its whole run (start-up, one epoch, "
                      f"validation, test at batch 1) took {wall:.1f} s. The valid ppl after "
                      f"tflm's steps is over 20 validation windows after {args.steps} "
                      "steps, the reference's over the whole split after its epoch: a check "
                      "that training moved, not a comparison."]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", help="a checkout of salesforce/awd-lstm-lm (required to run)")
    p.add_argument("--reference-commit", default=None)
    p.add_argument("--backends", default="jax,torch,torch-native")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=16,
                   help="host threads (and CPUs pinned) of the reference process")
    p.add_argument("--train-tokens", type=int, default=100_000)
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--timeout", type=int, default=300, help="seconds per tflm backend")
    p.add_argument("--data-dir", default=None, help="folder holding penn/")
    p.add_argument("--out", default="/tmp/gpu_training")
    p.add_argument("--results", default=str(results_path(__file__, "gpu_training.md")))
    p.add_argument("--no-publish", action="store_true")
    p.add_argument("--report", metavar="RUNS_JSON",
                   help="print the table of an earlier run's runs.json (nothing is run)")
    if "--report" in sys.argv:  # the table again, from the file a run wrote
        saved = json.loads(pathlib.Path(p.parse_args().report).read_text())
        args = argparse.Namespace(**saved["settings"])
        print(f"# {title(args)}\n\n{saved['date']}.\n")
        print(report(args, saved["runs"], saved["minutes"], saved["device"], saved["host"]))
        return
    args = p.parse_args()
    args.data_dir = pathlib.Path(args.data_dir or os.environ.get("TFLM_DATA_DIR", "")).resolve()
    source = args.data_dir / "penn"
    if not (source / "train.txt").exists():
        p.error(f"no PTB under {source}: pass --data-dir (the folder holding penn/)")
    if not args.reference or not (pathlib.Path(args.reference) / "main.py").exists():
        p.error(f"--reference {args.reference}: no main.py there; pass a checkout of "
                "https://github.com/salesforce/awd-lstm-lm")
    if args.reference_commit is None:
        args.reference_commit = throughput.commit_of(args.reference)
    work, data, words = throughput.prepare_run(source, args.out, args.train_tokens)
    started = time.perf_counter()
    runs, device_name = {}, args.device
    for repeat in range(args.repeats):
        result = reference_run(args, data, work, f"r{repeat}", words)
        runs.setdefault("reference", []).append(result)
        print(f"reference repeat {repeat}: median step {result['median_step_ms']:.2f} ms",
              flush=True)
        for backend, row in tflm_runs(args, work, f"r{repeat}").items():
            runs.setdefault(backend, []).append(row)
            device_name = row.get("device") or device_name
            print(f"{backend} repeat {repeat}: median step {row['median_step_ms']:.2f} ms, "
                  f"first steps {row['first_steps_s']:.1f} s", flush=True)
    minutes, date = (time.perf_counter() - started) / 60, time.strftime("%Y-%m-%d")
    settings = {k: getattr(args, k) for k in ("backends", "repeats", "steps", "warmup",
                                              "device", "reference_commit")}
    (work / "runs.json").write_text(json.dumps(
        {"settings": settings, "device": device_name, "host": machine_line(),
         "minutes": minutes, "date": date, "runs": runs}, indent=1))
    table = report(args, runs, minutes, device_name)
    publish(title(args), table, None if args.no_publish else args.results, command_line(args))


if __name__ == "__main__":
    main()
