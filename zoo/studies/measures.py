"""What a study measures on each finished trial besides its perplexities: the rank of its
log-probability matrix, the word similarity of its embedding, the spectrum of its embedding.

A study names them in `"measures"`; each runs the project's own analysis command on the
trial's run folder, in a child process (the `tools` commands sit above `zoo` in the import
graph, so the study calls them as a user would), and its figures join the trial's
`measures.json`, which the table reads beside `metrics.json`:

    rank               python -m tools.qmatrix RUN --corpus run --split test --out Q.npy, then
                       python -m tools.rank Q.npy --json ... --save-spectrum ...
                       -> press_rank, numpy_rank, effective_rank_<eps> (thesis §4.3.3,
                       Tables 4.4-4.9: the rank of Q_theta on the test split, every context
                       of PTB's, the first 33,320 of WikiText-2's: `RANK_ROWS`); the
                       spectrum is kept (measures/q_test.npz, for the overlaid spectra), Q
                       itself deleted (82,429 x 10,000 float32 = 3.3 GB on PTB)
    word_similarity    python -m tools.word_similarity RUN --benchmarks DIR --json ...
                       -> word_similarity_<benchmark> (Spearman rho) and word_similarity_mean
                       (thesis §5.3.1, Tables 5.3 / 5.4)
    embedding_spectrum python -m tools.embeddings RUN --out measures/embeddings
                       -> embedding_components_75, embedding_components_95 (thesis §5.3.2)

The word-similarity benchmarks are read from `$TFLM_WORD_SIMILARITY_DIR`, else from
`<data dir>/word-similarity` (the layout of the project's shared data).

A measure that has its entry in `measures.json` is not run again: a study run again
measures only what is missing, so adding a measure to a finished study costs only the
measurement.
"""

import json
import os
import pathlib
import subprocess
import sys

from zoo.errors import UserError
from zoo.runs import atomic_files

MEASURES = ("rank", "word_similarity", "embedding_spectrum")
# The thesis's Q_theta on WikiText-2 holds the first 33,320 test contexts (§4.3.3: the whole
# 245,370 x 33,278 matrix, 33 GB, was beyond its LAPACK SVD); other corpora: every context.
RANK_ROWS = {"wikitext-2": 33_320, "wt2": 33_320, "wikitext2": 33_320}
MEASURES_FILE = "measures.json"
FOLDER = "measures"
SIMILARITY_ENV = "TFLM_WORD_SIMILARITY_DIR"


def unknown_measures(names):
    """The sentence naming the measures of `names` that do not exist, or "" when all do."""
    unknown = [n for n in names if n not in MEASURES]
    return (f"unknown measure(s) {unknown}; a study measures {list(MEASURES)}"
            if unknown else "")


def read_measures(run):
    """The trial's measures.json ({measure: {figure: value}}), {} when none."""
    path = pathlib.Path(run) / MEASURES_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def flat(measured):
    """{figure: value} of every measure, the keys a study's `metrics` can name."""
    return {key: value for figures in measured.values() for key, value in figures.items()}


def missing(run, names):
    """The measures of `names` that the trial has not recorded yet."""
    done = read_measures(run)
    return [n for n in names if n not in done]


def similarity_dir(data_dir=None):
    """The folder of word-similarity benchmarks, or a `UserError` that says where to put it."""
    folder = os.environ.get(SIMILARITY_ENV)
    if not folder and data_dir:
        folder = pathlib.Path(data_dir) / "word-similarity"
    if not folder and os.environ.get("TFLM_DATA_DIR"):
        folder = pathlib.Path(os.environ["TFLM_DATA_DIR"]) / "word-similarity"
    if not folder or not pathlib.Path(folder).is_dir():
        raise UserError(f"the word_similarity measure needs the benchmark files: set "
                        f"{SIMILARITY_ENV} or put them in <data dir>/word-similarity.")
    return pathlib.Path(folder)


def _run_tool(args, what):
    """Run `python -m tools....` as a child; a failure is a `UserError` with its last line."""
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        raise UserError(f"measure {what}: {' '.join(args[:1])} failed (exit "
                        f"{done.returncode}): {lines[-1]}")


def rank_rows(run):
    """The rows of Q the rank measure takes for the trial `run` (None: all)."""
    config = json.loads((pathlib.Path(run) / "config.json").read_text())
    name = (config.get("corpus") or {}).get("name")
    return RANK_ROWS.get(str(name).lower()) if name else None


def _rank(run, out, data_dir):
    q = out / "q_test.npy"
    extra = ["--data-dir", str(data_dir)] if data_dir else []
    rows = rank_rows(run)
    if rows:
        extra += ["--max-rows", str(rows)]
    _run_tool(["tools.qmatrix", str(run), "--corpus", "run", "--split", "test", "--out",
               str(q), *extra], "rank")
    try:
        _run_tool(["tools.rank", str(q), "--labels", "q_test", "--json",
                   str(out / "rank.json"), "--save-spectrum", str(out)], "rank")
    finally:
        q.unlink(missing_ok=True)  # the spectrum is what the study keeps
    (report,) = json.loads((out / "rank.json").read_text())["reports"]
    figures = {"press_rank": report["press_rank"], "numpy_rank": report["numpy_rank"]}
    figures.update({f"effective_rank_{eps}": value
                    for eps, value in report["effective_rank"].items()})
    return figures


def _word_similarity(run, out, data_dir):
    path = out / "word_similarity.json"
    _run_tool(["tools.word_similarity", str(run), "--benchmarks",
               str(similarity_dir(data_dir)), "--json", str(path)], "word_similarity")
    results = json.loads(path.read_text())["results"]
    figures = {f"word_similarity_{r['benchmark']}": r["rho"] for r in results}
    figures["word_similarity_mean"] = (sum(r["rho"] for r in results) / len(results)
                                       if results else None)
    return figures


def _embedding_spectrum(run, out, data_dir):
    folder = out / "embeddings"
    extra = ["--data-dir", str(data_dir)] if data_dir else []
    _run_tool(["tools.embeddings", str(run), "--out", str(folder), *extra],
              "embedding_spectrum")
    report = json.loads((folder / "embeddings.json").read_text())
    return {"embedding_components_75": report["components_75"],
            "embedding_components_95": report["components_95"]}


_RUNNERS = {"rank": _rank, "word_similarity": _word_similarity,
            "embedding_spectrum": _embedding_spectrum}


def measure_trial(run, names, data_dir=None):
    """Run the measures of `names` the finished trial `run` lacks; record each in its
    measures.json as it completes (a failure keeps the ones before it). Returns the
    trial's measures."""
    run = pathlib.Path(run)
    if unknown_measures(names):
        raise UserError(unknown_measures(names))
    out = run / FOLDER
    out.mkdir(exist_ok=True)
    measured = read_measures(run)
    for name in names:
        if name in measured:
            continue
        measured[name] = _RUNNERS[name](run, out, data_dir)
        atomic_files.write_json(run / MEASURES_FILE, measured)
    return measured
