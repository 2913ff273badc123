"""Idle time after the last batch of `model.evaluate` over `tflm.data.lm_dataset`, with
TensorFlow's tf.data autotuning on and off.

With autotuning on (the pipeline used to be `map(num_parallel_calls=AUTOTUNE)
.prefetch(AUTOTUNE)`), TensorFlow 2.21 keeps the iterator alive until its autotuning
thread's current sleep ends; the sleeps double from 10 ms, so a pass lasted until the next
(2^n - 1) x 10 ms boundary with the CPU idle after `on_test_end`. `lm_dataset` now turns
autotuning off; `--pipeline autotune` rebuilds the old pipeline for comparison.

    python -m bench.training.data_pipeline [--passes 8] [--tokens 30000]

Prints a table (per pipeline: median / max pass time, median / max idle after
`on_test_end`, passes with more than 50 ms idle) and writes it to results/data_pipeline.md
beside this script (`bench.harness.publish`; `--results`).
"""

import argparse
import os
import time

import numpy as np

from bench.harness import publish, results_path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def autotuned(ids, batch, bptt):
    """The pipeline as it was: the same windows, autotuned map and prefetch."""
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import tensorflow as tf
    from tflm.data import lm_windows
    windows = list(lm_windows(ids, batch, bptt, train=False))
    xs = [x for x, _ in windows]
    ys = [y for _, y in windows]
    ds = tf.data.Dataset.from_tensor_slices(np.arange(len(xs)))
    x_all = tf.ragged.constant([x.tolist() for x in xs]) if len({x.shape for x in xs}) > 1 \
        else tf.constant(np.stack(xs))
    y_all = tf.ragged.constant([y.tolist() for y in ys]) if len({y.shape for y in ys}) > 1 \
        else tf.constant(np.stack(ys))

    def take(i):
        x, y = x_all[i], y_all[i]
        if isinstance(x, tf.RaggedTensor):
            x, y = x.to_tensor(), y.to_tensor()
        return x, y

    return ds.map(take, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=True).prefetch(tf.data.AUTOTUNE)


def measure(model, ds, passes):
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import keras
    model.evaluate(ds, verbose=0)  # trace
    rows = []
    for _ in range(passes):
        mark = {}

        class Mark(keras.callbacks.Callback):
            def on_test_end(self, logs=None):
                mark["t"] = time.perf_counter()

        start = time.perf_counter()
        model.evaluate(ds, verbose=0, callbacks=[Mark()])
        end = time.perf_counter()
        rows.append((end - start, end - mark["t"]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=30_000)
    parser.add_argument("--results", default=str(results_path(__file__, "data_pipeline.md")))
    args = parser.parse_args(argv)

    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import tensorflow as tf
    import zoo
    from tflm.data import lm_dataset

    ids = np.random.default_rng(0).integers(0, 500, args.tokens)
    model = zoo.AWDLSTM(500, embed_dim=16, hidden_dim=128, num_layers=2)
    model.compile(optimizer="sgd")
    load = os.getloadavg()
    lines = [f"TensorFlow {tf.__version__}. Load average at the start: "
             f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}.", "",
             f"AWD-LSTM 16 / 128 x 2, V = 500, softmax; {args.tokens:,} random tokens at batch "
             f"10, bptt 35; {args.passes} timed passes after one untimed. Idle = wall time from "
             "`on_test_end` to `evaluate` returning.", "",
             "| pipeline | pass s (median) | pass s (max) | idle s (median) | idle s (max) | "
             "passes idle > 50 ms |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, ds in (("autotuned (before)", autotuned(ids, 10, 35)),
                     ("lm_dataset (autotune off)", lm_dataset(ids, 10, 35, train=False))):
        rows = np.array(measure(model, ds, args.passes))
        lines.append(f"| {name} | {np.median(rows[:, 0]):.2f} | {rows[:, 0].max():.2f} | "
                     f"{np.median(rows[:, 1]):.3f} | {rows[:, 1].max():.3f} | "
                     f"{int((rows[:, 1] > 0.05).sum())} / {len(rows)} |")
    publish("model.evaluate idle time per data pipeline", "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
