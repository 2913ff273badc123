"""What machine a measurement ran on (CPU model, memory), publishing a results table, and
running a measurement in a fresh process of one Keras backend."""

import json
import os
import pathlib
import platform
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def _proc_field(path, prefix):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model():
    """The CPU model name from /proc/cpuinfo (platform's guess elsewhere)."""
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown CPU"


def memory_gib():
    """Total memory in GiB from /proc/meminfo, or None."""
    total = _proc_field("/proc/meminfo", "MemTotal:")
    return None if total is None else round(int(total.split()[0]) / 2**20, 1)


def machine_line():
    """One line: CPU model, cores, memory."""
    mem = memory_gib()
    return f"{cpu_model()}, {os.cpu_count()} cores" + (f", {mem} GiB" if mem else "")


def publish(table, results_path):
    """Print a results table and append it to the results file (None: print only, as a
    script's `--no-publish` asks)."""
    print(table)
    if results_path is not None:
        with open(results_path, "a") as f:
            f.write("\n" + table)


def peak_rss_mib():
    """This process's peak resident memory so far, MiB (Linux ru_maxrss)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    """This process's resident memory now, MiB (/proc/self/status VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


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
