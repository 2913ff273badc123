"""Host time a training step spends in `fit`'s callbacks: `zoo.train`'s callback list with
Keras' TensorBoard callback against the same list with `tflm.tensorboard.AsyncSafeTensorBoard`.

A model whose step costs almost nothing (one Dense layer, batch 8), so what is measured is
the loop around the step: fetching the batch, dispatching it, converting the logs and
calling the callbacks. Per backend, one process; each list fits `--steps` steps, the lists
interleaved `--repeats` times; the table gives the median milliseconds a step and where
the batch-end hooks ran (the main thread, or Keras' worker thread when every callback is
async-safe). Prints the table and writes it to results/callback_overhead.md beside this
script (`bench.harness.publish`).

    python -m bench.training.callback_overhead [--backends jax,torch,tensorflow] [--repeats 7]
"""

import argparse

from bench.harness import publish, results_path, run_backend_child

CHILD = r"""
import json, sys, tempfile, time
import numpy as np
import keras
from tflm.callbacks import HookThreads, StopOnNaN, WordsPerSecond
from tflm.tensorboard import AsyncSafeTensorBoard
from zoo.runtime import interrupt

args = json.loads(sys.argv[1])
steps, batch = args["steps"], 8
x = np.random.default_rng(0).normal(size=(steps * batch, 4)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")


def zoo_list(board_class, logs):
    return [interrupt.CheckCtrlC(), StopOnNaN(), WordsPerSecond(batch * steps),
            board_class(logs)]


lists = {"keras TensorBoard": lambda logs: zoo_list(keras.callbacks.TensorBoard, logs),
         "AsyncSafeTensorBoard": lambda logs: zoo_list(AsyncSafeTensorBoard, logs)}
times = {name: [] for name in lists}
threads = {}
model.fit(x, x[:, :1], batch_size=batch, epochs=1, verbose=0)  # compile
for repeat in range(args["repeats"] + 1):
    for name, make in lists.items():
        probe = HookThreads()
        with tempfile.TemporaryDirectory() as logs:
            callbacks = make(logs) + [probe]
            t0 = time.perf_counter()
            model.fit(x, x[:, :1], batch_size=batch, epochs=1, verbose=0, shuffle=False,
                      callbacks=callbacks)
            seconds = time.perf_counter() - t0
        if repeat:  # the first round warms up TensorBoard's writers and imports
            times[name].append(seconds / steps)
        threads[name] = probe.where
print("RESULT " + json.dumps({name: [float(np.median(t)) * 1000, threads[name]]
                              for name, t in times.items()}))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="jax,torch,tensorflow")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", default=str(results_path(__file__, "callback_overhead.md")))
    args = p.parse_args(argv)
    rows = []
    for backend in args.backends.split(","):
        child = {k: getattr(args, k) for k in ("steps", "repeats")}
        result, why = run_backend_child(CHILD, backend, args.threads, child)
        if result is None:
            rows.append(f"| {backend} | failed: {why} | | |")
            continue
        (keras_ms, keras_where), (safe_ms, safe_where) = (
            result["keras TensorBoard"], result["AsyncSafeTensorBoard"])
        rows.append(f"| {backend} | {keras_ms:.2f} ({keras_where}) | {safe_ms:.2f} "
                    f"({safe_where}) | {safe_ms / keras_ms:.2f}x |")
    table = "\n".join([
        f"A one-Dense-layer model, batch 8, {args.steps} steps a fit, median of "
        f"{args.repeats} interleaved fits, {args.threads} thread(s). The "
        "callbacks: zoo.train's (CheckCtrlC, StopOnNaN, WordsPerSecond) and a TensorBoard "
        "callback with its defaults; in brackets, the thread the batch-end hooks ran on.", "",
        "| backend | Keras TensorBoard (ms a step) | AsyncSafeTensorBoard (ms a step) | "
        "ratio |", "| --- | --- | --- | --- |", *rows, ""])
    publish("Host time of a training step in fit's callbacks", table, args.results)


if __name__ == "__main__":
    main()
