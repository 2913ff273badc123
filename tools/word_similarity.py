"""Word similarity of a language model's input embedding: Spearman rho on human ratings.

For every benchmark file (one pair a line, "word1 word2 score", fields separated by spaces or
tabs; blank lines skipped):

1. the line is lower-cased (the model's words are matched exactly, so a cased vocabulary such
   as WikiText-2's never matches a capitalized word);
2. a pair is skipped, and counted as "not in vocabulary", when either word is not one of the
   model's words;
3. the model's similarity of a pair is the cosine of the two rows of the embedding matrix E
   (the tied input = output embedding, `model.embedding.embeddings`, shape (V, d)):
   cos(a, b) = <E_a, E_b> / (||E_a|| ||E_b||);
4. rho = Spearman's rank correlation of the human scores and the similarities: the Pearson
   correlation of the two rank vectors, tied values getting the average of their ranks
   (thesis eq. 5.1; `scipy.stats.spearmanr`):

       rho = cov(rank(x), rank(y)) / (std(rank(x)) std(rank(y)))

   rho = 0 when no pair remains (the reference's convention; the output says so), and also
   when it is undefined (fewer than two pairs, or constant scores or similarities).

A model whose weights are untied is scored on its input embedding too, with a note saying so.

Difference from the reference, stated: lmkit's `utils/analysis/word_similarity/ranking.py`
adds 1e-6 to every component of both vectors (in place) before the cosine. That shifts every
similarity slightly towards the all-ones direction and is not reproduced here: the cosine is
that of the embedding rows as trained, so a rho here can differ slightly from the reference's.

Benchmarks: the 13 files of the lmkit repository's `data/word_similarity_benchmarks/`, which
is the English collection of wordvectors.org (Faruqui & Dyer 2014, "Community Evaluation and
Exchange of Word Vectors at wordvectors.org"). Non-empty lines per file:

    EN-WS-353-ALL 353     EN-WS-353-SIM 203     EN-WS-353-REL 252     EN-RG-65 65
    EN-MC-30 30           EN-MTurk-287 287      EN-MTurk-771 771      EN-MEN-TR-3k 3000
    EN-YP-130 130         EN-VERB-143 144       EN-RW-STANFORD 2034   EN-SimVerb-3500 3500
    EN-SIMLEX-999 999

They are not shipped with this project: put them in a folder and pass it with `--benchmarks`
or set `TFLM_WORD_SIMILARITY_DIR`. Every `*.txt` file of the folder is a benchmark, named
after the file (without `.txt`); they are scored in sorted name order. With the Penn Treebank
vocabulary (10,000 words) the pairs not in vocabulary are those of thesis Table 5.2: WS-353
116, WS-353-SIM 66, WS-353-REL 80, RG-65 55, MC-30 21, MTurk-287 146, MTurk-771 346, MEN 1952,
YP-130 65, VERB-143 9, RW-STANFORD 1889, SimVerb-3500 1746, SimLex-999 424.

CLI:
    python -m tools.word_similarity RUN_DIR|MODEL.keras [--benchmarks DIR] [--corpus NAME]
        [--data-dir DIR] [--json OUT]

prints one row per benchmark (benchmark, pairs, pairs not in vocabulary, rho), writes the
table to `--json` if asked, and, for a `python -m zoo.train` run (a `config.json` beside the
model), adds every rho to the run's TensorBoard logs as `word_similarity/<benchmark>`
(`RUN_DIR/logs/evaluation`, step = the epoch of the model; `zoo.runs.run_scalars`). `--corpus` /
`--data-dir` matter only for a model without a `vocab.txt` beside it (its words come from
the corpus then).

Library:
    >>> import numpy as np
    >>> E = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    >>> bench = Benchmark("toy", pairs=[("a", "b", 9.0), ("a", "c", 1.0), ("b", "c", 2.0)])
    >>> r = evaluate_benchmark(E, ["a", "b", "c"], bench)
    >>> r.scored, r.not_in_vocabulary, round(r.rho, 3)
    (3, 0, 1.0)

Reference: Parthiban 2020 thesis §5.3.1, Tables 5.2-5.4; lmkit
`utils/analysis/word_similarity/process.py`, `ranking.py`.
"""

import argparse
import dataclasses
import math
import os
import pathlib
import sys

import numpy as np

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime import quiet_start
from zoo.runtime.user_errors import check_output_file, one_line_errors

ENV_DIR = "TFLM_WORD_SIMILARITY_DIR"
SCALAR_GROUP = "word_similarity"
PROG = "tools.word_similarity"


@dataclasses.dataclass
class Benchmark:
    """The pairs of one benchmark file, in file order, words as written.

    Attributes:
        name: the benchmark's name (the file name without `.txt`).
        pairs: a list of (word1, word2, score).
        path: the file it was read from (None for pairs made in code).
    """

    name: str
    pairs: list
    path: pathlib.Path = None


@dataclasses.dataclass
class BenchmarkResult:
    """Spearman rho of one benchmark.

    Attributes:
        benchmark: its name.
        pairs: pairs in the file.
        not_in_vocabulary: pairs skipped because a word is not the model's.
        scored: pairs that entered rho (`pairs - not_in_vocabulary`).
        rho: Spearman's rank correlation (0 when undefined, see `note`).
        note: why rho is 0 by convention, or None.
    """

    benchmark: str
    pairs: int
    not_in_vocabulary: int
    scored: int
    rho: float
    note: str = None


def read_benchmark(path, name=None):
    """Read a benchmark file: one "word1 word2 score" a line, fields separated by any spaces
    or tabs, blank lines (and Windows line ends) ignored.

    Raises `UserError` naming the file and line number for a line without exactly three
    fields or with a score that is not a finite number, and for a file that cannot be read.
    """
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); a "
                        "benchmark file has one 'word1 word2 score' a line.") from err
    except OSError as err:
        raise UserError(f"cannot read benchmark file {path} ({err.strerror or err}).") from err
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3:
            raise UserError(f"{path}:{number}: expected 3 fields 'word1 word2 score', got "
                            f"{len(fields)}: {line.strip()[:80]!r}.")
        try:
            score = float(fields[2])
        except ValueError:
            score = None
        if score is None or not math.isfinite(score):
            raise UserError(f"{path}:{number}: the score {fields[2]!r} is not a finite number "
                            "(a line is 'word1 word2 score').")
        pairs.append((fields[0], fields[1], score))
    return Benchmark(name=name or path.stem, pairs=pairs, path=path)


def benchmark_files(folder):
    """The `*.txt` files of `folder` in sorted name order; `UserError` when the folder is
    missing or has none."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise UserError(f"benchmark folder {folder} does not exist (pass --benchmarks DIR with "
                        f"the word-similarity files, or set {ENV_DIR}).")
    files = sorted((p for p in folder.glob("*.txt") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise UserError(f"benchmark folder {folder} has no *.txt files (one 'word1 word2 "
                        "score' a line).")
    return files


def word_index(vocabulary):
    """{word: id} for a list of words in id order (or a mapping already)."""
    if isinstance(vocabulary, dict):
        return vocabulary
    return {word: i for i, word in enumerate(vocabulary)}


def cosine_similarities(embeddings, ids_a, ids_b):
    """cos(E[a], E[b]) for each pair of row ids (float64). A pair with an all-zero row has
    similarity 0."""
    e = np.asarray(embeddings, dtype=np.float64)
    a, b = e[np.asarray(ids_a, dtype=np.int64)], e[np.asarray(ids_b, dtype=np.int64)]
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def spearman(x, y):
    """Spearman's rho of two equally long sequences (average ranks for ties), or nan when it
    is undefined (fewer than two values, or one side constant)."""
    from scipy import stats  # deferred: a second to import; tools.embeddings never needs it

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"x has {x.size} values but y has {y.size}")
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def evaluate_benchmark(embeddings, vocabulary, benchmark):
    """Score one benchmark (a `Benchmark` or a file path) with the embedding rows of the
    model's words. Returns a `BenchmarkResult`."""
    if not isinstance(benchmark, Benchmark):
        benchmark = read_benchmark(benchmark)
    index = word_index(vocabulary)
    ids_a, ids_b, scores = [], [], []
    for word1, word2, score in benchmark.pairs:
        a, b = index.get(word1.lower()), index.get(word2.lower())
        if a is None or b is None:
            continue
        ids_a.append(a)
        ids_b.append(b)
        scores.append(score)
    total, scored = len(benchmark.pairs), len(scores)
    note = None
    if scored == 0:
        rho, note = 0.0, "no pair in the vocabulary: rho reported as 0"
    else:
        rho = spearman(scores, cosine_similarities(embeddings, ids_a, ids_b))
        if math.isnan(rho):
            why = ("only one pair in the vocabulary" if scored == 1 else
                   "constant scores or similarities")
            rho, note = 0.0, f"rho undefined ({why}): reported as 0"
    return BenchmarkResult(benchmark=benchmark.name, pairs=total,
                           not_in_vocabulary=total - scored, scored=scored, rho=rho,
                           note=note)


def evaluate_folder(embeddings, vocabulary, folder):
    """`evaluate_benchmark` on every `*.txt` file of `folder`, in sorted name order; a list
    of `BenchmarkResult`. Every file is read (and checked) before any is scored."""
    benchmarks = [read_benchmark(path) for path in benchmark_files(folder)]
    index = word_index(vocabulary)
    return [evaluate_benchmark(embeddings, index, b) for b in benchmarks]


def input_embedding(model):
    """The model's input embedding matrix (V, d) as float64 NumPy, and whether the output
    layer is tied to it. `UserError` for a model without `model.embedding.embeddings`."""
    import keras  # deferred: Keras starts TensorFlow; the command lines start it quietly first

    table = getattr(getattr(model, "embedding", None), "embeddings", None)
    if table is None:
        raise UserError(f"{type(model).__name__} has no input embedding "
                        "(model.embedding.embeddings); word similarity needs one.")
    matrix = np.asarray(keras.ops.convert_to_numpy(table), dtype=np.float64)
    return matrix, bool(getattr(model, "tie_weights", True))


def format_table(results):
    """The results as a fixed-width text table, one row per benchmark."""
    width = max([len("benchmark")] + [len(r.benchmark) for r in results])
    lines = [f"{'benchmark':<{width}}  {'pairs':>6}  {'not in vocab':>12}  {'rho':>7}"]
    for r in results:
        lines.append(f"{r.benchmark:<{width}}  {r.pairs:>6}  {r.not_in_vocabulary:>12}  "
                     f"{r.rho:>7.4f}")
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Spearman rho between human similarity ratings and the cosine of a "
                    "language model's input-embedding rows (thesis §5.3.1).")
    p.add_argument("target", metavar="RUN_DIR|MODEL.keras")
    p.add_argument("--benchmarks", metavar="DIR",
                   help=f"folder of benchmark files, *.txt (default: ${ENV_DIR})")
    p.add_argument("--corpus", help="the model's corpus, when no vocab.txt lies beside it")
    p.add_argument("--data-dir")
    p.add_argument("--json", metavar="OUT", help="also write the results to this file")
    return p


@one_line_errors("tools.word_similarity")
def main(argv=None):
    args = build_parser().parse_args(argv)
    quiet_start.start()
    try:
        return _run(args)
    except UserError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


def _run(args):
    # deferred: these import TensorFlow, which must start after `main`'s quiet start
    from zoo.runs.run_scalars import evaluated_epoch, log_scalars
    from zoo.runs.saved_run import open_run

    folder = args.benchmarks or os.environ.get(ENV_DIR)
    if not folder:
        raise UserError(f"no benchmark folder: pass --benchmarks DIR (the word-similarity "
                        f"files, e.g. lmkit's data/word_similarity_benchmarks) or set {ENV_DIR}.")
    benchmarks = [read_benchmark(path) for path in benchmark_files(folder)]
    if args.json:  # before the model is loaded and scored
        check_output_file(args.json, "--json")
    run = open_run(args.target, corpus=args.corpus, data_dir=args.data_dir, need_corpus=False)
    embeddings, tied = input_embedding(run.model)
    if embeddings.shape[0] != len(run.vocabulary):
        raise UserError(f"{run.model_path}: the embedding has {embeddings.shape[0]} rows but "
                        f"the vocabulary {len(run.vocabulary)} words.")
    index = word_index(run.vocabulary)
    results = [evaluate_benchmark(embeddings, index, b) for b in benchmarks]

    print(f"word similarity of {run.model_path} (input embedding {embeddings.shape[0]} x "
          f"{embeddings.shape[1]}), benchmarks in {folder}")
    if not tied:
        print("note: the model's output layer is not tied to its embedding; the input "
              "embedding is scored.")
    print(format_table(results))
    for r in results:
        if r.note:
            print(f"note: {r.benchmark}: {r.note}")

    logged = None
    if run.config is not None:
        step = evaluated_epoch(run.run_dir, run.model_path)
        log_scalars(run.run_dir, {f"{SCALAR_GROUP}/{r.benchmark}": r.rho for r in results},
                    step=step)
        logged = {"dir": str(run.run_dir / "logs" / "evaluation"), "step": step}
    if args.json:
        report = {
            "model": str(run.model_path), "benchmarks_dir": str(folder),
            "embedding_shape": list(embeddings.shape), "tied": tied,
            "tensorboard": logged,
            "results": [dataclasses.asdict(r) for r in results],
        }
        atomic_files.write_result_json(args.json, report,
                                       kept="the table above is complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
