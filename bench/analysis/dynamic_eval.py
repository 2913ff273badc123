"""Dynamic evaluation cost at the MoS PTB preset size, next to plain batch-1 evaluation.

Builds `awd_lstm_mos_ptb` (random weights: the cost does not depend on them) and times, on
the PTB splits:
  - plain evaluation of the first `--tokens` test tokens at batch 1, bptt 70 (the test
    protocol of `python -m zoo.evaluate`), and the same at bptt 5;
  - the gradient-statistics pass of dynamic evaluation for `--windows` training windows
    (batch 100, bptt 5; the whole PTB training split is 1,859 windows);
  - dynamic evaluation of the first `--tokens` test tokens (batch 1, bptt 5);
and projects each to the whole split (82,430 test tokens). A first short call of each warms
up the compiled steps and is not timed. Writes the table to results/dynamic_eval.md beside
this script (`bench.harness.publish`).

    python -m bench.analysis.dynamic_eval [--tokens 1000] [--windows 20] [--data-dir DIR]
"""

import argparse
import os
import time

import numpy as np

from bench.harness import REPO, publish, results_path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TRAIN_WINDOWS = 1859  # PTB train, 929,589 tokens in 100 streams, windows of 5


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--windows", type=int, default=20)
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--results", default=str(results_path(__file__, "dynamic_eval.md")))
    args = p.parse_args()
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import keras

    import zoo
    from tflm import data
    from zoo import dynamic_eval as de

    corpus = data.load_corpus("ptb", data_dir=args.data_dir, download=False)
    test = np.asarray(corpus.test)
    full = len(test) - 1
    model = zoo.from_preset("awd_lstm_mos_ptb")
    model.build()
    model.compile()
    rows = []

    def plain(bptt):
        ids = test[:args.tokens + 1]
        ds = data.lm_dataset(ids, 1, bptt, train=False)
        model.evaluate(data.lm_dataset(test[:2 * bptt + 1], 1, bptt, train=False), verbose=0)
        start = time.perf_counter()
        model.evaluate(ds, verbose=0)
        return time.perf_counter() - start

    for bptt in (70, 5):
        seconds = plain(bptt)
        rows.append((f"plain evaluation, batch 1, bptt {bptt}", args.tokens, seconds,
                     args.tokens / seconds, full / (args.tokens / seconds)))

    settings = de.Settings(**{k: v for k, v in model_settings().items()})
    warm = de.Settings(**{**vars(settings), "max_batches": 2})
    de.gradient_statistics(model, corpus.train, warm)
    settings.max_batches = args.windows
    start = time.perf_counter()
    stats = de.gradient_statistics(model, corpus.train, settings)
    seconds = time.perf_counter() - start
    words = args.windows * settings.batch_size * settings.bptt
    rows.append((f"gradient statistics, batch {settings.batch_size}, bptt {settings.bptt}",
                 words, seconds, words / seconds,
                 TRAIN_WINDOWS * seconds / args.windows))
    de.dynamic_evaluate(model, test[:2 * settings.bptt + 1], settings, stats)
    result = de.dynamic_evaluate(model, test[:args.tokens + 1], settings, stats)
    rows.append((f"dynamic evaluation, batch 1, bptt {settings.bptt}", args.tokens,
                 result["seconds"], result["words_per_second"],
                 full / result["words_per_second"]))

    title = (f"Dynamic evaluation, awd_lstm_mos_ptb size ({model.count_params():,} "
             f"parameters, {len(model.trainable_variables)} tensors), Keras backend "
             f"{keras.backend.backend()}")
    lines = ["The last column projects the measured rate to the whole split (82,429 test "
             "positions; 1,859 statistics windows).", "",
             "| pass | words timed | seconds | words/s | whole split (min) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, words, seconds, rate, whole in rows:
        lines.append(f"| {name} | {words:,} | {seconds:.1f} | {rate:,.0f} | "
                     f"{whole / 60:.1f} |")
    publish(title, "\n".join(lines), args.results)


def model_settings():
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    from zoo.presets import load_preset
    section = load_preset("awd_lstm_mos_ptb")["dynamic_evaluation"]
    return {k: section[k] for k in ("lamb", "lr", "epsilon", "batch_size", "bptt")}


if __name__ == "__main__":
    main()
