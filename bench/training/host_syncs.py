"""What a Keras-on-PyTorch training step asks of the host: reads back and copies in.

    python -m bench.training.host_syncs [--preset awd_lstm_ptb] [--set KEY=VALUE ...] \\
        [--steps 3] [--base PATH] [--no-publish]

On a GPU, PyTorch waits for every kernel queued on the stream before it reads a value back
to the host or copies host data in with a blocking copy. Each such wait stops the host
from running ahead of the GPU, so a host-bound step (bench/results/gpu_session.md: Keras
on PyTorch at 0.48x main.py, about 800 kernels a step) pays for each one. This counts them
on the CPU, where the step runs the same ops:

  read     a value back to the host: aten::_local_scalar_dense (`item()`, `int()`,
           `bool()` of a tensor), and the Python-level `Tensor.numpy`, `Tensor.cpu` and
           `Tensor.tolist` (which a CPU tensor serves without an op)
  copy in  a tensor made of host data: aten::lift_fresh (`torch.as_tensor` of a number
           or array; on a GPU, a copy to the device follows)

each marked "worker thread" where it happens off the main thread (Keras runs async-safe
callbacks' batch hooks there: a wait there does not hold up the next step's dispatch), per
step, by call site (the innermost frames of tflm, zoo and Keras). The model is the one
`python -m zoo.train` builds for the preset (`zoo.runs.builders`), compiled with its
optimizer and trained by `model.fit` on in-memory windows of bptt random tokens
(`tools.frameworks.keras_runner.PresetFit`), so the fit loop's own work (the batch, the
metrics) is counted too. `--base PATH` also counts another checkout of tflm (a `git
archive` of an older commit: its `tflm` and `zoo`, with this tree's `tools`), for an A/B in
one table. Each tree runs in a fresh process. Writes results/host_syncs.md unless
`--no-publish`.
"""

import argparse
import collections
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import threading
import traceback

from bench.harness import REPO, publish, results_path

FRAMES = ("/tflm/", "/zoo/", "/keras/src/")
PYTHON_READS = ("numpy", "cpu", "tolist")  # item(): aten::_local_scalar_dense already


def call_site(depth=4):
    """The innermost `depth` frames of tflm, zoo or Keras on the stack, innermost first."""
    frames = [f for f in traceback.extract_stack()[:-2]
              if any(part in f.filename for part in FRAMES)]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in reversed(frames[-depth:]))


def _short(filename):
    for part in FRAMES:
        if part in filename:
            return part.strip("/").split("/")[-1] + "/" + filename.split(part, 1)[1]
    return filename


def _kind(kind):
    """`kind`, marked where it happens off the main thread (Keras' worker thread runs
    async-safe callbacks' batch hooks: a wait there does not hold up the next step's
    dispatch)."""
    return kind if threading.current_thread() is threading.main_thread() else (
        kind + ", worker thread")


def count(run, steps):
    """`{(kind, site): calls}` while `run(steps)` trains `steps` steps."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = collections.Counter()

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name == "_local_scalar_dense":
                seen[_kind("read"), call_site()] += 1
            elif name == "lift_fresh":
                seen[_kind("copy in"), call_site()] += 1
            return func(*args, **(kwargs or {}))

    originals = {name: getattr(torch.Tensor, name) for name in PYTHON_READS}

    def counted(name):
        def method(self, *args, **kwargs):
            seen[_kind("read"), f"Tensor.{name}: " + call_site()] += 1
            return originals[name](self, *args, **kwargs)
        return method

    for name in PYTHON_READS:
        setattr(torch.Tensor, name, counted(name))
    try:
        with Counting():
            run(steps)
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    return seen


def measure(args):
    """The counts of `--steps` fit steps after one warm-up fit step."""
    if args.tree:
        sys.path.insert(0, str(pathlib.Path(args.tree).resolve()))
    os.environ["KERAS_BACKEND"] = "torch"
    import keras  # deferred: after the backend and the tree are chosen

    from tools.frameworks.keras_runner import PresetFit
    from zoo.runs.config import resolve_config
    from zoo.runs.settings import RunSettings

    if keras.backend.backend() != "torch":
        raise SystemExit("Keras was imported on another backend before this script")
    run = PresetFit(RunSettings.from_config(resolve_config(args.preset, list(args.set))),
                    args.vocab, args.steps + 1)
    run(1)
    import tflm  # deferred: the tree's, after sys.path was set
    return count(run, args.steps), pathlib.Path(tflm.__file__).parents[1]


def child(args):
    """Count one tree (this process: Keras not imported yet) and write the JSON."""
    seen, tree = measure(args)
    pathlib.Path(args.child).write_text(json.dumps(
        {"tree": str(tree), "counts": [[kind, site, calls] for (kind, site), calls in
                                       seen.items()]}))


def run_tree(args, tree, out):
    """`{"tree", "counts"}` of `tree` (None: this one), counted in a fresh process."""
    cmd = [sys.executable, "-m", "bench.training.host_syncs", "--child", str(out),
           "--preset", args.preset, "--vocab", str(args.vocab), "--steps", str(args.steps),
           *[a for s in args.set for a in ("--set", s)], *(["--tree", tree] if tree else [])]
    env = dict(os.environ, KERAS_BACKEND="torch", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"counting {tree or 'this tree'} failed:\n{proc.stderr[-3000:]}")
    return json.loads(pathlib.Path(out).read_text())


def report(results, steps):
    """`results`: [(label, {"tree", "counts"})]; the totals side by side, then each site
    (its Python frames: `call_site`)."""
    totals = {label: collections.Counter() for label, _ in results}
    sites = collections.defaultdict(dict)
    for label, result in results:
        for kind, site, calls in result["counts"]:
            totals[label][kind] += calls
            sites[kind, site][label] = calls
    labels = [label for label, _ in results]
    lines = [f"One `model.fit` of {steps} steps, counted after a warm-up step, per step (a "
             "fit's once-per-call work, its metrics' reset and the data iterator's set-up, "
             "shows as a fraction).", "",
             "| kind | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
    kinds = sorted({kind for counts in totals.values() for kind in counts})
    lines += [f"| {kind} | " + " | ".join(f"{totals[label][kind] / steps:.1f}"
                                         for label in labels) + " |" for kind in kinds]
    lines += ["", "| kind | call site (innermost first) | " + " | ".join(labels) + " |",
              "| --- | --- |" + " ---: |" * len(labels)]
    for (kind, site), calls in sorted(sites.items(), key=lambda kv: -max(kv[1].values())):
        lines.append(f"| {kind} | `{site}` | " + " | ".join(
            f"{calls.get(label, 0) / steps:.1f}" for label in labels) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="awd_lstm_ptb")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--vocab", type=int, default=10000, help="vocabulary size (PTB's)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--base", help="another checkout of tflm to count beside this one")
    p.add_argument("--out", default=None, help="folder for the counts (default: a new one)")
    p.add_argument("--no-publish", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--tree", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.base and not (pathlib.Path(args.base) / "zoo" / "train.py").is_file():
        p.error(f"--base {args.base}: not a checkout of tflm (no zoo/train.py there)")
    if args.child:
        return child(args)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="host-syncs-"))
    out.mkdir(parents=True, exist_ok=True)
    from bench.training.reference_throughput import commit_of
    results = [(f"this tree ({commit_of(REPO) or 'no git'})",
                run_tree(args, None, out / "this.json"))]
    if args.base:
        base = pathlib.Path(args.base).resolve()
        results.append((f"base ({commit_of(base) or base.name})",
                        run_tree(args, str(base), out / "base.json")))
    words = [a if a != args.base else "BASE_TREE" for a in (sys.argv[1:] if argv is None
                                                            else argv)]
    publish(f"Host reads and copies of a Keras-on-PyTorch training step: {args.preset}",
            report(results, args.steps),
            None if args.no_publish else results_path(__file__, "host_syncs.md"),
            "python -m bench.training.host_syncs " + shlex.join(words))
    return results


if __name__ == "__main__":
    main()
