"""A Mogrifier LSTM training step against an AWD-LSTM step of the same parameter count.

Both models: V words, 2 layers, tied embedding the size of the layers, Adam, all their
dropouts on, one random window (batch B, bptt T) trained with `train_on_batch` (state
carried); the Mogrifier (`zoo.MogrifierLM`, r rounds of rank k, lamb's wiring) at hidden
size H, the AWD-LSTM (`zoo.AWDLSTM`, weight-dropped LSTMs, AR / TAR) at the hidden size whose
parameter count is nearest. Median step time after warm-up, one fresh process per variant:
TensorFlow with Keras' `jit_compile="auto"` (a CPU: the graph without XLA) and with
`jit_compile=True` (the step compiled by XLA), and JAX (always jitted); the Mogrifier's
compiled paths besides XLA (it has no fused kernel: x^up depends on h_{t-1}) are the
"-unroll" variants, its time loop written out step by step (`unroll=True`, Keras' LSTM
option). The column "vs its loop" divides the Mogrifier's step by its step in the same
backend's plain variant (tensorflow for the TensorFlow variants, jax for jax-unroll).
Prints a table and writes it to results/mogrifier_step.md beside this script
(`bench.harness.publish`).

    python -m bench.training.mogrifier_step [--hidden 256] [--batch 32] [--bptt 35]
        [--rank 24] [--steps 5] [--variants tensorflow,tensorflow-xla,...] [--threads 2]
"""

import argparse

from bench.harness import publish, results_path, run_backend_child

CHILD = r"""
import json, sys, time
import numpy as np
import keras
from tflm.optimizers import Adam
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
from zoo.models.mogrifier.mogrifier_lm import MogrifierLM

a = json.loads(sys.argv[1])
keras.utils.set_random_seed(0)
V, B, T, H = a["vocab"], a["batch"], a["bptt"], a["hidden"]
if a["model"] == "mogrifier":
    model = MogrifierLM(V, embed_dim=H, hidden_dim=H, num_layers=2, rounds=a["rounds"],
                        rank=a["rank"], input_dropout=0.5, inter_layer_dropout=0.3,
                        state_dropout=0.3, output_dropout=0.5, bptt=T, unroll=a["unroll"])
else:
    model = AWDLSTM(V, embed_dim=H, hidden_dim=H, num_layers=2, bptt=T)
model.compile(optimizer=Adam(1e-3), jit_compile=a["jit"])
model.build()
rng = np.random.default_rng(0)
x = rng.integers(0, V, (B, T)).astype("int32")
y = rng.integers(0, V, (B, T)).astype("int32")
times = []
for _ in range(a["warmup"] + a["steps"]):
    t0 = time.perf_counter()
    logs = model.train_on_batch(x, y, return_dict=True)
    float(logs["loss"])
    times.append(time.perf_counter() - t0)
print("RESULT " + json.dumps({"ms": float(np.median(times[a["warmup"]:])) * 1000,
                              "first_ms": times[0] * 1000, "params": model.count_params()}))
"""

# variant: (backend, jit_compile, the Mogrifier's unroll)
VARIANTS = {"tensorflow": ("tensorflow", "auto", False),
            "tensorflow-xla": ("tensorflow", True, False),
            "tensorflow-xla-unroll": ("tensorflow", True, True),
            "jax": ("jax", "auto", False), "jax-unroll": ("jax", "auto", True),
            "torch": ("torch", "auto", False)}


def mogrifier_count(vocab, hidden, rounds, rank):
    """Parameters of the benchmark's `MogrifierLM` (tied, embedding = hidden, 2 layers)."""
    mog = sum((rank * 2 * hidden if rank else hidden * hidden) + hidden for _ in range(rounds))
    return vocab * hidden + vocab + 2 * (8 * hidden * hidden + 4 * hidden + mog)


def awd_count(vocab, hidden):
    """Parameters of the benchmark's `AWDLSTM` (tied, embedding = hidden, 2 layers, one
    Keras bias per LSTM)."""
    return vocab * hidden + vocab + 2 * (8 * hidden * hidden + 4 * hidden)


def matching_awd_hidden(vocab, hidden, rounds, rank):
    """The AWD-LSTM hidden size whose count is nearest the Mogrifier's."""
    target = mogrifier_count(vocab, hidden, rounds, rank)
    return min(range(hidden, 4 * hidden), key=lambda h: abs(awd_count(vocab, h) - target))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rank", type=int, default=24)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="tensorflow,tensorflow-xla,tensorflow-xla-unroll,"
                                         "jax,jax-unroll")
    p.add_argument("--results", default=str(results_path(__file__, "mogrifier_step.md")))
    p.add_argument("--no-publish", action="store_true", help="print only")
    args = p.parse_args(argv)
    awd_hidden = matching_awd_hidden(args.vocab, args.hidden, args.rounds, args.rank)
    rows, mogrifier_ms = [], {}
    for variant in args.variants.split(","):
        backend, jit, unroll = VARIANTS[variant]
        measured = {}
        for model, hidden in (("awd_lstm", awd_hidden), ("mogrifier", args.hidden)):
            payload = dict(model=model, hidden=hidden, jit=jit, unroll=unroll,
                           vocab=args.vocab, rounds=args.rounds, rank=args.rank,
                           batch=args.batch, bptt=args.bptt, steps=args.steps,
                           warmup=args.warmup)
            measured[model], why = run_backend_child(CHILD, backend, args.threads, payload)
            if measured[model] is None:
                measured[model] = {"failed": why}
        awd, mog = measured["awd_lstm"], measured["mogrifier"]
        if "failed" in awd or "failed" in mog:
            rows.append(f"| {variant} | failed: {awd.get('failed') or mog.get('failed')} "
                        "| | | | | |")
            continue
        mogrifier_ms[variant] = mog["ms"]
        plain = mogrifier_ms.get(backend)  # the backend's plain variant, when measured
        versus = f"{mog['ms'] / plain:.2f}x" if plain and variant != backend else "-"
        words = args.batch * args.bptt
        rows.append(f"| {variant} | {awd['ms']:.0f} ({words / awd['ms'] * 1000:,.0f} w/s) "
                    f"| {mog['ms']:.0f} ({words / mog['ms'] * 1000:,.0f} w/s) "
                    f"| {mog['ms'] / awd['ms']:.2f}x | {versus} | {awd['first_ms'] / 1000:.1f} / "
                    f"{mog['first_ms'] / 1000:.1f} | {awd['params']:,} / {mog['params']:,} |")
    body = "\n".join([
        f"V = {args.vocab:,}, 2 layers, tied embedding = hidden size; AWD-LSTM at hidden "
        f"{awd_hidden} against the Mogrifier at hidden {args.hidden} with {args.rounds} "
        f"rounds of rank {args.rank} (the nearest parameter count); batch {args.batch}, bptt "
        f"{args.bptt}, Adam, dropouts on; median of {args.steps} steps after {args.warmup} "
        f"warm-up steps, {args.threads} thread(s), one process per cell.", "",
        "| variant | AWD-LSTM step (ms) | Mogrifier step (ms) | Mogrifier / AWD | Mogrifier vs "
        "its loop | first step (s, AWD / Mog) | parameters (AWD / Mog) |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows, ""])
    publish("Mogrifier LSTM training step vs AWD-LSTM at equal parameters", body,
            None if args.no_publish else args.results)


if __name__ == "__main__":
    main()
