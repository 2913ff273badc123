"""Benchmark: singular values of a PTB-test-sized Q (82,430 x 10,000 float32), LAPACK vs TSQR.

The matrix is random low rank plus small noise, Q = X Y + noise with X (M x r) Gaussian with
column scales decaying from 1 to 1e-3 (a spread-out spectrum like a trained model's), Y
(r x N) Gaussian / sqrt(r), and i.i.d. Gaussian noise of standard deviation --noise. It is
generated block by block straight into a ``.npy`` memmap in a temporary directory (never
held in memory twice). Each method then runs in its own subprocess, so the peak resident
memory (``ru_maxrss``) is per method:

- ``lapack``: ``tools.spectrum.singular_values(path, method="lapack")``: reads Q into one
  in-memory array and runs ``sgesdd`` (float32, singular values only) on it in place.
- ``numpy``: ``np.linalg.svd(np.load(path), compute_uv=False)`` (a thesis-style baseline).
  Note: numpy.linalg computes float32 input in float64 (``_commonType``) and casts the
  result back to float32, so it holds Q, a float64 copy and LAPACK's work array.
- ``tsqr``: exact streamed TSQR accumulated in float64 (``method="tsqr"``).
- ``tsqr32``: the same accumulated in float32.

Prints a markdown table (method, seconds, peak RSS, Press rank, numpy rank, differences of
the singular values against LAPACK) and writes it with machine information to
``results/svd.md`` beside this script (``--out``; ``bench.harness.publish``).

Usage::

    python -m bench.analysis.svd                   # full size, lapack + tsqr
    python -m bench.analysis.svd --quick           # 8,243 x 1,000, rank 40
    python -m bench.analysis.svd --rows 20000 --cols 4000 --rank 400 --methods lapack numpy tsqr
"""

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy
import scipy.linalg  # noqa: F401  (loaded before a worker takes its memory baseline)

from bench.harness import REPO, module_command, publish, results_path
from tools.frameworks.machine import cpu_model, memory_gib
from tools.rank import numpy_rank, press_rank, press_threshold
from tools.spectrum import singular_values

METHODS = ("lapack", "numpy", "tsqr", "tsqr32")


def _status_mib(key):
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MiB, or None."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_peak():
    """Reset this process's peak RSS (VmHWM) to its current RSS; returns the current RSS.

    ``ru_maxrss`` cannot be used for a child's own peak: Linux carries the high-water mark
    across fork + exec, so a worker would report at least its parent's RSS. VmHWM is per
    process and ``echo 5 > /proc/self/clear_refs`` resets it.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    return _status_mib("VmRSS")


def _peak_rss_mib():
    """Peak RSS of this process: VmHWM, else ``ru_maxrss`` (KiB on Linux)."""
    hwm = _status_mib("VmHWM")
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def generate(path, rows, cols, rank, noise, seed=0, block=4096):
    """Write Q = X Y + noise (float32) to `path` block by block; returns seconds taken."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    scales = np.logspace(0, -3, rank).astype(np.float32)
    y = (rng.standard_normal((rank, cols), dtype=np.float32) / np.sqrt(rank)).astype(np.float32)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    for s in range(0, rows, block):
        n = min(block, rows - s)
        x = rng.standard_normal((n, rank), dtype=np.float32) * scales
        blk = x @ y
        if noise > 0:
            blk += noise * rng.standard_normal((n, cols), dtype=np.float32)
        mm[s:s + n] = blk
    mm.flush()
    del mm
    return time.perf_counter() - t0


def worker(method, path, values_out, block_rows):
    """Run one method in this (fresh) process and print a JSON line with its figures."""
    base = _reset_peak() or 0.0
    t0 = time.perf_counter()
    if method == "numpy":
        a = np.load(path)
        values = np.linalg.svd(a, compute_uv=False).astype(np.float64)
        shape, dtype = a.shape, str(a.dtype)
        del a
        compute = "float64"  # numpy.linalg runs float32 input in double, returns float32
    else:
        kw = {"lapack": dict(method="lapack"),
              "tsqr": dict(method="tsqr", block_rows=block_rows),
              "tsqr32": dict(method="tsqr", block_rows=block_rows, dtype="float32")}[method]
        res = singular_values(path, **kw)
        values, shape, dtype, compute = res.values, res.shape, res.dtype, res.compute_dtype
    seconds = time.perf_counter() - t0
    peak = _peak_rss_mib()
    np.save(values_out, values)
    print(json.dumps({"method": method, "seconds": seconds, "peak_rss_mib": peak,
                      "base_rss_mib": base, "press_rank": press_rank(values, shape, dtype),
                      "numpy_rank": numpy_rank(values, shape, dtype),
                      "compute_dtype": compute}))


def machine_info():
    """The machine and the numerical libraries: CPU, cores, memory, versions, BLAS, OS."""
    cpu = cpu_model()
    mem = f"{memory_gib()} GiB"
    blas = "unknown"
    try:
        cfg = np.show_config(mode="dicts")
        b = cfg["Build Dependencies"]["blas"]
        blas = f"{b.get('name')} {b.get('version')}"
    except Exception:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem, "python": platform.python_version(),
            "numpy": np.__version__, "scipy": scipy.__version__, "blas": blas,
            "os": platform.platform()}


def _loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return ["?"] * 3


def _table(rows, ref_name, ref64_name=None):
    head = ("| method | compute dtype | seconds | peak RSS MiB (growth) | Press rank | numpy rank"
            f" | max abs diff / s_max vs {ref_name} | max rel diff vs {ref_name}, "
            f"s_i > Press thr. |")
    if ref64_name:
        head += f" max rel diff vs {ref64_name} (float64), s_i > Press thr. |"
    ncol = 9 if ref64_name else 8
    lines = [head, "|" + "---|" * ncol]
    for r in rows:
        line = (f"| {r['method']} | {r['compute_dtype']} | {r['seconds']:.1f} | "
                f"{r['peak_rss_mib']:,.0f} ({r['peak_rss_mib'] - r['base_rss_mib']:+,.0f}) | "
                f"{r['press_rank']:,} | {r['numpy_rank']:,} | {r['normwise_diff']:.2e} | "
                f"{r['rel_diff_above']:.2e} |")
        if ref64_name:
            line += f" {r['rel_diff_above_64']:.2e} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=82430)
    p.add_argument("--cols", type=int, default=10000)
    p.add_argument("--rank", type=int, default=400)
    p.add_argument("--noise", type=float, default=1e-6, help="noise std (default 1e-6)")
    p.add_argument("--quick", action="store_true", help="8,243 x 1,000, rank 40")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=["lapack", "tsqr"])
    p.add_argument("--block-rows", type=int, help="TSQR rows per block (default: automatic)")
    p.add_argument("--tmpdir", help="where to write the matrix (default: system temp)")
    p.add_argument("--out", default=str(results_path(__file__, "svd.md")))
    p.add_argument("--note", default="", help="text added to the results file")
    p.add_argument("--threads", type=int,
                   help="BLAS threads of the workers (OPENBLAS/OMP/MKL_NUM_THREADS); "
                        "default: inherit the environment")
    p.add_argument("--worker", choices=METHODS + ("generate",), help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--values-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "generate":
        print(json.dumps({"seconds": generate(args.path, args.rows, args.cols, args.rank,
                                              args.noise)}))
        return 0
    if args.worker:
        worker(args.worker, args.path, args.values_out, args.block_rows)
        return 0
    if args.quick:
        args.rows, args.cols, args.rank = 8243, 1000, 40

    load_before = _loadavg()
    env = dict(os.environ)
    if args.threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(args.threads)
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        path = os.path.join(tmp, "q.npy")
        gb = args.rows * args.cols * 4 / 1e9
        print(f"generating {args.rows:,} x {args.cols:,} float32 ({gb:.2f} GB), rank "
              f"{args.rank}, noise {args.noise:g} ...", flush=True)
        # In a subprocess, so this orchestrating process stays small.
        gen = subprocess.run(module_command(__spec__.name, "--worker", "generate", "--path",
                                            path, "--rows", args.rows, "--cols", args.cols,
                                            "--rank", args.rank, "--noise", args.noise),
                             capture_output=True, text=True, cwd=REPO, env=env)
        if gen.returncode != 0:
            raise SystemExit(f"generating the matrix failed:\n{gen.stderr[-4000:]}")
        gen_s = json.loads(gen.stdout.strip().splitlines()[-1])["seconds"]
        print(f"  {gen_s:.1f} s", flush=True)
        rows, values = [], {}
        for method in args.methods:
            vout = os.path.join(tmp, f"{method}.npy")
            cmd = module_command(__spec__.name, "--worker", method, "--path", path,
                                 "--values-out", vout)
            if args.block_rows:
                cmd += ["--block-rows", str(args.block_rows)]
            print(f"running {method} ...", flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
            if proc.returncode != 0:
                print(proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"method {method} failed (exit {proc.returncode})")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"  {r['seconds']:.1f} s, peak RSS {r['peak_rss_mib']:,.0f} MiB", flush=True)
            values[method] = np.load(vout)
            rows.append(r)
    ref_name = "lapack" if "lapack" in values else args.methods[0]
    ref = values[ref_name]
    thr = press_threshold(ref[0], (args.rows, args.cols), "float32")
    above = ref > thr
    ref64_name = "tsqr" if "tsqr" in values else None
    for r in rows:
        v = values[r["method"]]
        r["normwise_diff"] = float(np.max(np.abs(v - ref)) / ref[0])
        r["rel_diff_above"] = float(np.max(np.abs(v[above] - ref[above]) / ref[above]))
        if ref64_name:
            r64 = values[ref64_name]
            r["rel_diff_above_64"] = float(np.max(np.abs(v[above] - r64[above]) / r64[above]))
    table = _table(rows, ref_name, ref64_name)
    print(table)
    info = machine_info()
    load_after = _loadavg()
    shown = list(argv if argv is not None else sys.argv[1:])
    if "--note" in shown and shown.index("--note") + 1 < len(shown):
        shown[shown.index("--note") + 1] = "(see Notes)"
    cmdline = f"python -m {__spec__.name} " + shlex.join(shown)
    text = [
        f"Matrix: {args.rows:,} x {args.cols:,} float32 ({gb:.2f} GB on disk), X Y with "
        f"rank {args.rank} (column scales 1 ... 1e-3) plus Gaussian noise of std "
        f"{args.noise:g}; generated blockwise into a .npy memmap in {gen_s:.0f} s. Each "
        f"method ran in its own subprocess; peak RSS is that process's high-water mark "
        f"`VmHWM` (reset after imports via /proc/self/clear_refs; `ru_maxrss` is not used "
        f"because Linux carries it over from the parent across fork + exec), and growth is "
        f"over the RSS at that reset. BLAS threads: "
        f"{args.threads if args.threads else 'inherited from the environment'}. "
        f"Differences are against "
        f"`{ref_name}`: max_i |s_i - s_i^ref| / s_max, and the largest relative difference "
        f"among the singular values above the float32 Press threshold "
        f"({thr:.3g}).\n",
        table, "",
        "## Machine\n",
        *(f"- {k}: {v}" for k, v in info.items() if k not in ("cpu", "cores", "memory")),
        f"- load average (1, 5, 15 min) before: {' '.join(load_before)}; after: "
        f"{' '.join(load_after)} (the machine is shared; other jobs slow every method)",
        "",
    ]
    if args.note:
        text += ["## Notes\n", args.note, ""]
    publish("Singular values of a PTB-test-sized Q: LAPACK vs streamed TSQR", "\n".join(text),
            args.out, cmdline.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
