"""The softmax bottleneck, shown on a language whose truth is known.

A first-order Markov language over V = 200 words whose transitions are a mixture of four
rank-6 softmaxes has a full-rank (200) log-probability matrix. Two one-layer AWD-LSTMs with
d = 8 dimensional context vectors are trained the same way, one with a softmax head and one
with a 4-component Mixture of Softmaxes. The softmax head's Q_theta cannot have rank above
d + 2 = 10 and its perplexity stalls; MoS's Q_theta is (numerically) full rank and it gets
closer to the optimal perplexity.

    python -m tools.bottleneck_demo [--epochs 16] [--seed 0]

prints, for each head, validation perplexity, the optimal perplexity, and the Press rank of
Q_theta on the test split. Reference: Yang et al. 2018 (ICLR), §2-3.
"""

import argparse
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow starts, below

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tflm import data  # noqa: E402
from tools.qmatrix import export_q  # noqa: E402
from tools.rank import press_rank  # noqa: E402
from tools.spectrum import singular_values  # noqa: E402
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM  # noqa: E402
from zoo.errors import UserError  # noqa: E402
from zoo.runtime.user_errors import one_line_errors  # noqa: E402

VOCAB, DIM = 200, 8


def run(epochs=16, seed=0, train_tokens=60_000, out_dir=None, verbose=0):
    """Train both heads; return {head: {"val_perplexity", "press_rank", ...}} and the
    language's optimal perplexity."""
    language = data.synthetic.mixture_markov_language(VOCAB, num_components=4,
                                                      component_rank=6, temperature=0.25,
                                                      seed=seed)
    corpus = language.to_corpus(train_tokens, 6_000, 2_000, seed=seed + 1)
    out_dir = pathlib.Path(out_dir or tempfile.mkdtemp(prefix="bottleneck-"))
    results = {}
    for name, head in (("softmax", "softmax"), ("mos", {"type": "mos", "num_experts": 4})):
        keras.utils.set_random_seed(seed)
        model = AWDLSTM(VOCAB, embed_dim=DIM, hidden_dim=32, num_layers=1, head=head,
                        dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0,
                        alpha=0, beta=0, bptt=20, clip_norm=1.0, seed=seed)
        model.compile(optimizer=keras.optimizers.Adam(0.03))
        train = data.lm_dataset(corpus.train, 64, 20, train=False)
        valid = data.lm_dataset(corpus.valid, 10, 20, train=False)
        history = model.fit(train, validation_data=valid, epochs=epochs, verbose=verbose)
        path = out_dir / f"q_{name}.npy"
        meta = export_q(model, corpus, "test", path)
        q = np.load(path)
        spectrum = singular_values(q, method="lapack")
        results[name] = {"val_perplexity": history.history["val_perplexity"][-1],
                         "test_perplexity": meta["perplexity"],
                         "press_rank": press_rank(spectrum.values, q.shape, q.dtype),
                         "shape": q.shape}
    return results, float(language.optimal_perplexity)


@one_line_errors("tools.bottleneck_demo")
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.bottleneck_demo",
                                description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs < 1:
        raise UserError(f"--epochs must be >= 1; got {args.epochs}.")
    results, optimal = run(args.epochs, args.seed, verbose=1)
    print(f"\nMarkov language, V = {VOCAB}, true log-probability rank {VOCAB}; "
          f"optimal perplexity {optimal:.2f}; context size d = {DIM} (softmax bound d + 2 = "
          f"{DIM + 2})\n")
    print("| head | valid perplexity | test perplexity | Press rank of Q_theta |")
    print("| --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['val_perplexity']:.2f} | {r['test_perplexity']:.2f} | "
              f"{r['press_rank']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
