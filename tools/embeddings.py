"""Spectrum, explained variance and a 2-D projection of a language model's embedding matrix.

For the input embedding E (`model.embedding.embeddings`, V x d; the tied output embedding of
a tied model):

- the singular values s_1 >= ... >= s_d of E itself, plotted normalized by the largest on a
  log y axis (thesis Figures 5.4-5.7: AWD-LSTM embeddings show no fast decay, unlike the
  degenerate embeddings of Transformers, Gao et al. 2019);
- PCA (as lmkit's `utils/analysis/embed_variance/process.py` does with sklearn's
  `PCA(n_components=d)`): the singular values sigma_k of the mean-centred matrix
  E - mean(E, axis=0) give the variances var_k = sigma_k^2 / (V - 1), the explained-variance
  ratios var_k / sum_j var_j and their cumulative sums; reported are the smallest numbers of
  components whose cumulative ratio reaches 0.75 and 0.95 (`components_for_variance` also
  takes the S of a spectrum-controlled, SVD-parameterized model directly; negative values
  are clipped to 0, as the reference does);
- the rows projected on the first two principal components, with a few words labelled
  (thesis Figure 5.8; the projection method is not stated there, PCA as in Gao et al.).

A model whose weights are untied is analysed on its input embedding, with a note.

CLI:
    python -m tools.embeddings RUN_DIR|MODEL.keras --out DIR [--words w1,w2,...]
        [--corpus NAME] [--data-dir DIR]

writes `spectrum.png`, `projection.png` and `embeddings.json` (shape, singular values,
explained-variance ratios, components_75, components_95, the labelled words) into DIR and
prints a summary. The labelled words are `--words`, else the 10 most frequent words of the
training split when the run's corpus (or `--corpus`) can be loaded, else ids 0-9.

Example:
    >>> import numpy as np
    >>> E = np.random.default_rng(0).normal(size=(100, 8)) * [8, 4, 2, 1, 1, 1, 1, 1]
    >>> pca = principal_components(E)
    >>> pca["components_75"] <= pca["components_95"] <= 8
    True

Reference: Parthiban 2020 thesis §2.5, §5.3.2; Gao et al. 2019, "Representation Degeneration
Problem in Training Natural Language Generation Models".
"""

import argparse
import json
import pathlib
import sys

import numpy as np

from tools.plots import plot_normalized
from tools.word_similarity import input_embedding
from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime import quiet_start
from zoo.runtime.user_errors import check_output_dir, one_line_errors

PROG = "tools.embeddings"
THRESHOLDS = (0.75, 0.95)
DEFAULT_LABELS = 10


def singular_values(matrix):
    """Singular values of `matrix` (not centred), largest first, float64."""
    return np.linalg.svd(np.asarray(matrix, dtype=np.float64), compute_uv=False)


def components_for_variance(values, num_rows, thresholds=THRESHOLDS):
    """Explained-variance ratios and, per threshold t, the smallest k with
    sum_{j<=k} var_j / sum_j var_j >= t, where var_j = max(s_j, 0)^2 / (num_rows - 1).

    Args:
        values: the singular values of the centred matrix (any order; sorted here), or S of
            an SVD-parameterized layer.
        num_rows: the number of rows n of the matrix (V).
        thresholds: the cumulative ratios to reach. Default (0.75, 0.95).

    Returns:
        (ratios, {t: k}); every k is 0 when the total variance is 0.
    """
    if num_rows < 2:
        raise ValueError(f"PCA needs at least 2 rows, got num_rows={num_rows}")
    s = np.sort(np.clip(np.asarray(values, dtype=np.float64).reshape(-1), 0, None))[::-1]
    var = s ** 2 / (num_rows - 1)
    total = var.sum()
    if total <= 0:
        return np.zeros_like(var), {t: 0 for t in thresholds}
    ratios = var / total
    cumulative = np.cumsum(ratios)
    counts = {}
    for t in thresholds:
        # The smallest k with cumulative[k - 1] >= t (rounding: the last value is ~1).
        k = int(np.searchsorted(cumulative, t, side="left")) + 1
        counts[t] = min(k, s.size)
    return ratios, counts


def principal_components(matrix, thresholds=THRESHOLDS):
    """PCA of the rows of `matrix` by SVD of the mean-centred matrix.

    Returns a dict: `singular_values` (centred), `explained_variance_ratio`,
    `components_75` / `components_95` (for the default thresholds; `components` maps every
    threshold), `projection` (the rows' coordinates on the first two principal axes,
    V x min(2, d))."""
    x = np.asarray(matrix, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"expected a matrix with at least 2 rows, got shape {x.shape}")
    centred = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    ratios, counts = components_for_variance(s, x.shape[0], thresholds)
    result = {"singular_values": s, "explained_variance_ratio": ratios,
              "components": counts, "projection": u[:, :2] * s[:2]}
    for t, k in counts.items():
        result[f"components_{round(t * 100)}"] = k
    return result


def frequent_ids(ids, vocab_size, count=DEFAULT_LABELS):
    """The `count` most frequent ids of `ids`, most frequent first (ties: smaller id)."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64).reshape(-1), minlength=vocab_size)
    return [int(i) for i in np.argsort(-counts, kind="stable")[:count]]


def word_ids(words, vocabulary):
    """Ids of `words` in `vocabulary` (the model's words in id order); `UserError` naming
    every unknown word."""
    index = {w: i for i, w in enumerate(vocabulary)}
    unknown = [w for w in words if w not in index]
    if unknown:
        raise UserError(f"not in the model's vocabulary: {', '.join(map(repr, unknown))} "
                        f"(it has {len(vocabulary)} words; --words takes them as written in "
                        "its vocab.txt).")
    return [index[w] for w in words]


def plot_spectrum(values, path, label):
    """s_i / s_max on a log y axis (`tools.plots.plot_normalized`)."""
    return plot_normalized([np.asarray(values)], [label], path,
                           title="Normalized singular values of the embedding matrix")


def plot_projection(projection, labels, path, title="Embeddings on the first two principal "
                                                     "components"):
    """Scatter of every row's first two PCA coordinates; `labels` ({row id: word}) are
    highlighted and written next to their points."""
    # deferred: matplotlib takes half a second to import, and only plots need it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    p = np.asarray(projection, dtype=np.float64)
    if p.shape[1] < 2:
        p = np.hstack([p, np.zeros((p.shape[0], 2 - p.shape[1]))])
    fig = Figure(figsize=(6.4, 5.4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.scatter(p[:, 0], p[:, 1], s=4, alpha=0.35, color="tab:blue", linewidths=0)
    ids = list(labels)
    if ids:
        ax.scatter(p[ids, 0], p[ids, 1], s=16, color="tab:red")
        for i in ids:
            ax.annotate(labels[i], (p[i, 0], p[i, 1]), fontsize=8, xytext=(3, 3),
                        textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.6)
    ax.axvline(0, color="grey", lw=0.6)
    ax.set_title(title)
    ax.set_xlabel("principal component 1")
    ax.set_ylabel("principal component 2")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files.replacing(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def analyse(embeddings, vocabulary, out, label_ids, label="embedding"):
    """Write spectrum.png, projection.png and embeddings.json for `embeddings` (V x d) into
    `out`; returns the JSON dict."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = singular_values(embeddings)
    pca = principal_components(embeddings)
    plot_spectrum(s, out / "spectrum.png", label)
    plot_projection(pca["projection"], {i: vocabulary[i] for i in label_ids},
                    out / "projection.png")
    report = {
        "shape": list(np.shape(embeddings)),
        "singular_values": s.tolist(),
        "normalized_singular_values": (s / s[0] if s[0] > 0 else s).tolist(),
        "centred_singular_values": pca["singular_values"].tolist(),
        "explained_variance_ratio": pca["explained_variance_ratio"].tolist(),
        "components_75": pca["components_75"],
        "components_95": pca["components_95"],
        "labelled_words": [vocabulary[i] for i in label_ids],
    }
    atomic_files.write_text(out / "embeddings.json", json.dumps(report, indent=2) + "\n")
    return report


def build_parser():
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Singular values, explained variance (PCA) and a 2-D projection of a "
                    "language model's embedding matrix (thesis §5.3.2).")
    p.add_argument("target", metavar="RUN_DIR|MODEL.keras")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the plots and JSON")
    p.add_argument("--words", help="comma-separated words to label in the projection "
                                   f"(default: the {DEFAULT_LABELS} most frequent)")
    p.add_argument("--corpus", help="the corpus for word frequencies, when not the run's own")
    p.add_argument("--data-dir")
    return p


@one_line_errors("tools.embeddings")
def main(argv=None):
    args = build_parser().parse_args(argv)
    quiet_start.start()
    try:
        return _run(args)
    except UserError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


def _label_ids(args, run):
    """(ids to label, how they were chosen)."""
    if args.words is not None:
        words = [w.strip() for w in args.words.split(",") if w.strip()]
        if not words:
            raise UserError("--words names no word; give them comma-separated, e.g. "
                            "--words the,of,and.")
        return word_ids(words, run.vocabulary), "--words"
    count = min(DEFAULT_LABELS, len(run.vocabulary))
    corpus = run.corpus or _corpus_for_counts(args, run)
    if corpus is not None:
        if "train" in corpus.splits:
            ids, where = corpus.split("train"), "training"
        else:
            ids = np.concatenate([corpus.split(s) for s in corpus.splits] or [[]])
            where = "the corpus"
        return frequent_ids(ids, len(run.vocabulary), count), f"most frequent in {where}"
    return list(range(count)), (f"ids 0-{count - 1}: no corpus for word frequencies, see "
                                "--corpus / --data-dir")


def _corpus_for_counts(args, run):
    """The model's corpus for word counts, or None when the run's own corpus is not on this
    machine (a corpus named with --corpus must load)."""
    # deferred: these import TensorFlow, which must start after `main`'s quiet start
    from tflm.data import CorpusNotFoundError
    from zoo.runs.corpora import load_data
    from zoo.models.vocabulary import check_model_vocabulary

    if args.corpus is None and run.settings is None:
        return None
    corpus_settings = run.settings.corpus if args.corpus is None else args.corpus
    try:
        corpus, _ = load_data(corpus_settings, args.data_dir)
    except CorpusNotFoundError as err:
        if args.corpus is not None:
            raise UserError(str(err)) from err
        return None
    check_model_vocabulary(run.model_path, len(run.vocabulary), corpus.vocabulary)
    return corpus


def _run(args):
    from zoo.runs.saved_run import open_run  # deferred: imports TensorFlow, after quiet start

    check_output_dir(args.out, "--out")  # before the model is loaded
    run = open_run(args.target, corpus=args.corpus, data_dir=args.data_dir, need_corpus=False)
    embeddings, tied = input_embedding(run.model)
    if embeddings.shape[0] != len(run.vocabulary):
        raise UserError(f"{run.model_path}: the embedding has {embeddings.shape[0]} rows but "
                        f"the vocabulary {len(run.vocabulary)} words.")
    if embeddings.shape[0] < 2:
        raise UserError(f"{run.model_path}: the embedding has {embeddings.shape[0]} row; PCA "
                        "needs at least 2.")
    ids, chosen = _label_ids(args, run)
    try:
        report = analyse(embeddings, run.vocabulary, args.out, ids,
                         label=run.model_path.parent.name)
    except OSError as err:
        where = err.filename if getattr(err, "filename", None) else f"into {args.out}"
        raise atomic_files.write_failed(where, err, "the files already there are whole "
                                        "(each is replaced whole or not at all)") from None
    s = np.asarray(report["singular_values"])
    v, d = report["shape"]
    print(f"embedding of {run.model_path}: {v} x {d}")
    if not tied:
        print("note: the model's output layer is not tied to its embedding; the input "
              "embedding is analysed.")
    smallest = s[-1] / s[0] if s[0] > 0 else 0.0
    print(f"singular values: largest {s[0]:.4g}, smallest {s[-1]:.4g} "
          f"(s_min / s_max = {smallest:.3g})")
    print(f"principal components for 75 % of the variance: {report['components_75']} of {d}; "
          f"for 95 %: {report['components_95']} of {d}")
    print(f"labelled words ({chosen}): {', '.join(report['labelled_words'])}")
    names = ("spectrum.png", "projection.png", "embeddings.json")
    print(f"wrote {', '.join(str(pathlib.Path(args.out) / n) for n in names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
