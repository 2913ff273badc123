"""What the reproductions share: running their zoo.train / tools commands and showing them.

`sh` runs one command with its output appended to the driver's log; `train_cmd` is a
`python -m zoo.train --preset` run, `train_and_export` one run of a driver with its Q_theta,
`rank_reports` the ranks of the exported matrices; `display` and `minutes_text` show them in
a results file.
"""

import json
import os
import shlex
import subprocess
import sys
import time

from bench.harness import REPO


def sh(cmd, log):
    """Run a command (env: quiet TensorFlow), append its output to `log`; seconds taken."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    start = time.perf_counter()
    with open(log, "a") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"  exit {proc.returncode} after {seconds:.0f} s (see {log})", flush=True)
    else:
        print(f"  {seconds:.0f} s", flush=True)
    return proc.returncode, seconds


def display(cmd):
    """A command as a results file shows it (`python` for this interpreter's path)."""
    text = " ".join(shlex.quote(c) for c in cmd)
    return text.replace(sys.executable, "python")


def minutes_text(seconds):
    """A run's minutes for a table ("reused": made by an earlier invocation)."""
    return "reused" if seconds is None else f"{seconds / 60:.1f}"


def preset(name):
    """The preset `name`'s JSON (its `published` figures, for the tables)."""
    return json.loads((REPO / "zoo" / "presets" / f"{name}.json").read_text())


def train_cmd(out, preset_name, epochs, sets, seed=None, init=None):
    """`python -m zoo.train --preset preset_name` into `out` with `--set` overrides `sets`."""
    cmd = [sys.executable, "-m", "zoo.train", "--preset", preset_name, "--out", str(out),
           "--epochs", str(epochs), "--quiet"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if init is not None:
        cmd += ["--init-from", str(init)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def train_and_export(args, out, log, name, cmd, qmatrix_args):
    """One run of a driver: train it with `cmd` unless `--only` leaves it out or `--reuse`
    finds its metrics.json, then export its best model's Q_theta (`tools.qmatrix` with
    `qmatrix_args`) unless `--no-q` names it or `--reuse` finds the file. Returns
    {seconds, q, metrics}, {error} when zoo.train failed, or None when the run is absent."""
    run = out / name
    selected = args.only is None or name in args.only
    seconds = None
    if selected and not (args.reuse and (run / "metrics.json").exists()):
        code, seconds = sh(cmd, log)
        if code != 0:
            return {"error": f"zoo.train exit {code}"}
        (run / "seconds.txt").write_text(f"{seconds:.1f}\n")
    if not (run / "metrics.json").exists():
        return None
    if seconds is None and (run / "seconds.txt").exists():
        seconds = float((run / "seconds.txt").read_text())
    q = out / f"q_{name}.npy"
    if selected and name not in args.no_q and not (args.reuse and q.exists()):
        start = time.perf_counter()
        sh([sys.executable, "-m", "tools.qmatrix", str(run / "best.keras"), *qmatrix_args,
            "--out", str(q)], log)
        (out / f"q_{name}.seconds").write_text(f"{time.perf_counter() - start:.1f}\n")
    return dict(seconds=seconds, q=q if q.exists() else None,
                metrics=json.loads((run / "metrics.json").read_text()))


def rank_reports(out, log, rows):
    """`tools.rank` over the rows' exported Q_theta: {row name: its rank report}."""
    with_q = [r for r in rows if r.get("q") is not None]
    if not with_q:
        return {}
    ranks_json = out / "ranks.json"
    sh([sys.executable, "-m", "tools.rank", *[str(r["q"]) for r in with_q], "--labels",
        *[r["name"] for r in with_q], "--json", str(ranks_json)], log)
    if not ranks_json.exists():
        return {}
    return {rep["label"]: rep for rep in json.loads(ranks_json.read_text())["reports"]}
