"""Spectrum plots of Q_theta for one or several models (PNG, matplotlib Agg canvas).

- `plot_singular_values`: s_i against i, log y axis.
- `plot_normalized`: s_i / s_max against i on a log y axis; ``logy=False`` for the linear
  axis of Parthiban 2020 thesis Figures 5.9-5.12 (where everything past the first few
  values lies on zero).
- `plot_cumulative_normalized`: Yang et al. 2018 ICLR, App. C.1 / Figure 1: the percentage
  of normalized singular values s_i / s_max that lie below a threshold x in (0, 1], on a log
  x axis by default (on a linear one the curve jumps to ~100 % at x ~ 0).
- `plot_cumulative_sum`: cumsum(s) / sum(s) against i, the share of the nuclear norm held by
  the top i singular values.

Every function takes a list of spectra (`SpectrumResult` or 1-D arrays) and labels, draws
them overlaid with a legend, writes a PNG and returns its path. For a `SpectrumResult` (it
knows Q's shape and dtype) the Press threshold 0.5 sqrt(M + N + 1) s_max eps is drawn as a
dashed line in the series' colour: the values beyond it are what the Press rank leaves out; for
a ``gram`` spectrum its resolved floor is a dotted line, and the values under it, which the
Gram route does not resolve (square roots of eigenvalues at the level of its rounding, not
the matrix's singular values), are not drawn: the curve ends at the floor, and the
cumulative percentage starts there.
Figures are drawn on an Agg canvas without touching the global matplotlib backend.

Example:
    >>> import numpy as np, tempfile, os
    >>> s = np.linspace(1, 0, 50)
    >>> p = plot_normalized([s], ["toy"], os.path.join(tempfile.mkdtemp(), "n.png"))
"""

import pathlib

import numpy as np

from tools.rank_thresholds import press_threshold
from zoo.runs import atomic_files


def _values(spec):
    v = getattr(spec, "values", spec)
    return np.sort(np.asarray(v, dtype=np.float64).reshape(-1))[::-1]


def _resolved(spec, s):
    """`s` (descending, of `spec`) with the values under a ``gram`` spectrum's resolved
    floor as NaN: not drawn (they are rounding, not singular values of Q)."""
    floor = getattr(spec, "floor", None)
    return np.where(s >= floor, s, np.nan) if floor else s


def _press_relative(spec):
    """The Press threshold over s_max for a `SpectrumResult`, None for a bare array."""
    shape, dtype = getattr(spec, "shape", None), getattr(spec, "dtype", None)
    if shape is None or dtype is None or isinstance(spec, np.ndarray):
        return None
    return press_threshold(1.0, shape, dtype)


def _label(spec, label):
    if getattr(spec, "exact", True) is False:
        return f"{label} (APPROXIMATE)"
    return label


def _figure():
    # deferred: matplotlib takes half a second to import, and only drawing needs it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.4, 4.4), dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig, ax, path, title, xlabel, ylabel, n_series):
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if n_series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files.replacing(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def _check(spectra, labels):
    spectra = list(spectra)
    labels = list(labels) if labels is not None else [f"model {i + 1}"
                                                       for i in range(len(spectra))]
    if len(labels) != len(spectra):
        raise ValueError(f"got {len(spectra)} spectra but {len(labels)} labels")
    return spectra, labels


def _draw_floor(ax, spec, label, line, scale):
    """A dotted line at a ``gram`` spectrum's resolved floor (times `scale`): the values
    under it are not resolved (tools.spectrum, the error bound of "gram")."""
    floor = getattr(spec, "floor", None)
    if floor:
        ax.axhline(floor * scale, color=line.get_color(), ls=":", lw=0.8,
                   label=f"{label}: resolved floor (gram)")


def plot_singular_values(spectra, labels, path, title="Singular values of Q"):
    """s_i against index i (1-based), log-scaled y. Zeros are not drawn on the log axis."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    for spec, label in zip(spectra, labels):
        s = _values(spec)
        rel = _press_relative(spec)
        s = np.where(s > 0, _resolved(spec, s), np.nan)
        line, = ax.plot(np.arange(1, s.size + 1), s, label=_label(spec, label), lw=1.2)
        if rel is not None and s.size:
            ax.axhline(s[0] * rel, color=line.get_color(), ls="--", lw=0.8,
                       label=f"{label}: Press threshold")
        _draw_floor(ax, spec, label, line, 1.0)
    ax.set_yscale("log")
    return _save(fig, ax, path, title, "index i", "singular value s_i", len(spectra))


def plot_normalized(spectra, labels, path, logy=True,
                    title="Normalized singular values s_i / s_max"):
    """s_i / s_max against i on a log (default, with the Press threshold) or linear (thesis
    Figs. 5.9-5.12) y axis."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    for spec, label in zip(spectra, labels):
        s = _values(spec)
        norm = _resolved(spec, s) / s[0] if s.size and s[0] > 0 else s
        if logy:
            norm = np.where(norm > 0, norm, np.nan)
        line, = ax.plot(np.arange(1, s.size + 1), norm, label=_label(spec, label), lw=1.2)
        rel = _press_relative(spec)
        if logy and rel is not None:
            ax.axhline(rel, color=line.get_color(), ls="--", lw=0.8,
                       label=f"{label}: Press threshold")
        if logy and s.size and s[0] > 0:
            _draw_floor(ax, spec, label, line, 1.0 / s[0])
    if logy:
        ax.set_yscale("log")
    return _save(fig, ax, path, title, "index i", "s_i / s_max", len(spectra))


def cumulative_normalized(s, grid=None):
    """Percentage of normalized singular values s_i / s_max that are <= x, for x in `grid`.

    Yang et al. 2018 ICLR, App. C.1. Returns (grid, percentages).
    """
    s = _values(s)
    grid = np.linspace(0.0, 1.0, 501) if grid is None else np.asarray(grid, np.float64)
    norm = np.sort(s / s[0]) if s.size and s[0] > 0 else np.sort(s)
    return grid, 100.0 * np.searchsorted(norm, grid, side="right") / max(norm.size, 1)


def plot_cumulative_normalized(spectra, labels, path, logx=True,
                               title="Cumulative % of normalized singular values"):
    """Yang et al. 2018 App. C.1: % of s_i / s_max below each threshold x, x on a log axis
    from just below the smallest positive normalized value to 1 (default, with the Press
    threshold as a vertical line) or on [0, 1]."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    grid = None
    if logx:
        smallest = [v[v > 0].min() / v[0] for v in map(_values, spectra) if (v > 0).any()]
        low = max(min(smallest, default=1e-8) / 2, 1e-300)
        grid = np.geomspace(low, 1.0, 801)
    for spec, label in zip(spectra, labels):
        x, pct = cumulative_normalized(spec, grid)
        s = _values(spec)
        floor = getattr(spec, "floor", None)
        if floor and s.size and s[0] > 0:  # under gram's floor the count is not resolved
            pct = np.where(x >= floor / s[0], pct, np.nan)
        line, = ax.plot(x, pct, label=_label(spec, label), lw=1.2)
        rel = _press_relative(spec)
        if logx and rel is not None:
            ax.axvline(rel, color=line.get_color(), ls="--", lw=0.8,
                       label=f"{label}: Press threshold")
    if logx:
        ax.set_xscale("log")
        ax.set_xlim(grid[0], 1)
    else:
        ax.set_xlim(0, 1)
    ax.set_ylim(0, 100.5)
    return _save(fig, ax, path, title, "normalized singular value x",
                 "% of singular values <= x", len(spectra))


def plot_cumulative_sum(spectra, labels, path,
                        title="Cumulative normalized singular values"):
    """cumsum(s)_i / sum(s) against index i."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    for spec, label in zip(spectra, labels):
        s = _values(spec)
        total = s.sum()
        frac = np.cumsum(s) / total if total > 0 else np.zeros_like(s)
        ax.plot(np.arange(1, s.size + 1), frac, label=_label(spec, label), lw=1.2)
    ax.set_ylim(0, 1.01)
    return _save(fig, ax, path, title, "index i", "sum_{j<=i} s_j / sum_j s_j",
                 len(spectra))


def plot_all(spectra, labels, prefix):
    """All plots as ``{prefix}_singular_values.png``, ``_normalized.png`` (log y),
    ``_normalized_linear.png``, ``_cumulative_normalized.png`` (log x) and
    ``_cumulative_sum.png``; returns {name: path}."""
    prefix = str(prefix)
    return {
        "singular_values": plot_singular_values(spectra, labels,
                                                f"{prefix}_singular_values.png"),
        "normalized": plot_normalized(spectra, labels, f"{prefix}_normalized.png"),
        "normalized_linear": plot_normalized(spectra, labels,
                                             f"{prefix}_normalized_linear.png", logy=False),
        "cumulative_normalized": plot_cumulative_normalized(
            spectra, labels, f"{prefix}_cumulative_normalized.png"),
        "cumulative_sum": plot_cumulative_sum(spectra, labels,
                                              f"{prefix}_cumulative_sum.png"),
    }
