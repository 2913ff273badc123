"""Export the log-probability matrix Q_theta of a trained language model, streamed to disk.

    Q[i, w] = log P_theta(w | x_1 .. x_{i+1}),   i = 0 .. M-1,  M = len(split) - 1

Row i is the model's next-word distribution after reading the split's first i + 1 tokens,
each row conditioned on the whole preceding text (batch-1 semantics: one stream, LSTM state
carried across windows, evaluation mode), exactly what the model's output layer returns (one
code path for training, evaluation and export; docs/design.md, contract 1). Rows are written
to the `.npy` file window by window, so memory stays at a few windows whatever the split size.

A JSON sidecar (`<out>.json`) records the model, split, shape, dtype and head, and the
perplexity exp(-(1/M) sum_i Q[i, x_{i+2}]) computed from the same rows, which equals
`model.evaluate` at batch size 1.

CLI:
    python -m tools.qmatrix RUN_DIR|MODEL.keras --corpus ptb|run --split test --out Q.npy
        [--data-dir DIR] [--max-rows N] [--dtype float32|float16|float64] [--bptt 70]

Reference: Yang et al. 2018 (Q_theta, §2.2); Parthiban 2020 thesis §4.3.3 (PTB test:
the reference evaluation at batch 1 gives len(test) - 1 = 82,429 scored rows).
"""

import argparse
import json
import pathlib
import sys
import time

import numpy as np

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime import allocator, progress, quiet_start, xla_flags
from zoo.runtime.user_errors import check_output_file, one_line_errors


class VocabularyMismatchError(ValueError):
    """The model's output size differs from the corpus vocabulary. (The command line also
    compares the words with the run's vocab.txt: `zoo.models.vocabulary`.)"""


def _model_vocab_size(model):
    size = getattr(model, "vocab_size", None)
    if size is None:
        size = int(model.output_shape[-1])
    return int(size)


def export_q(model, corpus, split, out_path, *, max_rows=None, dtype="float32", bptt=70,
             progress=False):
    """Write Q_theta of `model` on `corpus.<split>` to `out_path` (.npy); return the sidecar.

    Args:
        model: a `tflm.LanguageModel` (e.g. a loaded `zoo.AWDLSTM`).
        corpus: a `tflm.data.Corpus` (or any object with `.vocabulary` and the split).
        split: "train", "valid" or "test".
        out_path: path of the `.npy` file; `<out_path>.json` gets the metadata.
        max_rows: keep only the first rows (None: all M = len(split) - 1).
        dtype: storage dtype of Q. Default float32 (the thesis' matrices).
        bptt: window length of the pass (does not change the rows). Default 70.
        progress: show a progress bar.

    Returns:
        The sidecar dict (shape, perplexity, ...).

    Raises:
        zoo.runs.atomic_files.WriteError: a failed write (a full disk, a file-size limit),
            with the previous `out_path` and sidecar whole and no temporary left.
    """
    ids = np.asarray(corpus.split(split) if hasattr(corpus, "split") else getattr(corpus, split),
                     dtype=np.int32)
    vocab = len(corpus.vocabulary)
    if _model_vocab_size(model) != vocab:
        raise VocabularyMismatchError(
            f"the model predicts {_model_vocab_size(model)} words but the corpus vocabulary has "
            f"{vocab}; export with the corpus the model was trained on.")
    if len(ids) < 2:
        raise ValueError(f"split {split!r} has {len(ids)} tokens; need at least 2.")
    rows = len(ids) - 1 if max_rows is None else min(int(max_rows), len(ids) - 1)
    out_path = pathlib.Path(out_path)
    sidecar = pathlib.Path(str(out_path) + ".json")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        # Q and its sidecar are written under temporary names and renamed over the old
        # ones only when both are whole (zoo.runs.atomic_files): a failure at any row (a
        # full disk, a Ctrl-C, a broken model) leaves the previous files and no temporary.
        with atomic_files.replacing(sidecar) as sidecar_tmp:
            with atomic_files.replacing(out_path) as tmp:
                meta = _stream_rows(model, ids, rows, vocab, tmp, dtype, bptt, progress)
                meta.update({"file": out_path.name, "split": split,
                             "corpus": getattr(corpus, "name", None)})
                meta = {key: meta[key] for key in SIDECAR_KEYS}
                sidecar_tmp.write_text(json.dumps(meta, indent=2))
    except OSError as err:
        kept = (f"the previous {out_path.name} is intact" if out_path.exists()
                else "no partial file was left")
        raise atomic_files.write_failed(out_path, err, kept,
                                        "free space (or choose another --out) and export "
                                        "again") from err
    return meta


SIDECAR_KEYS = ("file", "shape", "dtype", "split", "corpus", "model", "head",
                "rows_definition", "perplexity", "seconds", "rows_per_second")


def _stream_rows(model, ids, rows, vocab, path, dtype, bptt, progress):
    """Write the rows of Q into the .npy file `path`, window by window; returns the
    sidecar's figures."""
    # deferred: Keras starts TensorFlow; `main` sets up the process first
    import keras

    from tflm import backends

    # The header (and the file's full size) via numpy; the rows by ordinary sequential writes:
    # rows written through a memmap stay in the process's resident set (19.3 GB of RSS for
    # the 32.7 GB WikiText-2 test matrix), rows written to the file only in the page cache.
    header = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype),
                                       shape=(rows, vocab))
    offset = header.offset
    del header
    bar = keras.utils.Progbar(rows, unit_name="row") if progress else None
    backend = backends.current()
    states, nll, start, t0 = None, 0.0, 0, time.perf_counter()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        while start < rows:
            T = min(int(bptt), rows - start)
            x = ids[None, start:start + T]
            log_probs, states = backend.window_log_probs(model, x, states)
            block = keras.ops.convert_to_numpy(log_probs)[0].astype(np.float64)
            if not np.isfinite(block).all():
                bad = start + int(np.argwhere(~np.isfinite(block))[0][0])
                raise FloatingPointError(f"row {bad} of Q has non-finite log-probabilities; the "
                                         "model is broken (NaN weights?)")
            nll -= block[np.arange(T), ids[start + 1:start + 1 + T]].sum()
            fh.write(np.ascontiguousarray(block, dtype=np.dtype(dtype)).data)
            start += T
            if bar is not None:
                bar.update(start)
    seconds = time.perf_counter() - t0
    return {
        "shape": [rows, vocab], "dtype": str(np.dtype(dtype)),
        "model": type(model).__name__,
        "head": type(getattr(model, "head", None)).__name__,
        "rows_definition": "row i = log P(. | first i+1 tokens of the split), batch-1 state",
        "perplexity": float(np.exp(nll / rows)), "seconds": seconds,
        "rows_per_second": rows / max(seconds, 1e-9),
    }


@one_line_errors("tools.qmatrix")
def main(argv=None):
    """The command line; returns 0, or 2 after a one-line error (`zoo.runtime.user_errors`)."""
    p = argparse.ArgumentParser(prog="python -m tools.qmatrix", description=__doc__.split("\n")[0])
    p.add_argument("model", metavar="RUN_DIR|MODEL.keras",
                   help="a saved .keras language model, or a run directory (its best.keras)")
    p.add_argument("--corpus", required=True,
                   help='ptb, wikitext-2, a corpus directory, or "run": the corpus in the '
                        "config.json beside the model (e.g. a synthetic run)")
    p.add_argument("--data-dir")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--out", required=True)
    p.add_argument("--max-rows", type=int)
    p.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    p.add_argument("--bptt", type=int, default=70)
    args = p.parse_args(argv)
    allocator.keep_freed_memory()  # before any framework starts its threads
    xla_flags.fast_cpu_compiles()  # before JAX starts its backend
    quiet_start.start()
    # deferred: these import TensorFlow, which must start after the set-up above
    from tflm.data import CorpusNotFoundError
    from zoo.models.saving import load_model_file
    from zoo.models.vocabulary import VOCAB_FILE, check_model_vocabulary
    from zoo.runs.saved_run import model_path_of
    try:
        _check_arguments(args)
        model_path = model_path_of(args.model)  # a run directory means its best.keras
        model = load_model_file(model_path, "the model")  # truncated, corrupt: one line
        corpus = _corpus_for(args.corpus, args.data_dir, model_path)
        if check_model_vocabulary(model_path, _model_vocab_size(model),
                                  corpus.vocabulary) == "size":
            print(f"tools.qmatrix: warning: no {VOCAB_FILE} beside {model_path}; only the "
                  "vocabulary size was checked, not that the words are in the model's order.",
                  file=sys.stderr)
        meta = export_q(model, corpus, args.split, args.out, max_rows=args.max_rows,
                        dtype=args.dtype, bptt=args.bptt,
                        progress=progress.verbosity() == progress.BAR)  # a terminal's
    except (VocabularyMismatchError, CorpusNotFoundError, FileNotFoundError, ValueError) as err:
        print(f"tools.qmatrix: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(meta, indent=2))
    return 0


def _check_arguments(args):
    """`UserError` for a bad number or an --out that cannot be written, before any work."""
    for flag, value in (("--bptt", args.bptt), ("--max-rows", args.max_rows)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be >= 1; got {value}.")
    if pathlib.Path(args.out).is_dir():
        raise UserError(f"--out {args.out}: it is a folder; name the .npy file to write.")
    check_output_file(args.out, "--out", make_folders=True)


def _corpus_for(name, data_dir, model_path):
    """A corpus by name/dir; "run" = the synthetic corpus of the run that made the model."""
    # deferred: these import TensorFlow, which must start after `main`'s set-up
    from tflm.data import load_corpus
    if name == "run":
        # deferred: as load_corpus
        from zoo.runs.corpora import load_data
        from zoo.runs.settings import RunSettings
        path = pathlib.Path(model_path).parent / "config.json"
        if not path.is_file():
            raise UserError(f"--corpus run reads the run's corpus from {path}, which does not "
                            "exist; name the corpus (ptb, wikitext-2, a folder).")
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise UserError(f"{path} is not valid JSON ({err}).") from err
        return load_data(RunSettings.from_config(config).corpus, data_dir)[0]
    return load_corpus(name, data_dir=data_dir)


if __name__ == "__main__":
    sys.exit(main())
