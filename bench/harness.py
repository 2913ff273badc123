"""What every benchmark shares: its results file, written with the machine, the date and
the command, and a measurement run in a fresh process of one Keras backend.

A benchmark's results file holds its latest results only (the history is git's):
`publish` rewrites it on every run. Notes on the method written by hand below
`NOTES_MARKER` are kept; a reading of the numbers written by hand above it is not (it would
describe numbers the file no longer holds).
"""

import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys

from tools.frameworks.machine import machine_line

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTES_MARKER = "<!-- notes: kept when the benchmark rewrites this file -->"


def results_path(script, name):
    """The results file `name` (e.g. "lstm_loop.md", "scaling.png") of the benchmark
    module whose `__file__` is `script`: in the `results/` folder beside it."""
    return pathlib.Path(script).resolve().parent / "results" / name


def this_command():
    """The command line of this process as a user types it: `python -m MODULE ARGS`."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([program, *map(shlex.quote, sys.argv[1:])])


def publish(title, body, path, command=None):
    """Print a benchmark's results and make them its results file `path`, replacing what
    the file held: `# title`, a line with the date, the machine (`machine_line`) and the
    command (`command`, default `this_command()`), then `body` (the tables and what they
    need said). `path` None prints only, as a script's `--no-publish` asks. Returns the
    text."""
    text = (f"# {title}\n\n{datetime.date.today().isoformat()}, {machine_line()}. "
            f"Command: `{command or this_command()}`\n\n{body.strip()}\n")
    print(text)
    if path is not None:
        path = pathlib.Path(path)
        notes = ""
        if path.exists():
            old = path.read_text(encoding="utf-8")
            if NOTES_MARKER in old:
                notes = "\n" + old[old.index(NOTES_MARKER):]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + notes, encoding="utf-8")
        print(f"wrote {path}")
    return text


def module_command(module, *args):
    """`python -m module args`: how a benchmark starts a child process of its own module
    (run it with `cwd=REPO`)."""
    return [sys.executable, "-m", module, *map(str, args)]


def run_backend_child(code, backend, threads, payload, timeout=1800):
    """Run `code` (Python source; `sys.argv[1]` holds `payload` as JSON) in a fresh process
    with KERAS_BACKEND=backend on the CPU with `threads` threads, from the repository root.
    Returns `(result, None)`, the JSON the child printed on a line starting "RESULT ", or
    `(None, why)` with the last line of its error output when it printed none."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu", OMP_NUM_THREADS=str(threads),
               PYTHONPATH=str(REPO), TF_NUM_INTRAOP_THREADS=str(threads),
               TF_NUM_INTEROP_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(payload)], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        return None, str(proc.stderr.strip().splitlines()[-1:])
    return json.loads(line[0][len("RESULT "):]), None
