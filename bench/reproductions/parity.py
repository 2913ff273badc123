"""Shortened reproduction, side by side: `zoo.train` and the reference's PyTorch loop.

Both start from the same initial weights (the Keras model built from the preset, copied into
`tflm.testing.reference_peer.ReferenceRNNModel`) and train with every dropout on, for a few epochs
of a slice of the preset's corpus: the Keras side is `zoo.runs.training.run` (what
`python -m zoo.train` runs), the PyTorch side is the reference's `main.py` loop (random window
lengths, lr * seq_len / bptt, clipping, NT-ASGD switch on `nonmono`, validation with the
averaged weights once averaging runs). Each side runs once per training seed, so the table
shows the gap between the frameworks next to the seed-to-seed spread within each; the figure
shows every validation curve.

    python -m bench.reproductions.parity --preset awd_lstm_ptb --epochs 3 --seeds 141 142 \\
        --train-tokens 60000 --valid-tokens 12000 --set model.embed_dim=128 --set model.hidden_dim=256

On a GPU, drop the slices and `--set` overrides to run the preset itself.
Heads with a peer: softmax and MoS (the DOC peer has no dropout). Writes the table to
results/parity.md and the figure to results/parity.png beside this script
(`bench.harness.publish`).
"""

import argparse
import json
import os
import pathlib
import tempfile
import time

import numpy as np

from bench.harness import REPO, publish, results_path

PEER_DROPOUTS = {"dropout": "dropout", "dropout_h": "dropouth", "dropout_i": "dropouti",
                 "dropout_e": "dropoute", "weight_dropout": "wdrop"}


def build_config(args):
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    from zoo.runs.config import resolve_config
    sets = list(args.set)
    if args.train_tokens:
        sets.append(f"corpus.max_train_tokens={args.train_tokens}")
    if args.valid_tokens:
        sets += [f"corpus.max_valid_tokens={args.valid_tokens}",
                 f"corpus.max_test_tokens={args.valid_tokens}",
                 "training.test_batch_size=10"]
    sets.append(f"training.epochs={args.epochs}")
    return resolve_config(args.preset, sets)


def make_peer(config, keras_model):
    # deferred: PyTorch loads after the arguments are read
    from tflm.testing.reference_peer import ReferenceRNNModel, load_keras_weights
    model = config["model"]
    head = model.get("head", {"type": "softmax"})
    head = {"type": head} if isinstance(head, str) else head
    if head["type"] not in ("softmax", "mos"):
        raise SystemExit(f"no PyTorch peer with dropout for head {head['type']!r}; "
                         "use a softmax or MoS preset.")
    kwargs = {theirs: float(model.get(ours, 0.0)) for ours, theirs in PEER_DROPOUTS.items()}
    if head["type"] == "mos":
        kwargs.update(n_experts=int(head["num_experts"]),
                      dropoutl=float(head.get("latent_dropout", 0.0)))
    embed, hidden = int(model["embed_dim"]), int(model["hidden_dim"])
    peer = ReferenceRNNModel(
        keras_model.vocab_size, embed, hidden, int(model.get("last_dim") or embed),
        int(model["num_layers"]), head=head["type"], alpha=float(model.get("alpha", 0.0)),
        beta=float(model.get("beta", 0.0)), **kwargs)
    load_keras_weights(peer, keras_model)
    return peer


def initial_model(config, corpus, run_dir):
    """The preset's Keras model at its initial weights, saved where `init_from` reads it."""
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import keras

    from zoo.runs.builders import build_model
    from zoo.runs.settings import RunSettings
    settings = RunSettings.from_config(config)
    keras.utils.set_random_seed(settings.training.seed)
    model = build_model(settings, len(corpus.vocabulary))
    model.build((None, None))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "vocab.txt").write_text("\n".join(corpus.vocabulary) + "\n", encoding="utf-8")
    model.save(run_dir / "initial.keras")
    return model


def run_keras(config, seed, init_path, out, data_dir):
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    from zoo.runs.training import run
    config = json.loads(json.dumps(config))
    config["training"]["seed"] = seed
    results = run(config, out, data_dir=data_dir, init_from=init_path, verbose=0)
    return [h["val_perplexity"] for h in results["history"]]


def run_peer(config, seed, keras_model, corpus):
    """The reference main.py's epochs: train, evaluate, switch to ASGD on `nonmono`."""
    # deferred: PyTorch loads after the arguments are read
    import torch

    from tflm.testing.reference_peer import ReferenceLoop, batchify
    from zoo.runs.settings import TrainingSettings
    training = TrainingSettings.from_dict(config["training"])
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    peer = make_peer(config, keras_model)
    loop = ReferenceLoop(peer, float(training.lr), training.bptt,
                         clip=float(training.clip_norm), wdecay=float(training.weight_decay))
    train = batchify(corpus.train, training.batch_size)
    eval_batch = training.eval_batch_size
    valid = batchify(corpus.valid, eval_batch)
    nonmono, curve, losses = training.nonmono, [], []
    for _ in range(training.epochs):
        loop.train_epoch(train, rng, max_seq_len=training.max_seq_len)
        val_loss = loop.evaluate(valid, eval_batch)
        curve.append(float(np.exp(val_loss)))
        averaging = isinstance(loop.optimizer, torch.optim.ASGD)
        if (not averaging and training.switch == "nonmono" and len(losses) > nonmono
                and val_loss > min(losses[:-nonmono])):
            loop.switch_to_asgd()
        losses.append(val_loss)
    return curve


def figure(curves, path, title):
    # deferred: matplotlib loads only when a figure is drawn
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for (side, seed), curve in sorted(curves.items()):
        ax.plot(range(1, len(curve) + 1), curve, marker="o",
                linestyle="-" if side == "keras" else "--",
                label=f"{'tflm (Keras)' if side == 'keras' else 'reference (PyTorch)'} seed {seed}")
    ax.set_xticks(range(1, max(len(c) for c in curves.values()) + 1))
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation perplexity")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(args, curves, seconds):
    seeds = args.seeds
    head = " | ".join([f"tflm seed {s}" for s in seeds] + [f"reference seed {s}" for s in seeds])
    lines = [f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'tensorflow')}; "
             f"{seconds:.0f} s. Validation perplexity per epoch, both from the same initial "
             "weights, dropout on; gap = |mean tflm - mean reference|, spread = the largest "
             "seed-to-seed difference within one framework.", "",
             f"| epoch | {head} | gap | spread |", "| --- " * (2 * len(seeds) + 3) + "|"]
    epochs = min(len(c) for c in curves.values())
    for e in range(epochs):
        ours = [curves["keras", s][e] for s in seeds]
        theirs = [curves["peer", s][e] for s in seeds]
        gap = abs(np.mean(ours) - np.mean(theirs))
        spread = max(np.ptp(ours), np.ptp(theirs))
        cells = " | ".join(f"{v:.1f}" for v in ours + theirs)
        lines.append(f"| {e + 1} | {cells} | {gap:.1f} | {spread:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="awd_lstm_ptb")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[141, 142])
    p.add_argument("--train-tokens", type=int)
    p.add_argument("--valid-tokens", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="preset override, as zoo.train --set (e.g. model.hidden_dim=256)")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--results", default=str(results_path(__file__, "parity.md")))
    p.add_argument("--figure", default=str(results_path(__file__, "parity.png")))
    args = p.parse_args(argv)
    if len(args.seeds) < 2:
        p.error("give at least two --seeds: the seed-to-seed spread is what the gap is read against")

    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    from zoo.runs.corpora import load_data
    config = build_config(args)
    corpus, _ = load_data(config["corpus"], args.data_dir)
    work = pathlib.Path(tempfile.mkdtemp(prefix="repro-parity-"))
    start = time.time()
    keras_model = initial_model(config, corpus, work)
    curves = {}
    for seed in args.seeds:
        curves["peer", seed] = run_peer(config, seed, keras_model, corpus)
        print(f"reference seed {seed}: {[round(v, 1) for v in curves['peer', seed]]}", flush=True)
        curves["keras", seed] = run_keras(config, seed, work / "initial.keras",
                                          work / f"keras-{seed}", args.data_dir)
        print(f"tflm seed {seed}: {[round(v, 1) for v in curves['keras', seed]]}", flush=True)
    figure(curves, args.figure, f"{args.preset}, {' '.join(args.set)}")
    publish(f"Side-by-side shortened reproduction: {args.preset}",
            table(args, curves, time.time() - start), args.results)
    print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
