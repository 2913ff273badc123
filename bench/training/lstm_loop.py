"""The portable LSTM loop: Keras' RNN loop (`tflm.compat.rnn_loop`) against `keras.ops.scan`.

Why `WeightDropLSTM`'s portable path keeps Keras' private backend RNN loop (through
`tflm.compat`) instead of the public `keras.ops.scan`: one window forward + backward
(batch B, T steps, n units, input n, loss = sum of squared outputs), both loops with the
same step function, interleaved, median of the repeats, one process per backend (a compiled
function on TensorFlow and JAX, eager on PyTorch). Prints a table and writes it to
results/lstm_loop.md beside this script (`bench.harness.publish`).

    python -m bench.training.lstm_loop [--backends tensorflow,jax,torch] [--repeats 15]
"""

import argparse

from bench.harness import publish, results_path, run_backend_child

CHILD = r"""
import json, sys, time
import numpy as np
import keras
from keras import ops
from tflm import compat

args = json.loads(sys.argv[1])
B, T, N = args["batch"], args["steps"], args["units"]
rng = np.random.default_rng(0)
x = rng.normal(size=(B, T, N)).astype("float32")
W = keras.Variable(rng.normal(size=(N, 4 * N)).astype("float32") * 0.05)
U = keras.Variable(rng.normal(size=(N, 4 * N)).astype("float32") * 0.05)


def cell(z_x, h, c, u):
    z = z_x + ops.matmul(h, u)
    zi, zf, zc, zo = ops.split(z, 4, axis=-1)
    c = ops.sigmoid(zf) * c + ops.sigmoid(zi) * ops.tanh(zc)
    return ops.sigmoid(zo) * ops.tanh(c), c


def keras_rnn(x, u):
    def step(z_x, states):
        h, c = cell(z_x, states[0], states[1], u)
        return h, [h, c]
    zero = ops.zeros((B, N))
    _, outputs, _ = compat.rnn_loop(step, ops.matmul(x, W), [zero, zero], mask=None,
                                    go_backwards=False, unroll=False,
                                    zero_output_for_mask=True, return_all_outputs=True)
    return outputs


def ops_scan(x, u):
    def step(carry, z_x):
        h, c = cell(z_x, carry[0], carry[1], u)
        return (h, c), (h, c)  # TensorFlow's scan wants outputs shaped like the carry
    zero = ops.zeros((B, N))
    _, (outputs, _) = ops.scan(step, (zero, zero), ops.transpose(ops.matmul(x, W), (1, 0, 2)))
    return ops.transpose(outputs, (1, 0, 2))


backend = keras.backend.backend()


def runner(loop):
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(loop(x, U.value) ** 2)
            return loss, tape.gradient(loss, [W.value, U.value])
        return lambda: [t.numpy() for t in tf.nest.flatten(step(x))]
    if backend == "jax":
        import jax
        grad = jax.jit(jax.value_and_grad(lambda u, x: ops.sum(loop(x, u) ** 2)))
        return lambda: jax.block_until_ready(grad(U.value, x))
    import torch
    xt = torch.tensor(x)

    def step():
        U.value.grad = None
        (loop(xt, U.value) ** 2).sum().backward()
    return step


loops = {"keras rnn (compat)": runner(keras_rnn), "keras.ops.scan": runner(ops_scan)}
times = {name: [] for name in loops}
for run in loops.values():
    run(); run()  # compile / warm up
for _ in range(args["repeats"]):
    for name, run in loops.items():
        t0 = time.perf_counter(); run(); times[name].append(time.perf_counter() - t0)
print("RESULT " + json.dumps({name: float(np.median(t)) * 1000 for name, t in times.items()}))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="tensorflow,jax,torch")
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--steps", type=int, default=35)
    p.add_argument("--units", type=int, default=400)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", default=str(results_path(__file__, "lstm_loop.md")))
    args = p.parse_args(argv)
    rows = []
    for backend in args.backends.split(","):
        child = {k: getattr(args, k) for k in ("batch", "steps", "units", "repeats")}
        ms, why = run_backend_child(CHILD, backend, args.threads, child)
        if ms is None:
            rows.append(f"| {backend} | failed: {why} | | |")
            continue
        rnn, scan = ms["keras rnn (compat)"], ms["keras.ops.scan"]
        rows.append(f"| {backend} | {rnn:.1f} | {scan:.1f} | {scan / rnn:.2f}x |")
    table = "\n".join([
        f"Batch {args.batch}, {args.steps} steps, {args.units} units, forward + backward, "
        f"median of {args.repeats} interleaved repeats, {args.threads} thread(s).", "",
        "| backend | Keras rnn loop (ms) | keras.ops.scan (ms) | scan / rnn |",
        "| --- | --- | --- | --- |", *rows, ""])
    publish("Portable LSTM loop: Keras' RNN loop vs keras.ops.scan", table, args.results)


if __name__ == "__main__":
    main()
