"""How different are a model's next-word distributions? Pairwise KL and top-k tables.

- `expected_pairwise_kl`: E_{c, c'}[ KL(P(. | c) || P(. | c')) ] estimated from uniformly
  sampled pairs of distinct rows of Q_theta (rows are log-probabilities):
  KL(P_i || P_j) = sum_w exp(q_iw) * (q_iw - q_jw). Yang et al. 2018 ICLR, App. C.1,
  Table 11 (PTB test: Softmax 4.763, MoC 4.864, MoS 5.284).
- `top_k_predictions` / `format_top_k_table`: the k most probable next words per context,
  printed like Parthiban 2020 thesis Table 5.1.

`python -m tools.divergence Q.npy [Q.npy ...] [--labels ...] [--pairs 10000] [--seed 0]
[--json FILE]` prints Yang et al.'s Table 11 for the matrices given (tools.qmatrix exports
them): each one's expected pairwise KL with its standard error, every matrix over the same
sampled pairs of rows where their row counts agree (one seed), so the differences between
models are not sampling noise of different pairs.

`python -m tools.divergence Q.npy [Q.npy ...] --top-k 5 --contexts yang2018_table14
[--corpus ptb] [--data-dir DIR]` prints thesis Table 5.1 / Yang et al.'s Table 14 instead:
the k most probable next words of every matrix at the contexts the papers chose
(`tools.published_contexts`, located in the corpus's test split), or at the rows given
(`--contexts 477,2699`), each context shown as the papers show it (the previous sentence
and the current one up to the blank) with its reference sentence. The matrices must hold
the test split's rows from its start (`tools.qmatrix --split test`).

Example:
    >>> import numpy as np
    >>> q = np.log(np.random.default_rng(0).dirichlet(np.ones(5), size=20))
    >>> r = expected_pairwise_kl(q, num_pairs=100)
    >>> r.mean > 0
    True
"""

import argparse
import dataclasses
import pathlib
import sys

import numpy as np

from tools.published_contexts import PUBLISHED, display_context, reference_sentence, rows_of
from tools.qmatrix_io import open_q
from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.user_errors import check_output_file, one_line_errors

NORMALIZATION_TOL = 1e-3  # |logsumexp(row)| allowed for a row of log-probabilities


@dataclasses.dataclass
class PairwiseKL:
    """Estimate of the expected pairwise KL divergence (nats).

    Attributes:
        mean: average of KL(P_i || P_j) over the sampled pairs.
        stderr: standard error of the mean (sample std / sqrt(num_pairs)).
        std: sample standard deviation of the per-pair KL values (ddof=1).
        num_pairs: number of sampled pairs.
        pairs: (num_pairs, 2) int array of the sampled row indices (i, j), i != j.
    """

    mean: float
    stderr: float
    std: float
    num_pairs: int
    pairs: np.ndarray

    def __str__(self):
        return (f"expected pairwise KL = {self.mean:.4f} +- {self.stderr:.4f} nats "
                f"(std. error, {self.num_pairs:,} pairs)")


def _logsumexp_rows(x):
    mx = np.max(x, axis=1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    return (mx + np.log(np.sum(np.exp(x - mx), axis=1, keepdims=True)))[:, 0]


def kl_rows(qi, qj):
    """KL(P_i || P_j) for aligned rows of log-probabilities, in float64 (0 log 0 = 0)."""
    qi = np.asarray(qi, dtype=np.float64)
    qj = np.asarray(qj, dtype=np.float64)
    p = np.exp(qi)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (qi - qj), 0.0)
    return terms.sum(axis=-1)


def expected_pairwise_kl(q, num_pairs=10000, seed=0, chunk_pairs=None,
                         check_normalized=True):
    """Monte Carlo estimate of E_{i != j}[ KL(P_i || P_j) ] over rows of Q.

    Pairs are drawn uniformly among ordered pairs of distinct rows with
    ``np.random.default_rng(seed)``: i ~ U{0..M-1}, j ~ U{0..M-2} shifted past i.

    Args:
        q: (M, N) log-probabilities (array, memmap or ``.npy`` path), M >= 2.
        num_pairs: number of sampled pairs (the MoS paper does not state its count; 10,000
            gives a standard error well below the differences in its Table 11).
        seed: seed of the numpy Generator.
        chunk_pairs: pairs per chunk (memory: 2 * chunk * N floats); default ~64 MiB.
        check_normalized: raise if a sampled row's logsumexp differs from 0 by more than
            1e-3 (the rows are then not log-probabilities).

    Returns:
        `PairwiseKL` (mean, stderr, std, num_pairs, pairs).
    """
    src = open_q(q)
    m, n = src.shape
    if m < 2:
        raise ValueError(f"need at least 2 rows (contexts) for pairwise KL, got {m}")
    num_pairs = int(num_pairs)
    if num_pairs < 2:
        raise ValueError(f"num_pairs must be >= 2, got {num_pairs}")
    rng = np.random.default_rng(seed)
    i = rng.integers(0, m, size=num_pairs)
    j = rng.integers(0, m - 1, size=num_pairs)
    j = j + (j >= i)
    pairs = np.stack([i, j], axis=1)
    chunk = chunk_pairs or max(1, (64 * 2**20) // (16 * n))
    arr = src.array
    kl = np.empty(num_pairs, dtype=np.float64)
    for s in range(0, num_pairs, chunk):
        ii, jj = i[s:s + chunk], j[s:s + chunk]
        qi = np.asarray(arr[np.sort(ii)], dtype=np.float64)[np.argsort(np.argsort(ii))]
        qj = np.asarray(arr[np.sort(jj)], dtype=np.float64)[np.argsort(np.argsort(jj))]
        if check_normalized:
            for rows, idx in ((qi, ii), (qj, jj)):
                if not np.all(np.isfinite(np.max(rows, axis=1))):
                    bad = int(idx[np.argmin(np.isfinite(np.max(rows, axis=1)))])
                    raise ValueError(f"row {bad} of Q has no finite entry; rows must be "
                                     f"log-probabilities")
                lse = _logsumexp_rows(rows)
                worst = int(np.argmax(np.abs(lse)))
                if abs(lse[worst]) > NORMALIZATION_TOL:
                    raise ValueError(
                        f"row {int(idx[worst])} of Q is not a log-probability vector: "
                        f"logsumexp(row) = {lse[worst]:.4g}, expected 0. Pass log_softmax "
                        f"outputs (tools.qmatrix.export_q writes them), not logits or probs")
        kl[s:s + chunk] = kl_rows(qi, qj)
    std = float(np.std(kl, ddof=1))
    return PairwiseKL(mean=float(np.mean(kl)), stderr=std / np.sqrt(num_pairs), std=std,
                      num_pairs=num_pairs, pairs=pairs)


def _token(vocabulary, idx):
    if hasattr(vocabulary, "id_to_token"):
        return str(vocabulary.id_to_token(int(idx)))
    return str(vocabulary[int(idx)])


def top_k_predictions(q_rows_or_log_probs, vocabulary, k=5):
    """The k most probable next words of each row, most probable first.

    Args:
        q_rows_or_log_probs: (N,) or (R, N) log-probabilities (rows of Q_theta).
        vocabulary: an object with ``id_to_token(int)`` or a list of N strings.
        k: number of words per row (1 <= k <= N).

    Returns:
        list (one per row) of lists of (word, probability) pairs.

    Example:
        >>> top_k_predictions(np.log([[0.1, 0.6, 0.3]]), ["a", "b", "c"], k=2)
        [[('b', 0.6), ('c', 0.3)]]
    """
    x = np.asarray(q_rows_or_log_probs, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"expected (N,) or (rows, N) log-probabilities, got shape {x.shape}")
    n = x.shape[1]
    if not 1 <= int(k) <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if not hasattr(vocabulary, "id_to_token"):
        if len(vocabulary) != n:
            raise ValueError(f"vocabulary has {len(vocabulary)} words but the rows have {n} "
                             f"columns; pass the vocabulary the model was trained with")
    k = int(k)
    out = []
    for row in x:
        top = np.argpartition(-row, k - 1)[:k]
        top = top[np.lexsort((top, -row[top]))]  # by probability, ties by word id
        out.append([(_token(vocabulary, t), float(np.exp(row[t]))) for t in top])
    return out


def _context_text(c):
    return c if isinstance(c, str) else " ".join(str(w) for w in c)


def format_top_k_table(contexts, predictions, references=None, decimals=2,
                       blank="_____"):
    """Printable table of top-k next-word predictions, like thesis Table 5.1.

    Args:
        contexts: one context per entry (a string or a list of words).
        predictions: {model label: [per context: [(word, prob), ...]]}, or a single
            per-context list (labelled "model").
        references: optional true continuation per context (string or word list).
        decimals: probability digits.
        blank: marker printed where the next word goes.

    Returns:
        str.

    Example:
        >>> print(format_top_k_table(["the cat"], {"Softmax": [[("sat", 0.4), ("is", 0.1)]]}))
        Context #1  the cat _____
          Softmax   sat 0.40  is 0.10
    """
    contexts = list(contexts)
    if not isinstance(predictions, dict):
        predictions = {"model": predictions}
    for label, per_ctx in predictions.items():
        if len(per_ctx) != len(contexts):
            raise ValueError(f"predictions for {label!r} cover {len(per_ctx)} contexts, "
                             f"expected {len(contexts)}")
    if references is not None and len(references) != len(contexts):
        raise ValueError(f"got {len(references)} references for {len(contexts)} contexts")
    label_w = max([len(str(lab)) for lab in predictions] + [7])
    lines = []
    for c, ctx in enumerate(contexts):
        lines.append(f"Context #{c + 1}  {_context_text(ctx)} {blank}")
        cells = {lab: [f"{w} {p:.{decimals}f}" for w, p in preds[c]]
                 for lab, preds in predictions.items()}
        ncol = max((len(v) for v in cells.values()), default=0)
        widths = [max((len(v[i]) for v in cells.values() if i < len(v)), default=0)
                  for i in range(ncol)]
        for lab, row in cells.items():
            body = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            lines.append(f"  {str(lab).ljust(label_w)}   {body}".rstrip())
        if references is not None:
            lines.append(f"Reference #{c + 1}  {_context_text(references[c])}")
        if c + 1 < len(contexts):
            lines.append("")
    return "\n".join(lines)


@one_line_errors("tools.divergence")
def main(argv=None):
    """Entry point of `python -m tools.divergence`; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m tools.divergence",
                                description="Expected pairwise KL between the next-word "
                                "distributions of each Q_theta (Yang et al. 2018, Table 11).")
    p.add_argument("q", nargs="+", metavar="Q.npy", help="log-probability matrices "
                   "(python -m tools.qmatrix)")
    p.add_argument("--labels", nargs="+", help="one name per matrix (default: file names)")
    p.add_argument("--pairs", type=int, default=10000, help="sampled pairs of rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="print each matrix's K most probable next words at --contexts "
                        "(thesis Table 5.1) instead of the pairwise KL")
    p.add_argument("--contexts", default="yang2018_table14",
                   help="published contexts (" + ", ".join(sorted(PUBLISHED)) + ") or "
                        "comma-separated rows of Q (default yang2018_table14)")
    p.add_argument("--corpus", default="ptb",
                   help="the corpus whose test split the matrices hold (default ptb)")
    p.add_argument("--data-dir")
    args = p.parse_args(argv)
    labels = args.labels or [pathlib.Path(q).stem for q in args.q]
    if len(labels) != len(args.q):
        p.error(f"{len(labels)} labels for {len(args.q)} matrices; give one per matrix")
    if args.json:
        check_output_file(args.json, "--json", make_folders=True)
    if args.top_k is not None:
        return _top_k_command(args, labels)
    rows = []
    for label, q in zip(labels, args.q):
        try:
            kl = expected_pairwise_kl(q, num_pairs=args.pairs, seed=args.seed)
        except ValueError as err:  # not a Q matrix, or too few rows or pairs
            raise UserError(f"{q}: {err}") from err
        rows.append({"label": label, "file": str(q), "rows": int(open_q(q).shape[0]),
                     "mean": kl.mean, "stderr": kl.stderr, "std": kl.std,
                     "pairs": kl.num_pairs})
    print("| model | rows | expected pairwise KL (nats) | std. error |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['label']} | {r['rows']:,} | {r['mean']:.4f} | {r['stderr']:.4f} |")
    print(f"\n{args.pairs:,} pairs of distinct rows drawn with seed {args.seed} "
          "(the same pairs for matrices of the same row count).")
    if args.json:
        pathlib.Path(args.json).absolute().parent.mkdir(parents=True, exist_ok=True)
        atomic_files.write_result_json(args.json, {"seed": args.seed, "models": rows})
    return 0


def _top_k_command(args, labels):
    """`--top-k`: the table of each matrix's top-k words at the chosen contexts."""
    # deferred: the corpus loader imports the data stack only for this table
    from tflm.data import CorpusNotFoundError, load_corpus
    try:
        corpus = load_corpus(args.corpus, args.data_dir)
    except CorpusNotFoundError as err:
        raise UserError(str(err)) from err
    ids, vocabulary = np.asarray(corpus.test), corpus.vocabulary
    if args.contexts in PUBLISHED:
        try:
            located = rows_of(args.contexts, ids, vocabulary)
        except ValueError as err:
            raise UserError(f"--contexts {args.contexts}: {err} (--corpus {args.corpus})") \
                from err
    else:
        try:
            chosen = [int(r) for r in args.contexts.split(",") if r.strip()]
        except ValueError as err:
            raise UserError(f"--contexts {args.contexts!r}: neither a published set "
                            f"({', '.join(sorted(PUBLISHED))}) nor comma-separated rows") \
                from err
        if not chosen or min(chosen) < 0 or max(chosen) >= len(ids) - 1:
            raise UserError(f"--contexts rows must lie in [0, {len(ids) - 2}] for the "
                            f"{args.corpus} test split; got {args.contexts!r}")
        located = [(r, display_context(ids, vocabulary, r),
                    reference_sentence(ids, vocabulary, r)) for r in chosen]
    predictions = {}
    for label, path in zip(labels, args.q):
        q = open_q(path)
        if q.shape[1] != len(vocabulary):
            raise UserError(f"{path}: {q.shape[1]} columns, but the {args.corpus} vocabulary "
                            f"has {len(vocabulary)} words")
        needed = max(row for row, _, _ in located)
        if q.shape[0] <= needed:
            raise UserError(f"{path}: {q.shape[0]:,} rows, but the contexts need row "
                            f"{needed:,}; export the whole test split (tools.qmatrix)")
        rows = np.stack([q.read_rows(row, row + 1)[0] for row, _, _ in located])
        try:
            predictions[label] = top_k_predictions(rows, vocabulary, k=args.top_k)
        except ValueError as err:
            raise UserError(f"--top-k {args.top_k}: {err}") from err
    print(format_top_k_table([ctx for _, ctx, _ in located], predictions,
                             [ref for _, _, ref in located]))
    if args.json:
        atomic_files.write_result_json(args.json, {
            "contexts": args.contexts, "rows": [row for row, _, _ in located],
            "top_k": {label: [[list(p) for p in per] for per in preds]
                      for label, preds in predictions.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
