"""What running trials on the study engine (Ray Tune, `zoo.studies.engine`) costs against
running `python -m zoo.train` for each trial directly, one after another.

    python -m bench.studies.engine_overhead [--trials 4] [--workers 1 2] [--work DIR]

The same tiny trials (the synthetic preset, `--set` as below, seeds 1..N, one epoch) run
three ways, side by side in one run:

- direct: `python -m zoo.train` once per trial, one after another (a process each, as a
  shell loop over seeds would run them);
- `python -m zoo.study FILE --workers W` for each W of `--workers`: a study with the same
  trials as its paper scale, on a local Ray cluster that the command starts and stops.

Per mode: the whole wall time, seconds per trial, and the ratio to direct. With one worker
the difference is the engine's cost (Ray's start, Tune's bookkeeping, the study's table and
figure; a worker process is reused from trial to trial); with more workers, what running
trials side by side gains on this machine's cores.

`--busy B` runs direct and the one-worker study again beside B processes that keep a core
busy each (as a test run, a second study or an editor's indexer would), and the study once
more at Ray's default worker priority (niceness 15, which `zoo.studies.engine` replaces by
the driver's on a local cluster): the A/B of that choice. Writes
results/engine_overhead.md.
"""

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from bench.harness import REPO, publish, results_path
from zoo.studies.engine import NICENESS_ENV as NICENESS

TINY = {"corpus.train_tokens": 20000, "corpus.valid_tokens": 2000,
        "corpus.test_tokens": 2000, "model.embed_dim": 32, "model.hidden_dim": 32,
        "training.batch_size": 16, "training.bptt": 20, "training.epochs": 1}


def timed(command, env=None):
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


@contextlib.contextmanager
def busy(count):
    """`count` processes spinning on a core each while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(count)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--busy", type=int, default=0, metavar="B",
                   help="also time direct and one worker beside B busy processes")
    p.add_argument("--work", type=pathlib.Path)
    p.add_argument("--no-publish", action="store_true")
    args = p.parse_args(argv)
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="engine-overhead-"))
    seeds = list(range(1, args.trials + 1))
    study = work / "tiny_study.json"
    work.mkdir(parents=True, exist_ok=True)
    study.write_text(json.dumps({
        "description": "tiny synthetic trials", "reproduces": "nothing (a benchmark)",
        "arms": {"tiny": {"preset": "synthetic", "set": TINY}}, "seeds": seeds,
        "metrics": ["test_perplexity"]}))

    def run_direct():
        total = 0.0
        for seed in seeds:
            out = work / "direct" / f"seed{seed}"
            shutil.rmtree(out, ignore_errors=True)
            total += timed([sys.executable, "-m", "zoo.train", "--preset", "synthetic",
                            "--seed", str(seed), "--out", str(out), "--quiet",
                            *[a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]])
        return total

    def run_study(workers, env=None):
        out = work / f"study-{workers}"
        shutil.rmtree(out, ignore_errors=True)
        return timed([sys.executable, "-m", "zoo.study", str(study), "--out", str(out),
                      "--workers", str(workers)], env)

    def worker_text(workers):
        return f"{workers} worker{'s' * (workers != 1)}"

    rows = [("direct: python -m zoo.train per trial, one after another", "direct",
             run_direct())]
    rows += [(f"python -m zoo.study on Ray Tune, {worker_text(w)}", "direct", run_study(w))
             for w in args.workers]
    if args.busy:
        beside = f"beside {args.busy} busy process{'es' * (args.busy != 1)}"
        with busy(args.busy):
            rows.append((f"direct, {beside}", "busy", run_direct()))
            rows.append((f"python -m zoo.study, 1 worker, {beside}", "busy", run_study(1)))
            rows.append((f"the same at Ray's default worker priority ({NICENESS}=15)", "busy",
                         run_study(1, dict(os.environ, **{NICENESS: "15"}))))
    base = {kind: next(wall for _, k, wall in rows if k == kind) for _, kind, _ in rows}
    lines = ["| mode | trials | wall s | s per trial | vs direct alike |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {mode} | {args.trials} | {wall:.1f} | {wall / args.trials:.1f} | "
              f"{wall / base[kind]:.2f}x |" for mode, kind, wall in rows]
    body = ("\n".join(lines) + "\n\nEach trial: the synthetic preset with "
            + ", ".join(f"{k}={v}" for k, v in TINY.items())
            + "; the study's wall time includes Ray's start and stop, its table and figure. "
            "'vs direct alike': against direct under the same load (alone, or beside the "
            "busy processes).")
    publish("The study engine's cost per trial against zoo.train run directly", body,
            None if args.no_publish else results_path(__file__, "engine_overhead.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
