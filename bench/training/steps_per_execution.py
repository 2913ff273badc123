"""`steps_per_execution` on JAX: k training windows in one compiled scan
(`tflm.backends.scanned_steps`) against one dispatch a window, the same model side by side.

Per size, two AWD-LSTMs of one seed, one compiled with `steps_per_execution=1` and one with
k, train on the same random-length windows (`tflm.data.lm_batches`, padded as
`python -m zoo.train` pads them: to a multiple of 4 and to bptt + 3.5 standard deviations)
with `zoo.train`'s per-batch callbacks (Ctrl-C check, NaN check, words/s), in a process set
up as `zoo.train`'s (`zoo.runtime.command.start_command`). Each fits one
epoch to compile, then they fit `--repeats` epochs each, interleaved; the table gives the
median seconds a window and their ratio, and the two models' largest weight difference
after the same epochs (the scan's updates are the single steps'). `--sizes`:

    tiny     embed 16, hidden 16 x 3, vocabulary 100, batch 20, bptt 35: a step that costs
             almost nothing, so the loop around it is what is timed (host-bound)
    bench    200 / 400 x 3, vocabulary 10,000, batch 20, bptt 35: reference_throughput's
    preset   awd_lstm_ptb's 400 / 1150 x 3, vocabulary 10,000, batch 20, bptt 70 (a GPU's)

    KERAS_BACKEND=jax python -m bench.training.steps_per_execution [--sizes tiny bench] \
        [--k 8] [--windows 80] [--repeats 5] [--device cpu|gpu] [--results FILE]
"""

import argparse
import json
import os
import statistics
import time

from bench.harness import publish, results_path
from zoo.runtime.command import imports_done, run_command, start_command

SIZES = {
    "tiny": dict(embed_dim=16, hidden_dim=16, vocab=100, bptt=35),
    "bench": dict(embed_dim=200, hidden_dim=400, vocab=10_000, bptt=35),
    "preset": dict(embed_dim=400, hidden_dim=1150, vocab=10_000, bptt=70),
}
BATCH = 20


def _models(size, k):
    import keras
    from tflm import data
    from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

    made = {}
    for steps in (1, k):
        keras.utils.set_random_seed(141)
        model = AWDLSTM(vocab_size=size["vocab"], embed_dim=size["embed_dim"],
                        hidden_dim=size["hidden_dim"], num_layers=3, bptt=size["bptt"],
                        seed=141)
        model.compile(optimizer=keras.optimizers.SGD(30.0), steps_per_execution=steps)
        model.pad_to_compiled_lengths = True
        model.shortest_compiled_length = data.padded_length(
            data.covering_length(size["bptt"]), 4)
        made[steps] = model
    return made


def measure(name, k, windows, repeats):
    """{"one", "k"}: median seconds a window; "first_one", "first_k": the first epoch's
    seconds (the compiles); "diff": the weights' largest difference."""
    import keras
    import numpy as np
    from tflm import data
    from tflm.callbacks import StopOnNaN, WordsPerSecond
    from zoo.runtime import interrupt

    size = SIZES[name]
    ids = np.random.default_rng(0).integers(0, size["vocab"], BATCH * size["bptt"] * windows
                                            ).astype("int32")
    models = _models(size, k)
    seconds = {steps: [] for steps in models}
    first = {}
    for epoch in range(repeats + 1):  # epoch 0 compiles
        batches = data.lm_batches(ids, BATCH, size["bptt"], train=True, seed=1, epoch=epoch,
                                  pad_to_multiple=4)
        for steps, model in models.items():
            callbacks = [interrupt.CheckCtrlC(), StopOnNaN(),
                         WordsPerSecond(BATCH * size["bptt"] * windows)]
            start = time.perf_counter()
            model.fit(batches, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            took = time.perf_counter() - start
            if epoch:
                seconds[steps].append(took / len(batches))
            else:
                first[steps] = took
    weights = [[keras.ops.convert_to_numpy(v) for v in m.trainable_variables]
               for m in models.values()]
    diff = max(float(np.abs(a - b).max()) for a, b in zip(*weights))
    return {"one": statistics.median(seconds[1]), "k": statistics.median(seconds[k]),
            "first_one": first[1], "first_k": first[k], "diff": diff, "traces": [m.traced_steps["train"] for m in models.values()]}


def table(results, k, windows, repeats, device):
    lines = [
        f"JAX on the {device.upper()}, AWD-LSTM (3 layers, zoo.AWDLSTM's default "
        f"dropouts), batch {BATCH}, {windows} windows' worth of random-length windows an epoch; one epoch to compile, "
        f"then the median of {repeats} interleaved epochs. ms = a window's share of the "
        f"epoch; first epoch = its seconds, the compile included; traces = the train step's "
        f"traces (1: one program each).", "",
        f"| size | k = 1 (ms a window) | k = {k} (ms a window) | k = {k} vs 1 | first epoch "
        f"s, k = 1 / {k} | largest weight difference | traces |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['one'] * 1000:.2f} | {r['k'] * 1000:.2f} | "
                     f"{r['one'] / r['k']:.2f}x faster | {r['first_one']:.1f} / "
                     f"{r['first_k']:.1f} | {r['diff']:.1e} | "
                     f"{r['traces'][0]} / {r['traces'][1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["tiny", "bench"])
    p.add_argument("--k", type=int, default=8, help="steps_per_execution (default 8)")
    p.add_argument("--windows", type=int, default=80,
                   help="bptt-long windows' worth of tokens an epoch (default 80)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--results", default=str(results_path(__file__, "steps_per_execution.md")))
    p.add_argument("--no-publish", action="store_true")
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if args.k < 2:
        p.error(f"--k must be 2 or more (it is compared with 1); got {args.k}")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    start_command()  # zoo.train's process set-up: malloc, XLA flags, the collector
    import keras
    if keras.backend.backend() != "jax":
        p.error(f"this benchmark measures JAX; run it with KERAS_BACKEND=jax (got "
                f"{keras.backend.backend()!r})")
    imports_done()
    results = {}
    for name in args.sizes:
        results[name] = measure(name, args.k, args.windows, args.repeats)
        print(name, json.dumps(results[name]), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"k": args.k, "results": results}, f, indent=1)
    publish(f"steps_per_execution {args.k} against 1 on JAX ({args.device})",
            table(results, args.k, args.windows, args.repeats, args.device),
            None if args.no_publish else args.results)
    return 0


if __name__ == "__main__":
    run_command(main)
