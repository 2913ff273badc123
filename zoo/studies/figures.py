"""A study's figure: `curves.png` in the study's folder (Matplotlib): validation perplexity
by epoch, one line per arm (and grid point), the mean over the seeds that finished, with a
band of +- one standard deviation where there are two or more (Parthiban 2020 Figs 4.8 /
4.9 draw the curves; the band shows the seeds).
"""

import json

import numpy as np

from zoo.runs.run_state import run_state


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
    groups = {}
    for trial in trials:
        run = folder / "trials" / trial.name
        if run_state(run) != "finished":
            continue
        history = json.loads((run / "metrics.json").read_text())["history"]
        groups.setdefault(_label(trial.arm, trial.point_dict), []).append(
            [h["val_perplexity"] for h in history])
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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn
