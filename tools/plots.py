"""Spectrum plots of Q_theta for one or several models (PNG, matplotlib Agg canvas).

- `plot_singular_values`: s_i against i, log y axis.
- `plot_normalized`: s_i / s_max against i on a linear y axis (Parthiban 2020 thesis,
  Figures 5.9-5.12 style); ``logy=True`` for a log axis.
- `plot_cumulative_normalized`: Yang et al. 2018 ICLR, App. C.1 / Figure 1: the percentage
  of normalized singular values s_i / s_max that lie below a threshold x in [0, 1].
- `plot_cumulative_sum`: cumsum(s) / sum(s) against i, the share of the nuclear norm held by
  the top i singular values.

Every function takes a list of spectra (`SpectrumResult` or 1-D arrays) and labels, draws
them overlaid with a legend, writes a PNG and returns its path. Figures are drawn on an Agg
canvas without touching the global matplotlib backend.

Example:
    >>> import numpy as np, tempfile, os
    >>> s = np.linspace(1, 0, 50)
    >>> p = plot_normalized([s], ["toy"], os.path.join(tempfile.mkdtemp(), "n.png"))
"""

import pathlib

import numpy as np


def _values(spec):
    v = getattr(spec, "values", spec)
    return np.sort(np.asarray(v, dtype=np.float64).reshape(-1))[::-1]


def _label(spec, label):
    if getattr(spec, "exact", True) is False:
        return f"{label} (APPROXIMATE)"
    return label


def _figure():
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
    fig.savefig(path, format="png")
    return path


def _check(spectra, labels):
    spectra = list(spectra)
    labels = list(labels) if labels is not None else [f"model {i + 1}"
                                                       for i in range(len(spectra))]
    if len(labels) != len(spectra):
        raise ValueError(f"got {len(spectra)} spectra but {len(labels)} labels")
    return spectra, labels


def plot_singular_values(spectra, labels, path, title="Singular values of Q"):
    """s_i against index i (1-based), log-scaled y. Zeros are not drawn on the log axis."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    for spec, label in zip(spectra, labels):
        s = _values(spec)
        s = np.where(s > 0, s, np.nan)
        ax.plot(np.arange(1, s.size + 1), s, label=_label(spec, label), lw=1.2)
    ax.set_yscale("log")
    return _save(fig, ax, path, title, "index i", "singular value s_i", len(spectra))


def plot_normalized(spectra, labels, path, logy=False,
                    title="Normalized singular values s_i / s_max"):
    """s_i / s_max against i on a linear (thesis Figs. 5.9-5.12) or log y axis."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    for spec, label in zip(spectra, labels):
        s = _values(spec)
        norm = s / s[0] if s.size and s[0] > 0 else s
        if logy:
            norm = np.where(norm > 0, norm, np.nan)
        ax.plot(np.arange(1, s.size + 1), norm, label=_label(spec, label), lw=1.2)
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


def plot_cumulative_normalized(spectra, labels, path,
                               title="Cumulative % of normalized singular values"):
    """Yang et al. 2018 App. C.1: % of s_i / s_max below each threshold x in [0, 1]."""
    spectra, labels = _check(spectra, labels)
    fig, ax = _figure()
    for spec, label in zip(spectra, labels):
        grid, pct = cumulative_normalized(spec)
        ax.plot(grid, pct, label=_label(spec, label), lw=1.2)
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
    """All four plots as ``{prefix}_singular_values.png``, ``_normalized.png``,
    ``_cumulative_normalized.png`` and ``_cumulative_sum.png``; returns {name: path}."""
    prefix = str(prefix)
    return {
        "singular_values": plot_singular_values(spectra, labels,
                                                f"{prefix}_singular_values.png"),
        "normalized": plot_normalized(spectra, labels, f"{prefix}_normalized.png"),
        "cumulative_normalized": plot_cumulative_normalized(
            spectra, labels, f"{prefix}_cumulative_normalized.png"),
        "cumulative_sum": plot_cumulative_sum(spectra, labels,
                                              f"{prefix}_cumulative_sum.png"),
    }
