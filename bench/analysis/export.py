"""Q_theta export throughput (rows/s) for PTB test with the `awd_lstm_ptb` preset shape.

Builds the preset's model (random weights: throughput does not depend on them), exports the
first `--rows` rows of the PTB test split (`--rows all`: every one of the 82,429) with
`tools.qmatrix.export_q` (batch-1 semantics, bptt 70, float32, streamed to a .npy) and
reports rows/s, the projected time for all 82,429 rows, and the process's peak RSS. Writes
the table to results/export.md beside this script (`bench.harness.publish`).

The first export of a process traces the window's `tf.function` (or compiles it, on JAX):
~0.4 s, a third of a 1,400-row export but 0.5% of the whole PTB test export. The table
therefore has both: the first export as a user runs it, and a second export of the same rows
in the same process (warm: the per-row cost the whole export converges to). The x-floor
ratios are per row of the warm export; the projected time is the first export's one-time
overhead plus every row at the warm rate.

With `--floor` it also measures, in the same process and thread pool, the arithmetic floor
of a batch-1 row: the recurrent matrix-vector products h_{t-1} U_l of every layer (read
once per token: memory bound), plus the per-window products a batch-1 pass can batch over
the window (every layer's input projection x W_l, the output layer h E^T + b and its
log_softmax, NumPy / OpenBLAS float32), divided by the window length; and with `--eager`
the export through the eager forward (what `export_q` ran before
`Backend.window_log_probs`).

    python -m bench.analysis.export [--rows 2000] [--floor] [--eager] [--data-dir DIR]
"""

import argparse
import os
import pathlib
import tempfile
import time

import numpy as np

from bench.harness import REPO, publish, results_path
from tools.frameworks.machine import peak_rss_mib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def floor_ms_per_row(model, bptt=70, repeats=20):
    """Milliseconds per batch-1 row of the products a row cannot avoid (module docstring)."""
    rng = np.random.default_rng(0)
    layers = [(int(w.shape[0]), int(w.shape[1])) for w in model.weights
              if "recurrent_kernel" in w.path]
    inputs = [(int(w.shape[0]), int(w.shape[1])) for w in model.weights
              if w.path.endswith("/kernel") and "lstm" in w.path.lower()]
    vocab = int(model.vocab_size)
    d_out = layers[-1][0]
    rec = [rng.random(shape, dtype=np.float32) for shape in layers]
    hs = [rng.random(shape[0], dtype=np.float32) for shape in layers]  # 1-D: sgemv
    ins = [(rng.random((bptt, shape[0]), dtype=np.float32),
            rng.random(shape, dtype=np.float32)) for shape in inputs]
    out_w = rng.random((d_out, vocab), dtype=np.float32)
    out_h = rng.random((bptt, d_out), dtype=np.float32)

    def recurrent():
        for u, h in zip(rec, hs):
            h @ u

    def window():
        for x, w in ins:
            x @ w
        logits = out_h @ out_w
        logits -= logits.max(axis=1, keepdims=True)
        np.log(np.exp(logits).sum(axis=1))

    def best(fn, n):
        fn()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    per_token = best(lambda: [recurrent() for _ in range(bptt)], repeats) / bptt
    per_window = best(window, repeats)
    return {"recurrent_ms": 1e3 * per_token, "window_ms": 1e3 * per_window / bptt,
            "floor_ms": 1e3 * (per_token + per_window / bptt),
            "recurrent_shapes": layers, "input_shapes": inputs}


def eager_rows_per_second(model, corpus, rows, bptt=70):
    """The export loop with the eager `forward_with_state` (no file: rows/s only)."""
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import keras
    ids = np.asarray(corpus.test, np.int32)
    states, start = None, 0
    begin = time.perf_counter()
    while start < rows:
        T = min(bptt, rows - start)
        log_probs, states = model.forward_with_state(ids[None, start:start + T], states,
                                                     training=False)
        keras.ops.convert_to_numpy(log_probs)
        start += T
    return rows / (time.perf_counter() - begin)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="2000", help='rows to export, or "all"')
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--results", default=str(results_path(__file__, "export.md")))
    p.add_argument("--floor", action="store_true", help="measure the arithmetic floor too")
    p.add_argument("--eager", action="store_true", help="time the eager export loop too")
    args = p.parse_args()
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import keras

    import zoo
    from tflm import data
    from tools.qmatrix import export_q
    corpus = data.load_corpus("ptb", data_dir=args.data_dir, download=False)
    model = zoo.from_preset("awd_lstm_ptb")
    model.build()
    out = pathlib.Path(tempfile.mkdtemp(prefix="export-")) / "q.npy"
    load = os.getloadavg()
    max_rows = None if args.rows == "all" else int(args.rows)
    meta = export_q(model, corpus, "test", out, max_rows=max_rows)
    warm = export_q(model, corpus, "test", out, max_rows=max_rows)
    rows = meta["shape"][0]
    warm_ms = 1e3 * warm["seconds"] / rows
    one_time_s = meta["seconds"] - warm["seconds"]
    rss = peak_rss_mib()
    rows_total = len(corpus.test) - 1
    lines = [
        f"KERAS_BACKEND={keras.backend.backend()}; load average at the start "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}.",
        "", "| rows exported | first export rows/s | second (warm) export rows/s | "
        "projected time for all 82,429 PTB test rows | peak RSS (MiB) | file |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        f"| {rows:,} | {meta['rows_per_second']:,.0f} | {warm['rows_per_second']:,.0f} | "
        f"{(max(one_time_s, 0.0) + rows_total * warm_ms / 1e3) / 60:.2f} min | {rss:,.0f} | "
        f"float32 .npy, {out.stat().st_size / 2**20:,.0f} MiB |", ""]
    ms = warm_ms
    if args.eager or args.floor:
        lines += ["| pass | ms per row | x floor |", "| --- | ---: | ---: |"]
        floor = floor_ms_per_row(model) if args.floor else None
        ratio = (lambda v: f"{v / floor['floor_ms']:.2f}") if floor else (lambda v: "-")
        first_ms = 1e3 / meta["rows_per_second"]
        lines.append(f"| export (`Backend.window_log_probs`), second (warm) export | {ms:.2f} | "
                     f"{ratio(ms)} |")
        lines.append(f"| export, first export (includes tracing the window function) | "
                     f"{first_ms:.2f} | {ratio(first_ms)} |")
        if args.eager:
            eager = 1e3 / eager_rows_per_second(model, corpus, rows)
            lines.append(f"| export loop, eager forward | {eager:.2f} | {ratio(eager)} |")
        if floor:
            lines += [f"| floor: recurrent matvecs {floor['recurrent_shapes']} per token | "
                      f"{floor['recurrent_ms']:.2f} | |",
                      f"| floor: input projections {floor['input_shapes']}, output layer and "
                      f"log_softmax per window / 70 | {floor['window_ms']:.2f} | |",
                      f"| floor (sum) | {floor['floor_ms']:.2f} | 1.00 |"]
        lines.append("")
    publish("Q_theta export throughput, awd_lstm_ptb shape", "\n".join(lines), args.results)
    out.unlink()


if __name__ == "__main__":
    main()
