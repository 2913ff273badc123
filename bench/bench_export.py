"""Q_theta export throughput (rows/s) for PTB test with the `awd_lstm_ptb` preset shape.

Builds the preset's model (random weights: throughput does not depend on them), exports the
first `--rows` rows of the PTB test split with `tools.qmatrix.export_q` (batch-1 semantics,
bptt 70, float32, streamed to a memory-mapped .npy) and reports rows/s, the projected time
for all 82,429 rows, and the process's peak RSS. Appends a table to bench/RESULTS.md.

    python bench/bench_export.py [--rows 2000] [--data-dir DIR]
"""

import argparse
import os
import pathlib
import resource
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from machine import cpu_model, publish  # noqa: E402
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = p.parse_args()
    import keras

    import zoo
    from tflm import data
    from tools.qmatrix import export_q
    corpus = data.load_corpus("ptb", data_dir=args.data_dir, download=False)
    model = zoo.from_preset("awd_lstm_ptb")
    model.build()
    out = pathlib.Path(tempfile.mkdtemp(prefix="export-")) / "q.npy"
    meta = export_q(model, corpus, "test", out, max_rows=args.rows)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows_total = len(corpus.test) - 1
    cpu = cpu_model()
    table = "\n".join([
        f"### Q_theta export throughput, awd_lstm_ptb shape ({time.strftime('%Y-%m-%d')}, "
        f"KERAS_BACKEND={keras.backend.backend()})", "",
        f"`python bench/bench_export.py --rows {args.rows}` on {cpu}, {os.cpu_count()} cores.",
        "", "| rows exported | rows/s | projected time for all 82,429 PTB test rows | "
        "peak RSS (MiB) | file |", "| --- | --- | --- | --- | --- |",
        f"| {meta['shape'][0]:,} | {meta['rows_per_second']:,.0f} | "
        f"{rows_total / meta['rows_per_second'] / 60:.1f} min | {rss:,.0f} | "
        f"float32 .npy, {out.stat().st_size / 2**20:,.0f} MiB |", ""])
    publish(table, args.results)
    out.unlink()


if __name__ == "__main__":
    main()
