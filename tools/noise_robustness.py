"""How robust is Press' rank? The experiments of Parthiban 2020 thesis §5.5 and §5.6.

Both start from a real Q_theta (the thesis: MoS on PTB test, first 10,000 contexts, so Q is
10,000 x 10,000) and its thin SVD Q = U S V^T. Keeping the top `keep` = 10 singular values
gives a matrix A_0 = U S_p V^T of exact rank 10.

- **Algorithm 5.1 / Table 5.11** (`reconstruction_robustness`): repeatedly factorize and
  reconstruct, A_i = U_i S_i V_i^T with (U_i, S_i, V_i) = svd(A_{i-1}); report the Press rank
  of every A_i and the accumulated reconstruction error. (Line 5 of the printed algorithm
  factorizes "S_p"; the text says the product U S_p V^T is what is re-factorized, which is
  what is done here.) The error is reported as the mean squared difference
  ||A_i - A_0||_F^2 / (M N) and as the relative Frobenius error; the thesis does not say
  which error its "x 10^-28" row shows.
- **Algorithm 5.2 / Table 5.12** (`gaussian_noise_robustness`): add zero-mean Gaussian noise
  Z to A_0 and report the Press rank of A_0 + Z for a schedule of noise levels c. The printed
  algorithm draws Z from ``gaussian_random(0, c / n^2)`` (n = number of columns). The
  thesis numbers only fit the reading *variance* = c / n^2 (standard deviation sqrt(c) / n):
  from c = 1e-22 to 1e-23 to 1e-24 its rank drops 9,001 -> 6,869 -> 1,159, which under the
  quarter-circle law of the singular values of a square Gaussian matrix means the noise
  scale shrinks by sqrt(10) per decade of c, not by 10. That reading is the default
  (``convention="variance"``); ``convention="std"`` uses standard deviation c / n^2.
  Sub-tables as in the thesis: exponents of c doubling (1e-2, 1e-4, ..., 1e-32), stepping by
  2 (1e-20 ... 1e-28) and by 1 (1e-21 ... 1e-25).
- **Table 5.13** (same experiment): Press rank next to the eps-effective rank for
  eps = 1e-3, 1e-4, 1e-5 (c = 1e-20 ... 1e-25).

The level of c at which Press' rank flips depends on s_max and the dtype of the matrix
(threshold 0.5 sqrt(M + N + 1) s_max eps) and on n, so a different Q flips at a different c.
Each report therefore also gives the noise standard deviation and an extra table scanning c
around this matrix's critical level c* (where the largest noise singular value,
about std * (sqrt(M) + sqrt(N)), reaches the Press threshold).

Command line::

    python -m tools.noise_robustness Q.npy --out results/noise      # first 10,000 rows
    python -m tools.noise_robustness --synthetic --rows 1000 --cols 1000 --out /tmp/nr

writes ``noise_robustness.md`` and ``noise_robustness.json`` into ``--out`` and prints the
markdown. Cost: one thin SVD with vectors per iteration of Algorithm 5.1 and one
``svdvals`` per noise level, each O(M N^2).
"""

import argparse
import math
import pathlib
import sys

import numpy as np
import scipy.linalg

from tools.qmatrix_io import QMatrixError, open_q
from tools.rank import (DEFAULT_EPS, effective_rank, eps_key, numpy_rank, press_rank,
                        press_threshold)
from zoo.runs import atomic_files
from zoo.runtime.user_errors import check_output_dir, one_line_errors

THESIS_KEEP = 10
THESIS_MAX_ROWS = 10_000
THESIS_TABLE_5_12 = (
    ("exponent of c doubling", (-2, -4, -8, -16, -32)),
    ("exponent of c in steps of 2", (-20, -22, -24, -26, -28)),
    ("exponent of c in steps of 1", (-21, -22, -23, -24, -25)),
)
THESIS_TABLE_5_13 = (-20, -21, -22, -23, -24, -25)
CONVENTIONS = ("variance", "std")


def _tall(a):
    """Q as a float64-able tall matrix (m >= n); s(Q^T) = s(Q)."""
    return a if a.shape[0] >= a.shape[1] else a.T


def rank_k_matrix(q, keep=THESIS_KEEP, dtype=np.float64):
    """A_0 = U S_p V^T: Q with all but its top `keep` singular values set to zero.

    Args:
        q: 2-D array (a wide Q is transposed first; the singular values are the same).
        keep: number of singular values kept (thesis: 10).
        dtype: compute dtype (float64 default; tiny noise is invisible in float32).

    Returns:
        (A_0, singular values of Q).
    """
    a = np.asarray(_tall(np.asarray(q)), dtype=dtype)
    if not 1 <= keep <= min(a.shape):
        raise ValueError(f"keep must be in [1, {min(a.shape)}], got {keep}")
    u, s, vt = scipy.linalg.svd(a, full_matrices=False, check_finite=False)
    a0 = (u[:, :keep] * s[:keep]) @ vt[:keep]
    return a0, s


def reconstruction_robustness(q, keep=THESIS_KEEP, iterations=10, dtype=np.float64,
                              a0=None):
    """Algorithm 5.1 (thesis §5.5.1, Table 5.11): Press rank under repeated SVD round trips.

    Args:
        q: Q_theta (2-D array), or an already rank-`keep` matrix.
        keep: singular values kept in A_0 (thesis: 10).
        iterations: number of factorize-and-reconstruct round trips (thesis: 10).
        dtype: compute dtype.
        a0: precomputed rank-`keep` matrix (from `rank_k_matrix`); `q` is then ignored.

    Returns:
        list of dicts, one per iteration: iteration, press_rank, numpy_rank, mse
        (||A_i - A_0||_F^2 / (M N)), rel_error (||A_i - A_0||_F / ||A_0||_F).

    Example:
        >>> q = np.random.default_rng(0).standard_normal((60, 40))
        >>> [r["press_rank"] for r in reconstruction_robustness(q, keep=5, iterations=3)]
        [5, 5, 5]
    """
    if a0 is None:
        a0, _ = rank_k_matrix(q, keep, dtype)
    shape, dt = a0.shape, str(a0.dtype)
    norm0 = float(np.linalg.norm(a0))
    u, s, vt = scipy.linalg.svd(a0, full_matrices=False, check_finite=False)
    rows = []
    for it in range(1, int(iterations) + 1):
        a = (u * s) @ vt
        u, s, vt = scipy.linalg.svd(a, full_matrices=False, check_finite=False)
        diff = float(np.linalg.norm(a - a0))
        rows.append({"iteration": it, "press_rank": press_rank(s, shape, dt),
                     "numpy_rank": numpy_rank(s, shape, dt),
                     "mse": diff ** 2 / (shape[0] * shape[1]),
                     "rel_error": diff / norm0 if norm0 else 0.0})
    return rows


def noise_std(c, n, convention="variance"):
    """Standard deviation of the noise of Algorithm 5.2 for level c and n columns.

    ``"variance"``: variance c / n^2, std sqrt(c) / n (matches the thesis' Table 5.12).
    ``"std"``: std c / n^2 (the literal reading of ``gaussian_random(0, c / n^2)``).
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    if c < 0:
        raise ValueError(f"noise level c must be >= 0, got {c}")
    return math.sqrt(c) / n if convention == "variance" else c / n ** 2


def critical_c(s_max, shape, dtype, convention="variance"):
    """Noise level c* at which the largest noise singular value reaches the Press threshold.

    Uses std * (sqrt(M) + sqrt(N)) for the largest singular value of an M x N Gaussian
    matrix with that standard deviation; below c* Press' rank stays at the true rank.
    """
    m, n = (max(shape), min(shape))
    std = press_threshold(s_max, shape, dtype) / (math.sqrt(m) + math.sqrt(n))
    return (std * n) ** 2 if convention == "variance" else std * n ** 2


def _noise_rng(seed, c):
    bits = int(np.float64(c).view(np.uint64))
    return np.random.default_rng([int(seed), bits])


def ranks_under_noise(a, stds, seed=0, eps_list=DEFAULT_EPS, levels=None):
    """Press, numpy and eps-effective rank of ``a + Z`` for Z ~ N(0, std^2), per std.

    Args:
        a: 2-D float array (its dtype sets eps; use float64 for tiny noise).
        stds: noise standard deviations.
        seed: noise seed; each level gets its own stream (seed, level), so a level gives
            the same matrix in every table.
        eps_list: eps values for the effective rank.
        levels: labels of the levels (the c values) used for seeding; default the stds.

    Returns:
        list of dicts: std, press_rank, numpy_rank, effective_rank, press_threshold,
        noise_to_threshold (std * (sqrt(M) + sqrt(N)) / Press threshold).
    """
    a = np.asarray(a)
    dt = str(a.dtype)
    levels = list(stds) if levels is None else list(levels)
    out = []
    for std, level in zip(stds, levels):
        z = _noise_rng(seed, level).normal(0.0, std, size=a.shape).astype(a.dtype)
        s = scipy.linalg.svdvals(a + z, check_finite=False)
        thr = press_threshold(s[0], a.shape, dt)
        eff = effective_rank(s, list(eps_list))
        out.append({"std": float(std), "press_rank": press_rank(s, a.shape, dt),
                    "numpy_rank": numpy_rank(s, a.shape, dt),
                    "effective_rank": {eps_key(e): eff[float(e)] for e in eps_list},
                    "press_threshold": thr,
                    "noise_to_threshold": float(std) * (math.sqrt(a.shape[0])
                                                        + math.sqrt(a.shape[1])) / thr})
    return out


def gaussian_noise_robustness(q, cs, keep=THESIS_KEEP, seed=0, convention="variance",
                              eps_list=DEFAULT_EPS, dtype=np.float64, a0=None):
    """Algorithm 5.2 (thesis §5.5.2, Tables 5.12 / 5.13): ranks of A_0 + Z for levels c.

    Args:
        q: Q_theta (2-D array); ignored when `a0` is given.
        cs: noise levels c (the thesis steps the exponent of c).
        keep: singular values kept in A_0 (thesis: 10).
        seed: noise seed.
        convention: ``"variance"`` (default, noise variance c / n^2) or ``"std"``.
        eps_list: eps values of the effective rank (Table 5.13).
        dtype: compute dtype.
        a0: precomputed rank-`keep` matrix (from `rank_k_matrix`).

    Returns:
        list of dicts as `ranks_under_noise`, plus the level ``c``.

    Example:
        >>> q = np.random.default_rng(0).standard_normal((80, 50))
        >>> rows = gaussian_noise_robustness(q, [1e-40, 1e-2], keep=5)
        >>> [r["press_rank"] for r in rows]
        [5, 50]
    """
    if a0 is None:
        a0, _ = rank_k_matrix(q, keep, dtype)
    n = a0.shape[1]
    cs = [float(c) for c in cs]
    rows = ranks_under_noise(a0, [noise_std(c, n, convention) for c in cs], seed=seed,
                             eps_list=eps_list, levels=cs)
    for c, row in zip(cs, rows):
        row["c"] = c
    return rows


def synthetic_q(rows=1000, cols=1000, rank=40, seed=0, dtype=np.float32):
    """A softmax-like log-probability matrix: log_softmax(H E^T + 1 b^T) row-wise.

    H (rows x rank), E (cols x rank) and b are standard normal (logits scaled to unit
    variance); the rank of the result is at most rank + 2.
    """
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, cols))
              / math.sqrt(rank) + rng.standard_normal(cols))
    logits -= logits.max(axis=1, keepdims=True)
    q = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return q.astype(dtype)


def _fmt_c(c):
    e = math.log10(c) if c > 0 else float("-inf")
    return f"1e{round(e)}" if c > 0 and abs(e - round(e)) < 1e-9 else f"{c:.3g}"


def _hrow(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _hsep(n):
    return "|" + "|".join(["---"] * n) + "|"


def format_table_5_11(rows):
    """Markdown: iterations as columns, Press rank / numpy rank / errors as rows."""
    head = ["Iteration"] + [r["iteration"] for r in rows]
    lines = [_hrow(head), _hsep(len(head)),
             _hrow(["Press rank"] + [f"{r['press_rank']:,}" for r in rows]),
             _hrow(["numpy rank"] + [f"{r['numpy_rank']:,}" for r in rows]),
             _hrow(["MSE vs A_0"] + [f"{r['mse']:.3g}" for r in rows]),
             _hrow(["rel. Frobenius error"] + [f"{r['rel_error']:.3g}" for r in rows])]
    return "\n".join(lines)


def format_table_5_12(sub_tables, by_c):
    """Markdown: one block per schedule, columns = c, rows = Press rank / numpy rank."""
    out = []
    for title, exps in sub_tables:
        cs = [10.0 ** e for e in exps]
        out.append(f"*{title}*\n")
        out.append(_hrow(["c"] + [_fmt_c(c) for c in cs]))
        out.append(_hsep(len(cs) + 1))
        out.append(_hrow(["Press rank"] + [f"{by_c[c]['press_rank']:,}" for c in cs]))
        out.append(_hrow(["numpy rank"] + [f"{by_c[c]['numpy_rank']:,}" for c in cs]))
        out.append("")
    return "\n".join(out).rstrip()


def format_table_5_13(rows, eps_list=DEFAULT_EPS, details=False):
    """Markdown: one row per c with Press rank and eps-effective ranks (thesis Table 5.13)."""
    keys = [eps_key(e) for e in eps_list]
    head = ["c", "Press rank"] + [f"eff. rank eps={k}" for k in keys]
    if details:
        head += ["noise std", "std (sqrt M + sqrt N) / Press threshold"]
    lines = [_hrow(head), _hsep(len(head))]
    for r in rows:
        cells = [_fmt_c(r["c"]), f"{r['press_rank']:,}"]
        cells += [f"{r['effective_rank'][k]:,}" for k in keys]
        if details:
            cells += [f"{r['std']:.3g}", f"{r['noise_to_threshold']:.3g}"]
        lines.append(_hrow(cells))
    return "\n".join(lines)


def run_experiments(q, keep=THESIS_KEEP, iterations=10, seed=0, convention="variance",
                    eps_list=DEFAULT_EPS, dtype=np.float64, table_5_12=THESIS_TABLE_5_12,
                    table_5_13=THESIS_TABLE_5_13, scan=True, source=None):
    """Run Algorithms 5.1 and 5.2 on Q and return (markdown, results dict)."""
    q = _tall(np.asarray(q))
    a0, s_q = rank_k_matrix(q, keep, dtype)
    shape, dt = a0.shape, str(np.dtype(dtype))
    recon = (reconstruction_robustness(None, keep, iterations, dtype, a0=a0)
             if iterations else [])
    exps = sorted({e for _, es in table_5_12 for e in es} | set(table_5_13), reverse=True)
    smax0 = float(scipy.linalg.svdvals(a0, check_finite=False)[0])
    c_star = critical_c(smax0, shape, dt, convention)
    scan_exps = []
    if scan and c_star > 0:
        e0 = math.floor(math.log10(c_star))
        scan_exps = list(range(e0 + 3, e0 - 3, -1))
    all_cs = sorted({10.0 ** e for e in exps + scan_exps}, reverse=True)
    noise_rows = gaussian_noise_robustness(None, all_cs, keep, seed, convention, eps_list,
                                           dtype, a0=a0)
    by_c = {r["c"]: r for r in noise_rows}
    md = [f"# Robustness of Press' rank (Parthiban 2020 thesis §5.5, §5.6)\n",
          f"Source: {source or 'array'}.\n",
          f"Q: {q.shape[0]:,} x {q.shape[1]:,} (Press rank of Q itself in {q.dtype}: "
          f"{press_rank(s_q, q.shape, str(q.dtype)):,}); A_0 keeps the top {keep} singular "
          f"values, computed in {dt}; s_max(A_0) = {smax0:.6g}; noise convention "
          f"'{convention}' (noise std = {'sqrt(c) / n' if convention == 'variance' else 'c / n^2'}"
          f", n = {shape[1]:,}); seed {seed}. Critical level for this matrix: "
          f"c* = {c_star:.3g}.\n"]
    if recon:
        md += ["## Table 5.11: robustness to SVD reconstruction errors (Algorithm 5.1)\n",
               format_table_5_11(recon), ""]
    md += ["## Table 5.12: robustness to Gaussian additive noise (Algorithm 5.2)\n",
           format_table_5_12(table_5_12, by_c), "",
           "## Table 5.13: Press' rank vs eps-effective rank\n",
           format_table_5_13([by_c[10.0 ** e] for e in table_5_13], eps_list), ""]
    if scan_exps:
        md += [f"## Scan around this matrix's critical level c* = {c_star:.3g}\n",
               format_table_5_13([by_c[10.0 ** e] for e in scan_exps], eps_list,
                                 details=True), ""]
    results = {"shape": list(q.shape), "dtype": str(q.dtype), "compute_dtype": dt,
               "keep": keep, "seed": seed, "convention": convention, "s_max_a0": smax0,
               "critical_c": c_star, "reconstruction": recon, "noise": noise_rows,
               "table_5_12": [[t, list(es)] for t, es in table_5_12],
               "table_5_13": list(table_5_13), "scan": scan_exps, "source": source}
    return "\n".join(md), results


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m tools.noise_robustness",
        description="Press-rank robustness experiments of Parthiban 2020 §5.5-5.6 "
                    "(Tables 5.11-5.13) on a given Q or a synthetic low-rank Q.")
    p.add_argument("q", nargs="?", help="Q .npy file (rows = contexts)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--synthetic", action="store_true",
                   help="use log_softmax(H E^T + b) of logit rank --rank instead of a file")
    p.add_argument("--rows", type=int, default=1000, help="synthetic rows (default 1000)")
    p.add_argument("--cols", type=int, default=1000, help="synthetic columns (default 1000)")
    p.add_argument("--rank", type=int, default=40, help="synthetic logit rank (default 40)")
    p.add_argument("--max-rows", type=int, default=THESIS_MAX_ROWS,
                   help="use only the first rows of Q (thesis: 10,000)")
    p.add_argument("--keep", type=int, default=THESIS_KEEP, help="singular values kept (10)")
    p.add_argument("--iterations", type=int, default=10, help="Algorithm 5.1 round trips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--convention", choices=CONVENTIONS, default="variance",
                   help="noise c / n^2 is the variance (default) or the std")
    p.add_argument("--eps", nargs="+", type=float, default=list(DEFAULT_EPS))
    p.add_argument("--exponents", nargs="+", type=int,
                   help="exponents of c for Table 5.13 (default -20 ... -25)")
    p.add_argument("--no-scan", action="store_true",
                   help="skip the extra table around this matrix's critical level")
    return p


@one_line_errors("tools.noise_robustness")
def main(argv=None):
    """Entry point of ``python -m tools.noise_robustness``; returns the exit status."""
    args = _parser().parse_args(argv)
    prog = "tools.noise_robustness"
    if (args.q is None) == (not args.synthetic):
        print(f"{prog}: error: give either a Q .npy file or --synthetic", file=sys.stderr)
        return 2
    check_output_dir(args.out, "--out")  # before the experiments, not after them
    try:
        if args.synthetic:
            q = synthetic_q(args.rows, args.cols, args.rank, args.seed)
            source = (f"synthetic log_softmax(H E^T + b), logit rank {args.rank}, "
                      f"seed {args.seed}")
        else:
            src = open_q(args.q)
            q = src.read_rows(0, args.max_rows)
            source = f"{args.q} (first {q.shape[0]:,} of {src.shape[0]:,} rows)"
        if not 1 <= args.keep <= min(q.shape):
            raise ValueError(f"--keep must be in [1, {min(q.shape)}], got {args.keep}")
        md, res = run_experiments(
            q, keep=args.keep, iterations=args.iterations, seed=args.seed,
            convention=args.convention, eps_list=args.eps,
            table_5_13=tuple(args.exponents) if args.exponents else THESIS_TABLE_5_13,
            scan=not args.no_scan, source=source)
    except (QMatrixError, FileNotFoundError, ValueError) as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_files.write_text(out / "noise_robustness.md", md + "\n")
    atomic_files.write_json(out / "noise_robustness.json", res)
    print(md)
    print(f"wrote {out / 'noise_robustness.md'} and {out / 'noise_robustness.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
