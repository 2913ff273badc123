"""Numerical rank of Q_theta from its singular values: Press rank, numpy rank, eps-effective rank.

Given singular values s_1 >= ... >= s_n of an M x N matrix stored in a floating dtype with
machine epsilon eps (``np.finfo(dtype).eps``; float32: 1.19e-7, float64: 2.22e-16):

- Press rank  = #{ i : s_i > 0.5 * sqrt(M + N + 1) * s_max * eps }   (Press et al.,
  Numerical Recipes 3rd ed. 2007, §2.6; used by Yang et al. 2018 ICLR §3 and Parthiban 2020
  thesis §2.3, §4.3.3).
- numpy rank  = #{ i : s_i > s_max * max(M, N) * eps }   (``numpy.linalg.matrix_rank``
  default; thesis §2.3).
- eps-effective rank = smallest k with sum_{i<=k} s_i^2 >= (1 - eps) * sum_i s_i^2
  (thesis §5.6, eq. 5.2; reported for eps = 1e-3, 1e-4, 1e-5 in Tables 5.14 / 5.15).

Command line (one or several matrices, a table on stdout, JSON and PNG plots on request)::

    python -m tools.rank softmax_q.npy mos_q.npy --labels Softmax MoS \\
        --json ranks.json --plot figs/ptb_test --save-spectrum spectra/
    python -m tools.rank --spectrum spectra/Softmax.npz --eps 1e-3 1e-4 1e-5
    python -m tools.rank softmax_q.npy --method gram   # streamed Q^T Q (tools.spectrum)

A file that is not a 2-D float matrix (or holds NaN / inf) gives a one-line error on stderr
and exit status 2.

The epsilon is the stored dtype's even when the SVD runs in a wider one: a float16 Q has lost
everything below its rounding, whatever precision the SVD then uses. For float16
(eps = 9.8e-4) the numpy rule's threshold s_max * max(M, N) * eps passes s_max itself once
max(M, N) >= 1024, so it would call every such matrix rank 0; `rank_report` reports that rank
as not defined (None, "n/a" in the table) with a note, and likewise a Press threshold at or
above s_max. Export Q as float32 to measure ranks beyond what float16 resolves.

Which method is right when two disagree. The ranks are counts of the stored matrix's exact
singular values above a threshold, so a method is right when its values are accurate at the
threshold. For a float32 Q the Press threshold is 0.5 sqrt(M + N + 1) eps32 s_max, and
``lapack`` (the thesis' float32 ``sgesdd``) rounds in float32 too: its singular values carry
errors of a few eps32 s_max (measured here: values that are 0.0002-0.004 of the threshold in
float64 come out at 0.03-0.07 of it, on 999 x 40 to 20,000 x 2,000 matrices), the same order
as the threshold itself. ``gram`` accumulates in float64 and is exact to its floor (a rank
counted at t >= floor is the stored matrix's up to values within t / 16 of t), ``tsqr``
runs in float64 (errors ~1e-16 s_max). So where ``gram`` gives Press rank 4 and ``lapack`` 5,
the fifth value lies within float32 rounding of the threshold and ``gram`` (and ``tsqr``) is
right: ``lapack`` counts rounding. `rank_report` flags every value that lies that close
(within 1/16 of the threshold) in a spectrum computed in Q's own precision or by ``gram``,
and names ``--method tsqr`` (float64), which settles it.
"""

import argparse
import pathlib
import sys

import numpy as np

from tools.plots import plot_all
from tools.qmatrix_io import QMatrixError
from tools.rank_thresholds import (machine_eps, numpy_threshold,  # noqa: F401 (re-exported)
                                   press_threshold, rule_applies)
from tools.spectrum import GRAM_SAFETY, SpectrumResult, singular_values
from zoo.runs import atomic_files
from zoo.runtime import quiet_start
from zoo.runtime.user_errors import check_output_dir, check_output_file, one_line_errors

DEFAULT_EPS = (1e-3, 1e-4, 1e-5)


def _spectrum_array(s):
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    if s.size and (not np.all(np.isfinite(s)) or np.any(s < 0)):
        raise ValueError("singular values must be finite and non-negative; got min "
                         f"{np.nanmin(s)!r}, max {np.nanmax(s)!r}")
    return s


def press_rank(s, shape, dtype):
    """Press rank: #{ s_i > 0.5 * sqrt(M + N + 1) * s_max * eps(dtype) }.

    Args:
        s: singular values (any order).
        shape: (M, N) of the matrix.
        dtype: dtype of the matrix (its machine epsilon sets the threshold).

    Returns:
        int.

    Example:
        >>> press_rank([10.0, 1.0, 1e-9], (100, 3), "float32")
        2
    """
    s = _spectrum_array(s)
    if s.size == 0:
        return 0
    return int(np.count_nonzero(s > press_threshold(s.max(), shape, dtype)))


def numpy_rank(s, shape, dtype):
    """numpy rank: #{ s_i > s_max * max(M, N) * eps(dtype) } (``np.linalg.matrix_rank``).

    Example:
        >>> numpy_rank([10.0, 1.0, 1e-9], (100, 3), "float64")
        3
    """
    s = _spectrum_array(s)
    if s.size == 0:
        return 0
    return int(np.count_nonzero(s > numpy_threshold(s.max(), shape, dtype)))


def effective_rank(s, eps=DEFAULT_EPS):
    """eps-effective rank: smallest k with sum_{i<=k} s_i^2 >= (1 - eps) sum_i s_i^2.

    Parthiban 2020 thesis §5.6, eq. 5.2. Singular values are sorted in descending order
    first. An all-zero spectrum has effective rank 0.

    Args:
        s: singular values.
        eps: a float in [0, 1], or a sequence of them (default 1e-3, 1e-4, 1e-5).

    Returns:
        int for a float `eps`; dict {eps: int} for a sequence.

    Example:
        >>> effective_rank([3.0, 2.0, 1.0], 0.1)   # 9 + 4 = 13 >= 0.9 * 14
        2
        >>> effective_rank([3.0, 2.0, 1.0], [0.5, 0.0])
        {0.5: 1, 0.0: 3}
    """
    if isinstance(eps, (list, tuple, np.ndarray)):
        return {float(e): effective_rank(s, float(e)) for e in eps}
    e = float(eps)
    if not 0.0 <= e <= 1.0:
        raise ValueError(f"eps must be in [0, 1], got {eps!r}")
    s = np.sort(_spectrum_array(s))[::-1]
    if s.size == 0:
        return 0
    energy = np.cumsum(s * s)
    total = energy[-1]  # the same summation order as the partial sums
    if total == 0.0:
        return 0
    return int(min(np.searchsorted(energy, (1.0 - e) * total, side="left") + 1, s.size))


def eps_key(eps):
    """JSON / table key of an eps value: ``1e-03`` style."""
    return f"{float(eps):.0e}"


def near_threshold(spectrum, threshold, band=1.0 / GRAM_SAFETY):
    """The singular values within `band` (relative) of `threshold` that `spectrum`'s method
    may count on the wrong side: computed in Q's own precision (float32 ``lapack`` of a
    float32 Q: its rounding is of the threshold's order) or by ``gram`` (resolved to
    `band`, `tools.spectrum`). Empty for a float64 computation of a lower-precision Q."""
    s = np.asarray(spectrum.values, dtype=np.float64)
    compute = spectrum.compute_dtype or spectrum.dtype
    own_precision = np.finfo(np.dtype(compute)).eps >= np.finfo(np.dtype(spectrum.dtype)).eps
    if not (own_precision or spectrum.method == "gram") or threshold <= 0:
        return s[:0]
    return s[(s > threshold * (1 - band)) & (s < threshold * (1 + band))]


def _if_defined(rank, threshold, s_max, floor=None):
    if floor is not None and threshold < floor:
        return None  # below what the method resolves (method="gram")
    return rank if s_max == 0 or rule_applies(threshold, s_max) else None


def rank_report(spectrum, eps_list=DEFAULT_EPS, label=None):
    """All rank measures of one `SpectrumResult` as a JSON-serializable dict.

    Keys: label, source, shape, dtype, compute_dtype, method, exact, approximate, floor, s_max,
    press_threshold, press_rank, numpy_threshold, numpy_rank, effective_rank
    ({"1e-03": k, ...}), num_values, seconds, notes. For a randomized (APPROXIMATE) spectrum
    holding only the top k values, every count is over those k values. A rank whose
    threshold is not below s_max (float16, see the module docstring), or below the floor a
    ``method="gram"`` spectrum resolves (its ``floor``), is None, with a note.
    """
    s = spectrum.values
    smax = float(s.max()) if s.size else 0.0
    eps_list = [float(e) for e in (eps_list if eps_list is not None else DEFAULT_EPS)]
    eff = effective_rank(s, eps_list)
    press_t = press_threshold(smax, spectrum.shape, spectrum.dtype)
    numpy_t = numpy_threshold(smax, spectrum.shape, spectrum.dtype)
    notes = []
    floor = getattr(spectrum, "floor", None)
    for name, threshold in (("Press", press_t), ("numpy", numpy_t)):
        if smax > 0 and not rule_applies(threshold, smax):
            notes.append(f"{name} rank not defined: its threshold ({threshold / smax:.3g} "
                         f"s_max) is not below s_max for a {spectrum.dtype} "
                         f"{spectrum.shape[0]:,} x {spectrum.shape[1]:,} matrix; export Q "
                         "as float32")
        if floor is not None and threshold < floor:
            notes.append(f"{name} rank not resolved: its threshold {threshold:.3g} is below "
                         f"the floor {floor:.3g} of the {spectrum.method} spectrum; "
                         "recompute it with --method tsqr")
        near = near_threshold(spectrum, threshold) if smax > 0 else ()
        if len(near):
            notes.append(f"{name} rank uncertain: {len(near)} singular value(s) within "
                         f"{100 / GRAM_SAFETY:.0f}% of its threshold {threshold:.4g} "
                         f"({', '.join(f'{v / threshold:.4f}' for v in near[:3])} x the "
                         f"threshold), closer than {spectrum.method} in "
                         f"{spectrum.compute_dtype or spectrum.dtype} resolves; --method tsqr "
                         "(float64) counts them exactly")
    if getattr(spectrum, "note", ""):
        notes.append(spectrum.note)
    return {
        "label": label if label is not None else spectrum.source,
        "source": spectrum.source,
        "shape": list(spectrum.shape),
        "dtype": spectrum.dtype,
        "compute_dtype": spectrum.compute_dtype,
        "method": spectrum.method,
        "exact": bool(spectrum.exact),
        "approximate": not spectrum.exact,
        "floor": floor,
        "s_max": smax,
        "press_threshold": press_t,
        "press_rank": _if_defined(press_rank(s, spectrum.shape, spectrum.dtype), press_t, smax,
                                  floor),
        "numpy_threshold": numpy_t,
        "numpy_rank": _if_defined(numpy_rank(s, spectrum.shape, spectrum.dtype), numpy_t, smax,
                                  floor),
        "effective_rank": {eps_key(e): eff[e] for e in eps_list},
        "num_values": int(s.size),
        "seconds": float(spectrum.seconds),
        "notes": notes,
    }


def _count(rank):
    return "n/a" if rank is None else f"{rank:,}"


def format_rank_table(reports):
    """A plain-text table of `rank_report` dicts (one row per matrix)."""
    if not reports:
        return ""
    eps_keys = list(reports[0]["effective_rank"])
    header = ["model", "shape", "dtype", "method", "s_max", "Press rank", "numpy rank"]
    header += [f"eff. rank eps={k}" for k in eps_keys] + ["seconds"]
    rows = []
    for r in reports:
        method = r["method"] + (" (APPROXIMATE)" if r["approximate"] else "")
        rows.append([str(r["label"]), f"{r['shape'][0]:,} x {r['shape'][1]:,}", r["dtype"],
                     method, f"{r['s_max']:.6g}", _count(r["press_rank"]),
                     _count(r["numpy_rank"])]
                    + [f"{r['effective_rank'].get(k, float('nan')):,}" for k in eps_keys]
                    + [f"{r['seconds']:.2f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i >= 4 else c.ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    for r in reports:
        out += [f"{r['label']}: {note}" for note in r.get("notes", ())]
    if any(r["approximate"] for r in reports):
        out.append("APPROXIMATE: randomized SVD gives only the top-k singular values, "
                   "approximately; ranks above are not exact.")
    return "\n".join(out)


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m tools.rank",
        description="Singular values and ranks (Press, numpy, eps-effective) of one or "
                    "several log-probability matrices Q (.npy, rows = contexts).")
    p.add_argument("q", nargs="*", help=".npy files holding Q (M x N float16/32/64)")
    p.add_argument("--method", default="auto", choices=["auto", "lapack", "tsqr", "gram",
                                                        "randomized"],
                   help="SVD method (default auto: exact; gram: streamed Gram matrix, "
                        "refuses a Press threshold below its error floor; randomized is "
                        "APPROXIMATE)")
    p.add_argument("--labels", nargs="+", help="one label per matrix / spectrum, in order")
    p.add_argument("--json", metavar="OUT.json", help="write the reports as JSON")
    p.add_argument("--plot", metavar="PREFIX", help="write PREFIX_*.png spectrum plots")
    p.add_argument("--eps", nargs="+", type=float, default=list(DEFAULT_EPS),
                   help="eps values for the effective rank (default 1e-3 1e-4 1e-5)")
    p.add_argument("--spectrum", nargs="+", default=[], metavar="FILE",
                   help="saved spectra (.npz/.json from --save-spectrum) to re-threshold")
    p.add_argument("--save-spectrum", metavar="DIR",
                   help="save each computed spectrum as DIR/<label>.npz")
    p.add_argument("--block-rows", type=int, help="rows per block for tsqr / randomized")
    p.add_argument("--dtype", choices=["float32", "float64"], help="compute dtype")
    p.add_argument("--k", type=int, help="number of singular values (randomized only)")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    return p


def _check_outputs(args):
    """`UserError` for an output path that cannot be written, before any SVD runs."""
    if args.json:
        check_output_file(args.json, "--json", make_folders=True)
    if args.plot:
        check_output_file(args.plot, "--plot", make_folders=True)
    if args.save_spectrum:
        check_output_dir(args.save_spectrum, "--save-spectrum")


@one_line_errors("tools.rank")
def main(argv=None):
    """Entry point of ``python -m tools.rank``; returns the exit status (2 after a one-line
    error: `zoo.runtime.user_errors`)."""
    args = _parser().parse_args(argv)
    prog = "tools.rank"
    if args.progress:  # the progress bar is Keras', which imports TensorFlow
        quiet_start.start()
    inputs = [("q", p) for p in args.q] + [("spectrum", p) for p in args.spectrum]
    if not inputs:
        print(f"{prog}: error: give at least one Q .npy file or --spectrum FILE",
              file=sys.stderr)
        return 2
    if args.labels and len(args.labels) != len(inputs):
        print(f"{prog}: error: {len(args.labels)} labels for {len(inputs)} inputs; give one "
              f"label per matrix / spectrum", file=sys.stderr)
        return 2
    for e in args.eps:
        if not 0.0 <= e <= 1.0:
            print(f"{prog}: error: --eps values must be in [0, 1], got {e}", file=sys.stderr)
            return 2
    _check_outputs(args)
    reports, spectra, labels = [], [], []
    for i, (kind, path) in enumerate(inputs):
        label = args.labels[i] if args.labels else pathlib.Path(path).stem
        try:
            if kind == "q":
                spec = singular_values(path, method=args.method, block_rows=args.block_rows,
                                       dtype=args.dtype, device=args.device,
                                       progress=args.progress, k=args.k)
                if args.save_spectrum:
                    out = pathlib.Path(args.save_spectrum)
                    out.mkdir(parents=True, exist_ok=True)
                    spec.save(out / f"{label}.npz")
            else:
                spec = SpectrumResult.load(path)
        except (QMatrixError, FileNotFoundError, ValueError, RuntimeError, OSError) as exc:
            msg = " ".join(str(exc).split())
            print(f"{prog}: error: {msg}", file=sys.stderr)
            return 2
        spectra.append(spec)
        labels.append(label)
        reports.append(rank_report(spec, args.eps, label=label))
    print(format_rank_table(reports))
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_files.write_result_json(args.json, {"reports": reports},
                                       kept="the table is printed above")
        print(f"wrote {args.json}")
    if args.plot:
        for path in plot_all(spectra, labels, args.plot).values():
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
