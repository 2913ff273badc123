"""Training throughput and whole-run time: `python -m zoo.train` against salesforce/awd-lstm-lm.

    python -m bench.training.reference_throughput --reference /path/to/awd-lstm-lm \
        [--backends tensorflow torch jax] [--threads 1 2] [--repeats 3] \
        [--train-tokens 100000] [--device cpu|gpu] [--out /tmp/throughput] [--no-publish] \
        [--checkout LABEL=PATH ...]

`--reference` is a checkout of the published code (https://github.com/salesforce/awd-lstm-lm,
commit 1d466ec): it is run from there, unmodified, and never copied into this repository.
Two settings make it run on a current PyTorch without editing it: `--cuda` (the flag is
`store_false`, so passing it selects the CPU; `--device gpu` leaves it out) and
`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` (its `torch.load` of the whole pickled model predates
PyTorch 2.6's `weights_only` default).

The configuration (issue 17): AWD-LSTM embedding 200, 3 LSTMs of 400 (the last 200),
tied, batch 20, bptt 35, the PTB command's dropouts (0.4 / 0.25 / 0.4 / 0.1, weight drop
0.5), AR 2 / TAR 1, SGD lr 30, clip 0.25, one epoch on the first `--train-tokens` PTB
training tokens (cut at a line end, so both programs read the same files), validation at
batch 10 after the epoch, the best model's test perplexity at batch 1 on the whole test
split. Both programs read one data folder made here; tflm runs the `awd_lstm_ptb` preset
with the sizes overridden.

Measured per run, each in a fresh process with its thread pools sized to `--threads`
(`tools.frameworks.processes.worker_env`: OMP / MKL / TF / XLA pools; PyTorch reads
OMP_NUM_THREADS) and the process pinned to that many CPUs (`sched_setaffinity`, inherited
by every thread): JAX's CPU client sizes its intra-op pool from the CPUs it may use and
ignores `--xla_cpu_multi_thread_eigen=false`, so before the pinning a "1 thread" JAX run
computed its output layer on both cores (a probe: 87.5 ms for its forward and backward at
batch 20 x 35 with either flag, 147.3 ms pinned to one CPU). Runs interleaved (repeat r
runs every system once before repeat r + 1):

  training words/s   training target tokens / seconds of the training loop, validation
                     excluded. The reference: the sum of its per-batch `ms/batch` lines
                     (`--log-interval 1`; the first line covers batches 0 and 1). tflm:
                     `train_seconds` of `metrics.json`'s epoch (`tflm.callbacks.WordsPerSecond`).
                     JAX compiles the step once per window shape: each run gets an empty
                     compilation cache (`zoo.runtime.compilation_cache`) unless `--warm-jax-cache`.
  whole run          the process's wall time: start-up, data, training, validation, saving,
                     the final evaluation.
  profile            where the whole run went: tflm's `metrics.json` `seconds` (phases of
                     `zoo.runs.training.run`) and the epoch's first-step / validation seconds;
                     start-up = process wall - the run's own total. The reference's
                     training, epoch (training + validation) and the rest.

`--checkout LABEL=PATH` (repeatable) also times tflm as another checkout of it has it (a `git
worktree` of an older commit, say), beside this one and in the same interleaving: each of
`--backends` from PATH's `zoo.train`, labelled with LABEL and PATH's commit. A change of
speed between commits is then told from a change of the machine's.

Medians over `--repeats`. Writes the tables to results/reference_throughput.md beside this
script (`bench.harness.publish`: the latest run only) unless `--no-publish`.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time

from bench.harness import REPO, publish, results_path
from tools.frameworks.processes import worker_env

EMBED, HIDDEN, BATCH, BPTT = 200, 400, 20, 35
REFERENCE_FLAGS = ["--emsize", str(EMBED), "--nhid", str(HIDDEN), "--nlayers", "3",
                   "--batch_size", str(BATCH), "--bptt", str(BPTT), "--dropouti", "0.4",
                   "--dropouth", "0.25", "--seed", "141", "--epochs", "1",
                   "--log-interval", "1"]
TFLM_SETS = [f"model.embed_dim={EMBED}", f"model.hidden_dim={HIDDEN}", f"training.bptt={BPTT}",
             f"training.batch_size={BATCH}"]


def make_data(source, folder, train_tokens):
    """The first `train_tokens` training tokens (<eos> counted, cut after a whole line) and
    the whole valid and test splits of PTB, as train/valid/test.txt in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    lines, count = [], 0
    with open(source / "train.txt") as f:
        for line in f:
            if count >= train_tokens:
                break
            lines.append(line)
            count += len(line.split()) + 1
    (folder / "train.txt").write_text("".join(lines))
    for split in ("valid", "test"):
        shutil.copyfile(source / f"{split}.txt", folder / f"{split}.txt")
    return count


def commit_of(tree):
    """The short commit of the git checkout or worktree at `tree`, or None (a copy without
    `.git`: a parent folder's repository is not asked)."""
    if not (pathlib.Path(tree) / ".git").exists():
        return None
    git = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return git.stdout.strip() or None


def prepare_run(source, out, train_tokens):
    """The output folder `out` (made), its data folder of `make_data`, and the training
    target tokens of one pass at batch `BATCH`."""
    work = pathlib.Path(out)
    work.mkdir(parents=True, exist_ok=True)
    tokens = make_data(source, work / "data", train_tokens)
    return work, work / "data", (tokens // BATCH - 1) * BATCH


def pinned_to(threads):
    """A `preexec_fn` confining the child to the first `threads` CPUs it may use."""
    cpus = sorted(os.sched_getaffinity(0))[:max(1, int(threads))]
    return lambda: os.sched_setaffinity(0, cpus)


def run_process(cmd, env, cwd, log_path, threads):
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              preexec_fn=pinned_to(threads)).returncode
    wall = time.perf_counter() - start
    if code:
        tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
        raise RuntimeError(f"{cmd[:3]} exited with {code} (log {log_path}): {tail}")
    return wall


def run_reference(args, data, work, threads, tag):
    """One reference run; its figures parsed from its log."""
    cwd = work / f"ref_{tag}"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)  # the reference caches its corpus in the working directory
    env = worker_env("torch-native", args.device, threads)
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    log_path = work / f"ref_{tag}.log"
    device_flag = ["--cuda"] if args.device == "cpu" else []  # store_false: --cuda = CPU
    cmd = [sys.executable, "-u", str(pathlib.Path(args.reference).resolve() / "main.py"),
           "--data", str(data), "--save", str(cwd / "model.pt"), *device_flag,
           *REFERENCE_FLAGS]
    wall = run_process(cmd, env, cwd, log_path, threads)
    text = log_path.read_text()
    batch_ms = [float(m) for m in re.findall(r"ms/batch\s+([\d.]+)", text)]
    epoch = float(re.search(r"end of epoch\s+1 \| time:\s+([\d.]+)s", text).group(1))
    valid = float(re.search(r"valid ppl\s+([\d.]+)", text).group(1))
    test = float(re.search(r"test ppl\s+([\d.]+)", text).group(1))
    train_seconds = sum(batch_ms) / 1000.0
    return {"train_seconds": train_seconds, "epoch_seconds": epoch, "wall": wall,
            "median_batch_ms": statistics.median(batch_ms[1:]),
            "valid": valid, "test": test, "batches": len(batch_ms) + 1,
            "profile": {"training loop": train_seconds,
                        "validation": epoch - train_seconds,
                        "start-up, data, model, test, saving": wall - epoch}}


def run_tflm(args, data, work, threads, system, tag):
    """One `zoo.train` run of `system`: a backend, or (backend, checkout label) for
    `--checkout`'s trees."""
    backend, label = system if isinstance(system, tuple) else (system, None)
    root = args.checkouts[label] if label else REPO
    name = f"{backend}_{label}" if label else backend
    out = work / f"{name}_{tag}"
    shutil.rmtree(out, ignore_errors=True)
    env = worker_env(backend, args.device, threads)
    if label:
        env["PYTHONPATH"] = str(root)  # that tree's tflm and zoo, not this one's
    # JAX: a fresh compilation cache per run (every compile counted, as a first run pays
    # them), unless --warm-jax-cache shares one across the runs (what a rerun costs)
    cache = work / ("jax_cache" if args.warm_jax_cache else f"jax_cache_{name}_{tag}")
    if not args.warm_jax_cache:
        shutil.rmtree(cache, ignore_errors=True)
    env["TFLM_JAX_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-m", "zoo.train", "--preset", "awd_lstm_ptb", "--corpus", str(data),
           "--epochs", "1", "--quiet", "--out", str(out)]
    for s in TFLM_SETS:
        cmd += ["--set", s]
    wall = run_process(cmd, env, root, work / f"{name}_{tag}.log", threads)
    metrics = json.loads((out / "metrics.json").read_text())
    epoch, phases = metrics["history"][0], metrics["seconds"]
    first = epoch["first_step_seconds"]
    profile = {"start-up (imports)": wall - phases["total"],
               "data, model build": phases.get("load_data", 0) + phases.get("build", 0),
               "first training step (tracing / compiling)": first,
               "other training steps": epoch["train_seconds"] - first,
               "validation": epoch["validation_seconds"],
               "fit's other work (callbacks, TensorBoard)": phases["fit"] - epoch["train_seconds"]
               - epoch["validation_seconds"],
               "saving": phases.get("save", 0) + phases.get("load_best", 0),
               "final valid evaluation": phases.get("evaluate_valid", 0),
               "final test evaluation": phases.get("evaluate_test", 0)}
    return {"train_seconds": epoch["train_seconds"], "epoch_seconds": epoch["epoch_seconds"],
            "wall": wall, "valid": metrics["valid_perplexity"],
            "test": metrics["test_perplexity"], "profile": profile,
            "words_per_second": metrics["words_per_second"]}


TITLE = (f"Training throughput against salesforce/awd-lstm-lm, AWD-LSTM {EMBED} / {HIDDEN} "
         f"x 3 / {EMBED} tied, batch {BATCH}, bptt {BPTT}")


def command_line(args):
    """The command as the results file shows it (the checkouts' paths left out: a
    `--checkout`'s commit is in its rows)."""
    checkouts = "".join(f" --checkout {c}=TFLM_CHECKOUT" for c in args.checkouts)
    return (f"python -m bench.training.reference_throughput --reference AWD_LSTM_LM_CHECKOUT "
            f"--backends {' '.join(args.backends)} --threads "
            f"{' '.join(map(str, args.threads))} --repeats {args.repeats} --train-tokens "
            f"{args.train_tokens}{' --warm-jax-cache' if args.warm_jax_cache else ''}"
            f"{' --device gpu' if args.device == 'gpu' else ''}{checkouts}")


def report(args, rows, words, load_start, load_end, minutes):
    """The results file's body: the table and where the whole run went."""
    systems = ["reference", *args.backends,
               *((b, c) for c in args.checkouts for b in args.backends)]
    label = {"reference": "salesforce reference (PyTorch, native)",
             "tensorflow": "tflm, TensorFlow", "torch": "tflm, Keras on PyTorch",
             "jax": "tflm, JAX"}
    here = commit_of(REPO)
    for backend, checkout in systems[1 + len(args.backends):]:
        label[backend, checkout] = (f"{label[backend]}, {checkout} "
                                    f"({commit_of(args.checkouts[checkout]) or 'no git'})")
    med = {}
    for (system, threads), runs in rows.items():
        med[system, threads] = {
            "wps": statistics.median(words / r["train_seconds"] for r in runs),
            "wall": statistics.median(r["wall"] for r in runs),
            "valid": statistics.median(r["valid"] for r in runs),
            "test": statistics.median(r["test"] for r in runs),
            "profile": {k: statistics.median(r["profile"][k] for r in runs)
                        for k in runs[0]["profile"]},
            "n": len(runs)}
    lines = [f"Load average (1/5/15 min) at the start: {load_start}; at the end: {load_end}. "
             f"{minutes:.0f} min in all. The reference at commit "
             f"{args.reference_commit or 'unknown'}, run from its own checkout.", "",
             f"One epoch on the first {args.train_tokens:,} PTB training tokens "
             f"({words:,} target tokens a pass at batch {BATCH}), validation at batch 10, test "
             "at batch 1 on the whole split; medians of "
             f"{args.repeats} interleaved runs, each in a fresh process. Training words/s = "
             "training tokens / seconds of the training loop (validation excluded); whole "
             "run = process wall time. Ratios to the reference at the same thread count. JAX "
             f"runs {'share a warm' if args.warm_jax_cache else 'each start with an empty'} "
             "compilation cache." + (f" tflm rows without a label: this checkout, commit "
                                     f"{here or 'unknown'}." if args.checkouts else ""), "",
             "| system | threads | training words/s | vs reference | whole run s | vs reference "
             "| valid ppl | test ppl |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for threads in args.threads:
        ref = med.get(("reference", threads))
        for system in systems:
            m = med.get((system, threads))
            if m is None:
                continue
            ratio_w = f"{m['wps'] / ref['wps']:.2f}x" if ref else "-"
            ratio_t = f"{m['wall'] / ref['wall']:.2f}x" if ref else "-"
            lines.append(f"| {label[system]} | {threads} | {m['wps']:,.0f} | {ratio_w} | "
                         f"{m['wall']:.1f} | {ratio_t} | {m['valid']:.2f} | {m['test']:.2f} |")
    lines += ["", "Where the whole run went (median seconds):", ""]
    for (system, threads), m in sorted(med.items(), key=lambda kv: (kv[0][1],
                                                                   systems.index(kv[0][0]))):
        parts = ", ".join(f"{k} {v:.1f}" for k, v in m["profile"].items())
        lines.append(f"- {label[system]}, {threads} thread(s), {m['wall']:.1f} s: {parts}.")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", required=True,
                   help="a checkout of salesforce/awd-lstm-lm (its main.py is run)")
    p.add_argument("--backends", nargs="*", default=["tensorflow", "torch", "jax"],
                   choices=["tensorflow", "torch", "jax"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-tokens", type=int, default=100_000)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="where both programs train (gpu: the reference with CUDA, tflm on "
                        "the backend's GPU device)")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR", ""),
                   help="folder holding penn/ (default $TFLM_DATA_DIR)")
    p.add_argument("--out", default="/tmp/reference_throughput")
    p.add_argument("--no-reference", action="store_true", help="time tflm only")
    p.add_argument("--reference-commit", default=None,
                   help="the reference's commit, for a copy that is not a git checkout")
    p.add_argument("--warm-jax-cache", action="store_true",
                   help="share one JAX compilation cache across the runs (default: a fresh "
                        "one per run, so each pays its compiles)")
    p.add_argument("--checkout", action="append", default=[], metavar="LABEL=PATH",
                   help="also time tflm from another checkout of it (e.g. a git worktree of "
                        "an older commit), labelled LABEL; repeatable")
    p.add_argument("--results", default=str(results_path(__file__, "reference_throughput.md")))
    p.add_argument("--no-publish", action="store_true")
    args = p.parse_args()
    args.checkouts = {}
    for item in args.checkout:
        label, _, path = item.partition("=")
        if not label or not (pathlib.Path(path) / "zoo" / "train.py").exists():
            p.error(f"--checkout {item}: give LABEL=PATH, PATH a checkout of tflm (no "
                    "zoo/train.py there)")
        args.checkouts[label] = pathlib.Path(path).resolve()
    main_py = pathlib.Path(args.reference) / "main.py"
    if not args.no_reference and not main_py.exists():
        p.error(f"--reference {args.reference}: no main.py there; pass a checkout of "
                "https://github.com/salesforce/awd-lstm-lm")
    source = pathlib.Path(args.data_dir) / "penn"
    if not (source / "train.txt").exists():
        p.error(f"no PTB under {source}: pass --data-dir (the folder holding penn/)")
    if not args.no_reference and args.reference_commit is None:
        args.reference_commit = commit_of(args.reference)
    work, data, words = prepare_run(source, args.out, args.train_tokens)
    load_start = "/".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    rows = {}
    systems = (([] if args.no_reference else ["reference"]) + list(args.backends)
               + [(b, c) for c in args.checkouts for b in args.backends])
    for repeat in range(args.repeats):
        for threads in args.threads:
            for system in systems:
                tag = f"t{threads}_r{repeat}"
                if system == "reference":
                    result = run_reference(args, data, work, threads, tag)
                else:
                    result = run_tflm(args, data, work, threads, system, tag)
                rows.setdefault((system, threads), []).append(result)
                steady = (f" (median batch {result['median_batch_ms']:.1f} ms)"
                          if "median_batch_ms" in result else "")
                name = "@".join(system) if isinstance(system, tuple) else system
                print(f"{name:10s} threads {threads} repeat {repeat}: "
                      f"{words / result['train_seconds']:,.0f} words/s{steady}, whole run "
                      f"{result['wall']:.1f} s, valid {result['valid']:.2f}, test "
                      f"{result['test']:.2f}", flush=True)
                (work / "runs.json").write_text(json.dumps(
                    {f"{s if isinstance(s, str) else '@'.join(s)}|{t}": r
                     for (s, t), r in rows.items()}, indent=1))
    load_end = "/".join(f"{x:.2f}" for x in os.getloadavg())
    table = report(args, rows, words, load_start, load_end,
                   (time.perf_counter() - started) / 60)
    publish(TITLE, table, None if args.no_publish else args.results, command_line(args))


if __name__ == "__main__":
    main()
