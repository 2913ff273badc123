"""Text generation speed: `model.generate` (a compiled predict step per window, the state
carried, the draw on the host) against the loop it replaced (one eager
`forward_with_state` call per word), per Keras backend, side by side in one run.

    python -m bench.inference.generation [--backends tensorflow jax torch] [--words 200]
        [--vocab 10000] [--hidden 200] [--threads 2]

The model is an untrained `zoo.AWDLSTM` at the given sizes (the speed does not depend on the
weights); both loops generate `--words` words from the same prompt with the same seed (the
words are checked equal), after one warm-up generation each (the compiles). Prints ms per
word and the ratio, and writes results/generation.md.
"""

import argparse
import sys

from bench.harness import publish, results_path, run_backend_child

CHILD = r"""
import json, sys, time
import numpy as np
import keras
import zoo
from tflm import samplers

args = json.loads(sys.argv[1])
keras.utils.set_random_seed(0)
model = zoo.AWDLSTM(args["vocab"], embed_dim=args["hidden"], hidden_dim=args["hidden"],
                    num_layers=2)
model.build((None, None))
sampler, prompt, words = samplers.RandomSampler(), [1, 2, 3], args["words"]

def eager(n):
    rng = np.random.Generator(np.random.PCG64(5))
    log_probs, states = model.forward_with_state(np.array([prompt], np.int32))
    out = list(prompt)
    for _ in range(n):
        row = np.asarray(keras.ops.convert_to_numpy(log_probs), np.float64)[:, -1]
        out.append(int(sampler(row, rng)[0]))
        log_probs, states = model.forward_with_state(np.array([[out[-1]]], np.int32), states)
    return out

def compiled(n):
    return model.generate([prompt], max_length=len(prompt) + n, sampler=sampler, seed=5)[0]

result = {}
for name, loop in (("eager", eager), ("generate", compiled)):
    loop(5)  # compiles / first calls
    start = time.perf_counter()
    out = loop(words)
    result[name] = (time.perf_counter() - start) / words * 1000
    result[name + "_words"] = out
result["same_words"] = result.pop("eager_words") == result.pop("generate_words")
print("RESULT " + json.dumps(result))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    p.add_argument("--words", type=int, default=200)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--results", default=str(results_path(__file__, "generation.md")))
    args = p.parse_args(argv)
    rows = ["| backend | eager loop, ms / word | model.generate, ms / word | speed-up | "
            "same words |", "| --- | ---: | ---: | ---: | --- |"]
    for backend in args.backends:
        result, why = run_backend_child(CHILD, backend, args.threads,
                                        {"vocab": args.vocab, "hidden": args.hidden,
                                         "words": args.words})
        if result is None:
            rows.append(f"| {backend} | failed: {why} | | | |")
            continue
        rows.append(f"| {backend} | {result['eager']:.1f} | {result['generate']:.1f} | "
                    f"{result['eager'] / result['generate']:.1f}x | "
                    f"{'yes' if result['same_words'] else 'NO'} |")
        print(rows[-1], flush=True)
    body = (f"Untrained zoo.AWDLSTM, vocabulary {args.vocab}, 2 x {args.hidden} LSTM, batch 1, "
            f"{args.words} words after a warm-up generation; {args.threads} CPU threads.\n\n"
            + "\n".join(rows) + "\n")
    publish("Text generation: model.generate against an eager call per word", body,
            args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
