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
    python -m tools.qmatrix RUN_DIR/best.keras --corpus ptb --split test --out Q.npy
        [--data-dir DIR] [--max-rows N] [--dtype float32|float16|float64] [--bptt 70]

Reference: Yang et al. 2018 (Q_theta, §2.2); Parthiban 2020 thesis §4.3.3 (PTB test:
the reference evaluation at batch 1 gives len(test) - 1 = 82,429 scored rows).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

from zoo.runtime import allocator, quiet_start, xla_flags


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
    """
    # deferred: Keras starts TensorFlow; `main` sets up the process first
    import keras

    from tflm import backends

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
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".partial")
    # The header (and the file's full size) via numpy; the rows by ordinary sequential writes:
    # rows written through a memmap stay in the process's resident set (19.3 GB of RSS for
    # the 32.7 GB WikiText-2 test matrix), rows written to the file only in the page cache.
    header = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=(rows, vocab))
    offset = header.offset
    del header
    bar = keras.utils.Progbar(rows, unit_name="row") if progress else None
    backend = backends.current()
    states, nll, start, t0 = None, 0.0, 0, time.perf_counter()
    with open(tmp, "r+b") as fh:
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
    os.replace(tmp, out_path)
    seconds = time.perf_counter() - t0
    meta = {
        "file": out_path.name, "shape": [rows, vocab], "dtype": str(np.dtype(dtype)),
        "split": split, "corpus": getattr(corpus, "name", None),
        "model": type(model).__name__,
        "head": type(getattr(model, "head", None)).__name__,
        "rows_definition": "row i = log P(. | first i+1 tokens of the split), batch-1 state",
        "perplexity": float(np.exp(nll / rows)), "seconds": seconds,
        "rows_per_second": rows / max(seconds, 1e-9),
    }
    pathlib.Path(str(out_path) + ".json").write_text(json.dumps(meta, indent=2))
    return meta


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.qmatrix", description=__doc__.split("\n")[0])
    p.add_argument("model", help="a saved .keras language model")
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
    from zoo.models.saving import load_model
    from zoo.models.vocabulary import VOCAB_FILE, check_model_vocabulary
    try:
        model = load_model(args.model)
        corpus = _corpus_for(args.corpus, args.data_dir, args.model)
        if check_model_vocabulary(args.model, _model_vocab_size(model),
                                  corpus.vocabulary) == "size":
            print(f"tools.qmatrix: warning: no {VOCAB_FILE} beside {args.model}; only the "
                  "vocabulary size was checked, not that the words are in the model's order.",
                  file=sys.stderr)
        meta = export_q(model, corpus, args.split, args.out, max_rows=args.max_rows,
                        dtype=args.dtype, bptt=args.bptt, progress=True)
    except (VocabularyMismatchError, CorpusNotFoundError, FileNotFoundError, ValueError) as err:
        print(f"tools.qmatrix: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(meta, indent=2))
    return 0


def _corpus_for(name, data_dir, model_path):
    """A corpus by name/dir; "run" = the synthetic corpus of the run that made the model."""
    # deferred: these import TensorFlow, which must start after `main`'s set-up
    from tflm.data import load_corpus
    if name == "run":
        # deferred: as load_corpus
        from zoo.runs.corpora import load_data
        from zoo.runs.settings import RunSettings
        config = json.loads((pathlib.Path(model_path).parent / "config.json").read_text())
        return load_data(RunSettings.from_config(config).corpus, data_dir)[0]
    return load_corpus(name, data_dir=data_dir)


if __name__ == "__main__":
    sys.exit(main())
