"""`steps_per_execution` on JAX: k training windows in one compiled scan
(`tflm.backends.scanned_steps`) against one dispatch a window, the same model side by side.

Per size, two models of one seed, built and compiled as `python -m zoo.train` builds them
(`zoo.runs.builders`: the preset's head, dropouts, optimizer and batch), one with
`steps_per_execution=1` and one with k, train on the same random-length windows of random
tokens (`tflm.data.lm_batches`, padded as `zoo.train` pads them: to a multiple of 4 and to
bptt + 3.5 standard deviations) with `zoo.train`'s per-batch callbacks (Ctrl-C check, NaN
check, words/s), in a process set up as `zoo.train`'s
(`zoo.runtime.command.start_command`). Each fits one epoch to compile, then they fit
`--repeats` epochs each, interleaved; the table gives the median seconds a window and their
ratio, the first epoch's seconds (the compile), and the two models' largest weight
difference after the same epochs (the scan's updates are the single steps'). `--sizes`:

    tiny     awd_lstm_ptb at embed 16, hidden 16 x 3, vocabulary 100, bptt 35: a step that
             costs almost nothing, so the loop around it is what is timed (host-bound)
    bench    awd_lstm_ptb at 200 / 400 x 3, vocabulary 10,000, bptt 35 (reference_throughput's)
    preset   awd_lstm_ptb as it is: 400 / 1150 x 3, batch 20, bptt 70 (a GPU's)
    mos      awd_lstm_mos_ptb as it is: 280 / 960 / 620, 15 experts, batch 12, bptt 70

    KERAS_BACKEND=jax python -m bench.training.steps_per_execution [--sizes tiny bench] \
        [--k 8] [--windows 80] [--repeats 5] [--device cpu|gpu] [--results FILE]
"""

import argparse
import json
import os
import pathlib
import statistics
import time

from bench.harness import publish, results_path
from zoo.runtime.command import imports_done, run_command, start_command

# A preset and `--set` overrides each: `tiny` shrinks awd_lstm_ptb until its step costs
# almost nothing, so what is timed is the loop around the step (host-bound).
SIZES = {
    "tiny": ("awd_lstm_ptb", ["model.embed_dim=16", "model.hidden_dim=16",
                              "training.bptt=35"], 100),
    "bench": ("awd_lstm_ptb", ["model.embed_dim=200", "model.hidden_dim=400",
                               "training.bptt=35"], 10_000),
    "preset": ("awd_lstm_ptb", [], 10_000),
    "mos": ("awd_lstm_mos_ptb", [], 10_000),
}


def _models(name, k):
    """Two models as `python -m zoo.train` builds them (`zoo.runs.builders`), one seed, one
    compiled with `steps_per_execution` 1 and one with k; and their training settings."""
    # deferred: Keras and what imports it come after the process set-up (start_command)
    import keras
    from zoo.runs.builders import build_model, make_optimizer, pad_to_multiple, \
        set_window_shapes
    from zoo.runs.config import resolve_config
    from zoo.runs.settings import RunSettings

    preset, overrides, vocab = SIZES[name]
    settings = RunSettings.from_config(resolve_config(preset, overrides))
    made = {}
    for steps in (1, k):
        keras.utils.set_random_seed(141)
        model = build_model(settings, vocab)
        model.compile(optimizer=make_optimizer(settings.training),
                      steps_per_execution=steps)
        model.build((None, None))
        set_window_shapes(model, settings.training, pad_to_multiple(settings.training))
        made[steps] = model
    return made, settings.training, vocab


def measure(name, k, windows, repeats):
    """{"one", "k"}: median seconds a window; "first_one", "first_k": the first epoch's
    seconds (the compiles); "diff": the weights' largest difference; the sizes."""
    # deferred: Keras and what imports it come after the process set-up (start_command)
    import keras
    import numpy as np
    from tflm import data
    from tflm.callbacks import StopOnNaN, WordsPerSecond
    from zoo.runtime import interrupt

    models, training, vocab = _models(name, k)
    batch, bptt = training.batch_size, training.bptt
    ids = np.random.default_rng(0).integers(0, vocab, batch * bptt * windows).astype("int32")
    seconds = {steps: [] for steps in models}
    first = {}
    for epoch in range(repeats + 1):  # epoch 0 compiles
        batches = data.lm_batches(ids, batch, bptt, train=True, seed=1, epoch=epoch,
                                  pad_to_multiple=4, max_len=training.max_seq_len)
        for steps, model in models.items():
            callbacks = [interrupt.CheckCtrlC(), StopOnNaN(),
                         WordsPerSecond(batch * bptt * windows)]
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
            "first_one": first[1], "first_k": first[k], "diff": diff,
            "traces": [m.traced_steps["train"] for m in models.values()],
            "batch": batch, "bptt": bptt, "vocab": vocab,
            "preset": SIZES[name][0], "overrides": SIZES[name][1]}


def table(results, k, windows, repeats, device):
    lines = [
        f"JAX on the {device.upper()}; each size's model as `zoo.train` builds its preset "
        f"(dropouts on), {windows} bptt-long windows' worth of random tokens an epoch, in "
        f"random-length windows; one epoch to compile, then the median of {repeats} "
        f"interleaved epochs. ms = a window's share of the epoch; first epoch = its "
        f"seconds, the compile included; traces = the train step's traces (1: one program "
        f"each).", "",
        f"| size (preset, changes; batch x bptt) | k = 1 (ms a window) | k = {k} (ms a "
        f"window) | speed, k = {k} / 1 | first epoch s, k = 1 / {k} | largest weight difference "
        f"| traces |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in results.items():
        what = ", ".join([r["preset"], *r["overrides"]])
        lines.append(f"| {name} ({what}; {r['batch']} x {r['bptt']}) | "
                     f"{r['one'] * 1000:.2f} | {r['k'] * 1000:.2f} | "
                     f"{r['one'] / r['k']:.2f}x | {r['first_one']:.1f} / "
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
    import keras  # deferred: after that set-up
    if keras.backend.backend() != "jax":
        p.error(f"this benchmark measures JAX; run it with KERAS_BACKEND=jax (got "
                f"{keras.backend.backend()!r})")
    imports_done()
    results = {}
    for name in args.sizes:
        results[name] = measure(name, args.k, args.windows, args.repeats)
        print(name, json.dumps(results[name]), flush=True)
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"k": args.k, "results": results}, f, indent=1)
    publish(f"steps_per_execution {args.k} against 1 on JAX ({args.device})",
            table(results, args.k, args.windows, args.repeats, args.device),
            None if args.no_publish else args.results)
    return 0


if __name__ == "__main__":
    run_command(main)
