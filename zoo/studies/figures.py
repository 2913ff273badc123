"""A study's figures, files in the study's folder (Matplotlib), one line / bar / point
group per arm (and grid point), over the trials that finished:

- `curves.png`: validation perplexity by epoch, the mean over seeds with a band of +- one
  standard deviation where there are two or more (Parthiban 2020 Figs 4.8 / 4.9);
- with the `rank` measure: `rank_vs_perplexity.png`, Press rank of Q_theta against test
  perplexity, a point per trial, Spearman's rho over all of them in the title (Figs 4.6 /
  4.7), and `q_spectra.png`, the singular values of Q normalized by the largest, s_i / s_1,
  on a log axis, the mean over seeds (Figs 5.9-5.12);
- with `embedding_spectrum`: `embedding_spectra.png`, the same for the embedding matrix
  (Figs 5.4-5.7);
- with `word_similarity`: `word_similarity.png`, Spearman rho per benchmark, grouped bars
  of each arm's mean over seeds (Figs 5.1 / 5.2), and `win_counts.png`, the number of
  benchmarks on which each arm has the highest mean rho (Fig 5.3; a tie counts for each).
"""

import json

import numpy as np

from zoo.runs.run_state import run_state
from zoo.studies.measures import FOLDER, flat, read_measures


def _pyplot():
    # deferred: only a study that draws loads Matplotlib, on its file backend
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after the backend is chosen
    return plt


def _label(arm, point):
    fields = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
    return f"{arm} ({fields})" if fields else arm


def curves(trials, folder, path, title=""):
    """Write `path`; returns {label: (mean per epoch, sd per epoch or None)} it drew."""
    groups = {label: [[h["val_perplexity"]
                       for h in json.loads((run / "metrics.json").read_text())["history"]]
                      for run in runs]
              for label, runs in _finished(trials, folder).items()}
    drawn = {}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in groups.items():
        epochs = min(len(r) for r in runs)
        values = np.array([r[:epochs] for r in runs], dtype=float)
        mean = values.mean(axis=0)
        sd = values.std(axis=0, ddof=1) if len(runs) >= 2 else None
        x = np.arange(1, epochs + 1)
        line, = ax.plot(x, mean, marker="o" if epochs < 20 else None,
                        label=f"{label}, {len(runs)} seed{'s' * (len(runs) != 1)}")
        if sd is not None:
            ax.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)
        drawn[label] = (mean, sd)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation perplexity")
    ax.set_title(title or "validation perplexity, mean +- 1 SD over seeds")
    if drawn:
        ax.legend(fontsize=8)
    _save(fig, plt, path)
    return drawn


def _finished(trials, folder):
    """{label: [run folder, ...]} of the finished trials, in the study's order."""
    groups = {}
    for trial in trials:
        run = folder / "trials" / trial.name
        if run_state(run) == "finished":
            groups.setdefault(_label(trial.arm, trial.point_dict), []).append(run)
    return groups


def _save(fig, plt, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rank_vs_perplexity(trials, folder, path, title=""):
    """Write `path`; returns ({label: [(test perplexity, Press rank), ...]}, Spearman rho
    over every point, or None below three points)."""
    # deferred: SciPy's statistics only where a study draws this figure
    from scipy import stats
    points = {}
    for label, runs in _finished(trials, folder).items():
        for run in runs:
            ppl = json.loads((run / "metrics.json").read_text()).get("test_perplexity")
            rank = flat(read_measures(run)).get("press_rank")
            if ppl is not None and rank is not None:
                points.setdefault(label, []).append((float(ppl), int(rank)))
    every = [p for pts in points.values() for p in pts]
    rho = (float(stats.spearmanr(*zip(*every)).statistic)
           if len(every) >= 3 and len({p[0] for p in every}) > 1
           and len({p[1] for p in every}) > 1 else None)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in points.items():
        ax.scatter(*zip(*pts), label=f"{label}, {len(pts)} run{'s' * (len(pts) != 1)}")
    ax.set_xlabel("test perplexity")
    ax.set_ylabel("Press rank of Q")
    rho_text = "-" if rho is None else f"{rho:.2f}"
    ax.set_title((title or "rank of Q against test perplexity")
                 + f" (Spearman rho {rho_text})")
    if points:
        ax.legend(fontsize=8)
    _save(fig, plt, path)
    return points, rho


def _q_spectrum(run):
    path = run / FOLDER / "q_test.npz"
    return np.load(path)["values"] if path.is_file() else None


def _embedding_spectrum(run):
    path = run / FOLDER / "embeddings" / "embeddings.json"
    return (np.asarray(json.loads(path.read_text())["singular_values"])
            if path.is_file() else None)


def spectra(trials, folder, path, which="q", title=""):
    """Write `path`: normalized singular values s_i / s_1 of Q (`which="q"`) or of the
    embedding ("embedding") per label, the mean over seeds; returns {label: that mean}."""
    read = _q_spectrum if which == "q" else _embedding_spectrum
    drawn = {}
    for label, runs in _finished(trials, folder).items():
        found = [s for s in map(read, runs) if s is not None and s.size and s[0] > 0]
        if found:
            n = min(len(s) for s in found)
            drawn[label] = np.mean([s[:n] / s[0] for s in found], axis=0)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in drawn.items():
        ax.plot(np.arange(1, len(values) + 1), values, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("s_i / s_1")
    what = "Q" if which == "q" else "the embedding"
    ax.set_title(title or f"normalized singular values of {what}, mean over seeds")
    if drawn:
        ax.legend(fontsize=8)
    _save(fig, plt, path)
    return drawn


def similarity_means(trials, folder):
    """{label: {benchmark: mean Spearman rho over seeds}} from the trials' measures."""
    means = {}
    for label, runs in _finished(trials, folder).items():
        per = {}
        for run in runs:
            for key, value in read_measures(run).get("word_similarity", {}).items():
                if key != "word_similarity_mean" and value is not None:
                    per.setdefault(key[len("word_similarity_"):], []).append(float(value))
        if per:
            means[label] = {b: float(np.mean(v)) for b, v in sorted(per.items())}
    return means


def win_counts(means):
    """{label: number of benchmarks where its mean rho is the highest} (ties count for
    each label that reaches the highest)."""
    counts = {label: 0 for label in means}
    benchmarks = sorted({b for per in means.values() for b in per})
    for b in benchmarks:
        scored = {label: per[b] for label, per in means.items() if b in per}
        best = max(scored.values())
        for label, value in scored.items():
            counts[label] += value == best
    return counts


def word_similarity(trials, folder, bars_path, wins_path, title=""):
    """Write the grouped bars and the win counts; returns (means, counts)."""
    means = similarity_means(trials, folder)
    counts = win_counts(means)
    benchmarks = sorted({b for per in means.values() for b in per})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7, 0.7 * len(benchmarks) + 2), 4.5))
    width = 0.8 / max(len(means), 1)
    x = np.arange(len(benchmarks))
    for k, (label, per) in enumerate(means.items()):
        ax.bar(x + k * width, [per.get(b, np.nan) for b in benchmarks], width, label=label)
    ax.set_xticks(x + 0.4 - width / 2, benchmarks, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("Spearman rho")
    ax.set_title(title or "word similarity, mean over seeds")
    if means:
        ax.legend(fontsize=8)
    _save(fig, plt, bars_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(list(counts), list(counts.values()))
    ax.set_ylabel("benchmarks with the highest rho")
    ax.set_title(f"win counts over {len(benchmarks)} benchmarks")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    _save(fig, plt, wins_path)
    return means, counts
