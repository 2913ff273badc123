"""Benchmark: singular values by the streamed Gram matrix vs LAPACK vs TSQR, against a floor.

For each size M x N (``--sizes``; default 20,000 x 2,000 and 82,430 x 5,000, the full PTB
test row count), a float32 Q = X Y + noise (the matrix of bench/analysis/svd.py: rank
``--rank`` with column scales 1 ... 1e-3, Gaussian noise ``--noise``) is written block by
block to a ``.npy`` file, and each method runs on that path in its own subprocess (peak
RSS = the worker's VmHWM over its RSS after imports, as in bench/analysis/svd.py):

- ``lapack``: ``singular_values(path, method="lapack")`` (float32 ``sgesdd``, in memory);
- ``tsqr``: streamed TSQR in float64 (the exact reference for the differences);
- ``gram``: ``method="gram"``: G = Q^T Q in float64 over 512-row blocks, then ``eigh``.

The floor is set by the dominant dense kernel, measured in the same run in its own
subprocess: the float64 ``dsyrk`` (beta = 0, the call gram makes) of a b x N block, best of
3 calls, at the best of b = 512 (gram's block) and b = 2,048. floor = M N^2 / rate
(M N^2 = the flops of the upper triangle of Q^T Q, the least any of these methods does).
The same worker times ``eigh`` of an N x N symmetric matrix (gram's second step), reported
next to the floor.

Prints a markdown table per size (seconds, ratio to the floor, peak RSS, Press / numpy
rank, differences against TSQR, gram's resolved floor vs the Press threshold) and writes
them, with the machine, BLAS threads and load average, to ``results/svd_gram.md`` beside
this script (``--out``; `bench.harness.publish`).

Usage::

    python -m bench.analysis.svd_gram --threads 1                    # default sizes
    python -m bench.analysis.svd_gram --sizes 8000x1000 --threads 1  # a quick run
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.linalg
from scipy.linalg import blas

from bench.analysis.svd import _loadavg, _peak_rss_mib, _reset_peak, machine_info
from bench.harness import REPO, module_command, publish, results_path
from tools.rank import numpy_rank, press_rank, press_threshold
from tools.spectrum import GRAM_BLOCK_ROWS, singular_values

METHODS = ("lapack", "tsqr", "gram")


def kernel_worker(rows, cols, block):
    """Time gram's dominant kernel (dsyrk of a block, beta=0) and eigh of an N x N G."""
    rng = np.random.default_rng(1)
    c = np.empty((cols, cols), order="F")
    rate, best_block = 0.0, block
    for b in sorted({min(block, rows), min(2048, rows)}):
        x = rng.standard_normal((b, cols))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            c = blas.dsyrk(1.0, x.T, beta=0.0, c=c, trans=0, lower=0, overwrite_c=1)
            best = min(best, time.perf_counter() - t0)
        if b * cols * cols / best > rate:  # flops of the upper triangle: N (N + 1) / 2 * 2 b
            rate, best_block = b * cols * cols / best, b
        del x
    g = np.asfortranarray(c)
    g += cols * np.eye(cols)
    t0 = time.perf_counter()
    scipy.linalg.eigh(g, lower=False, eigvals_only=True, overwrite_a=True,
                      check_finite=False, driver="evd")
    eigh_s = time.perf_counter() - t0
    print(json.dumps({"rate": rate, "floor_s": rows * cols * cols / rate,
                      "eigh_s": eigh_s, "block": best_block}))


def method_worker(method, path, values_out):
    """Run one method in this fresh process; print a JSON line with its figures."""
    base = _reset_peak() or 0.0
    t0 = time.perf_counter()
    res = singular_values(path, method=method)
    seconds = time.perf_counter() - t0
    peak = _peak_rss_mib()
    np.save(values_out, res.values)
    print(json.dumps({"method": method, "seconds": seconds, "peak_rss_mib": peak,
                      "base_rss_mib": base, "compute_dtype": res.compute_dtype,
                      "press_rank": press_rank(res.values, res.shape, res.dtype),
                      "numpy_rank": numpy_rank(res.values, res.shape, res.dtype),
                      "floor": res.floor, "s_max": res.s_max,
                      "block_rows": res.block_rows}))


def _run(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"{' '.join(cmd[2:5])} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_size(rows, cols, args, env, tmp):
    """Generate one matrix, time the kernel and every method; returns (kernel, rows, info)."""
    path = os.path.join(tmp, f"q_{rows}x{cols}.npy")
    print(f"{rows:,} x {cols:,}: generating ...", flush=True)
    gen = _run(module_command("bench.analysis.svd", "--worker", "generate", "--path", path,
                              "--rows", rows, "--cols", cols, "--rank", min(args.rank, cols),
                              "--noise", args.noise), env)
    kernel = _run(module_command(__spec__.name, "--worker", "kernel", "--rows", rows,
                                 "--cols", cols, "--block", min(GRAM_BLOCK_ROWS, rows)), env)
    print(f"  generated in {gen['seconds']:.0f} s; dsyrk {kernel['rate'] / 1e9:.1f} GFLOP/s, "
          f"floor {kernel['floor_s']:.1f} s, eigh(N) {kernel['eigh_s']:.1f} s", flush=True)
    results, values = [], {}
    for method in args.methods:
        vout = os.path.join(tmp, f"{method}_{rows}x{cols}.npy")
        r = _run(module_command(__spec__.name, "--worker", method, "--path", path,
                                "--values-out", vout), env)
        print(f"  {method}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_mib']:,.0f} MiB",
              flush=True)
        values[method] = np.load(vout)
        results.append(r)
    os.remove(path)
    ref_name = "tsqr" if "tsqr" in values else args.methods[0]
    ref = values[ref_name]
    thr = press_threshold(ref[0], (rows, cols), "float32")
    above = ref > thr
    for r in results:
        v = values[r["method"]]
        r["abs_diff"] = float(np.max(np.abs(v - ref)) / ref[0])
        r["rel_diff_above"] = float(np.max(np.abs(v[above] - ref[above]) / ref[above]))
    info = {"gen_s": gen["seconds"], "press_rel": thr / ref[0], "ref": ref_name}
    return kernel, results, info


def _table(rows, cols, kernel, results, info):
    head = ("| M x N | method | seconds | x floor | peak RSS MiB (growth) | Press rank | "
            f"numpy rank | max abs diff / s_max vs {info['ref']} | max rel diff vs "
            f"{info['ref']}, s_i > Press thr. | resolved floor / s_max |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        floor = "-" if r["floor"] is None else f"{r['floor'] / (r['s_max'] or 1):.2e}"
        lines.append(
            f"| {rows:,} x {cols:,} | {r['method']} ({r['compute_dtype']}) | "
            f"{r['seconds']:.1f} | {r['seconds'] / kernel['floor_s']:.2f} | "
            f"{r['peak_rss_mib']:,.0f} ({r['peak_rss_mib'] - r['base_rss_mib']:+,.0f}) | "
            f"{r['press_rank']:,} | {r['numpy_rank']:,} | {r['abs_diff']:.2e} | "
            f"{r['rel_diff_above']:.2e} | {floor} |")
    lines.append(f"| {rows:,} x {cols:,} | floor: M N^2 / dsyrk rate | "
                 f"{kernel['floor_s']:.1f} | 1.00 | | | | | | |")
    lines.append(
        f"\nFloor: float64 dsyrk at {kernel['rate'] / 1e9:.1f} GFLOP/s ({kernel['block']:,} x "
        f"{cols:,} block, best of 3); eigh of an N x N matrix (gram's second step) took "
        f"{kernel['eigh_s']:.1f} s; float32 Press threshold / s_max = {info['press_rel']:.2e}; "
        f"matrix written in {info['gen_s']:.0f} s.")
    return "\n".join(lines)


def _parse_size(text):
    try:
        m, n = (int(v.replace(",", "").replace("_", "")) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is MxN, e.g. 20000x2000; got {text!r}")
    if m < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"M and N must be >= 1, got {text!r}")
    return m, n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=_parse_size,
                   default=[(20000, 2000), (82430, 5000)], help="M x N, e.g. 82430x5000")
    p.add_argument("--rank", type=int, default=400)
    p.add_argument("--noise", type=float, default=1e-6, help="noise std (default 1e-6)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--threads", type=int,
                   help="BLAS threads of the workers (default: inherit the environment)")
    p.add_argument("--tmpdir", help="where to write the matrices (default: system temp)")
    p.add_argument("--out", default=str(results_path(__file__, "svd_gram.md")))
    p.add_argument("--note", default="", help="text added below the table")
    p.add_argument("--worker", choices=METHODS + ("kernel",), help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--values-out", help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cols", type=int, help=argparse.SUPPRESS)
    p.add_argument("--block", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "kernel":
        kernel_worker(args.rows, args.cols, args.block)
        return 0
    if args.worker:
        method_worker(args.worker, args.path, args.values_out)
        return 0
    env = dict(os.environ)
    if args.threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(args.threads)
    load_before = _loadavg()
    t0 = time.perf_counter()
    tables, refs = [], set()
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        for rows, cols in args.sizes:
            kernel, results, info = bench_size(rows, cols, args, env, tmp)
            tables.append(_table(rows, cols, kernel, results, info))
            refs.add(info["ref"])
    wall = time.perf_counter() - t0
    load_after = _loadavg()
    info = machine_info()
    shown = list(argv if argv is not None else sys.argv[1:])
    if "--note" in shown and shown.index("--note") + 1 < len(shown):
        shown[shown.index("--note") + 1] = "(see below)"
    command = f"python -m {__spec__.name} " + shlex.join(shown)
    text = [
        f"Matrices as in bench/analysis/svd.py (X Y of rank {args.rank}, column scales "
        f"1 ... 1e-3, noise std {args.noise:g}, float32 .npy on disk), every method on the path in its own "
        f"subprocess; BLAS threads: {args.threads or 'inherited'}. x floor = seconds / "
        f"(M N^2 / the float64 dsyrk rate measured in the same run). Differences are "
        f"against {' / '.join(sorted(refs))}"
        f"{' (float64)' if refs == {'tsqr'} else ' (TSQR did not run)'}. Resolved floor: "
        f"gram's s_floor (module docstring of tools/spectrum.py), which must lie below the "
        f"float32 Press threshold.\n",
        "\n\n".join(tables), "",
        f"numpy {info['numpy']}, scipy {info['scipy']}, {info['blas']}. Load average (1, 5, "
        f"15 min) before: {' '.join(load_before)}; after: {' '.join(load_after)} (shared machine). "
        f"Whole run: {wall / 60:.1f} min.",
    ]
    if args.note:
        text += ["", args.note]
    publish("Streamed Gram matrix vs LAPACK vs TSQR, against the dsyrk floor", "\n".join(text),
            args.out, command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
