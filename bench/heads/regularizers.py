"""Shortened reproduction of the regularizers of issue 15 on Penn Treebank (CPU-sized).

Each configuration is one `python -m zoo.train` run of the AdvSoft PTB command's model at a
smaller size (the `awd_lstm_advsoft_ptb` preset with embedding 200, hidden 400, the first
`--train-tokens` training tokens, SGD lr 30, `--epochs` epochs, every run with seed 141),
changing only the regularizer:

    baseline         AWD-LSTM, no AdvSoft, no noise (the preset with both off)
    advsoft          + AdvSoft alpha 0.005
    noise            + embedding noise 0.15
    advsoft+noise    the AdvSoft command's pair
    cosreg           + MLE-CosReg gamma 1
    spectrum         + spectrum control (SpectralEmbedding defaults)
    partial_shuffle  + partial shuffle of the training streams every epoch

`--spectrum LABEL OPTIONS` (repeatable) adds a configuration "spectrum LABEL": spectrum
control with the `tflm.layers.SpectralEmbedding` options of the JSON dict OPTIONS (the
sweep behind its defaults). They run after the configurations `--only` names (all of
them without `--only`; `--only` with no name: the `--spectrum` ones alone).

It reports validation perplexity per epoch and the test perplexity of the best epoch
(batch 10, bptt 70), and the spectrum of the trained embedding E (`tools.embeddings`): the
largest singular value, s_100 / s_1, the number of components for 95 % of the variance, and
the mean pairwise cosine of the rows; a plot of the normalized spectra. Writes the table to
results/regularizers.md and the plot to results/regularizers_spectra.png beside this script
(`bench.harness.publish`); a run with `--spectrum` (the sweep) to
results/regularizers_spectrum_sweep.md and .png.

    python -m bench.heads.regularizers [--epochs 3] [--train-tokens 200000] [--only NAME ...]
    python -m bench.heads.regularizers --only baseline \
        --spectrum default '{}' --spectrum weak '{"decay_strength": 0.001}'
"""

import argparse
import json
import pathlib
import tempfile
import time

import numpy as np

from bench.harness import REPO, publish, results_path

CONFIGS = {
    "baseline": ["model.head.adversarial_alpha=0", "model.embedding_noise=0"],
    "advsoft": ["model.embedding_noise=0"],
    "noise": ["model.head.adversarial_alpha=0"],
    "advsoft+noise": [],
    "cosreg": ["model.head.adversarial_alpha=0", "model.embedding_noise=0",
               "model.cosine_regularization=1.0"],
    "spectrum": ["model.head.adversarial_alpha=0", "model.embedding_noise=0",
                 "model.spectrum_control=true"],
    "partial_shuffle": ["model.head.adversarial_alpha=0", "model.embedding_noise=0",
                        "training.partial_shuffle=true"],
}


def common_flags(epochs, train_tokens):
    sets = ["model.embed_dim=200", "model.hidden_dim=400", "training.optimizer=sgd",
            "training.lr=30", "training.test_batch_size=10",
            f"corpus.max_train_tokens={train_tokens}"]
    flags = ["--preset", "awd_lstm_advsoft_ptb", "--epochs", str(epochs), "--quiet"]
    for s in sets:
        flags += ["--set", s]
    return flags


def embedding_figures(run_dir):
    # deferred: Keras loads after the arguments are read (`--help` stays fast)
    import keras

    import zoo
    model = zoo.load_model(run_dir / "best.keras")
    e = np.asarray(keras.ops.convert_to_numpy(model.embedding.embeddings), np.float64)
    s = np.linalg.svd(e, compute_uv=False)
    share = np.cumsum(s ** 2) / np.sum(s ** 2)
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    n = len(unit)
    mean_cos = (np.sum(unit.sum(0) ** 2) - n) / (n * (n - 1))
    return s, {"s1": float(s[0]), "s100_over_s1": float(s[99] / s[0]),
               "pc95": int(np.searchsorted(share, 0.95) + 1), "mean_cos": float(mean_cos)}


def plot(spectra, path):
    # deferred: matplotlib loads only when a figure is drawn
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in spectra.items():
        ax.plot(range(1, len(s) + 1), s / s[0], label=name)
    ax.set_yscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel("s_k / s_1 of the embedding")
    ax.set_title("Embedding spectrum after the shortened PTB runs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-tokens", type=int, default=200_000)
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS))
    parser.add_argument("--spectrum", nargs=2, action="append", default=[],
                        metavar=("LABEL", "OPTIONS"),
                        help="a spectrum-control configuration: a label and a JSON dict of "
                             "SpectralEmbedding options (repeatable)")
    parser.add_argument("--out", default=None, help="keep the run directories here")
    parser.add_argument("--plot", default=None,
                        help="where the spectra plot goes (default: in results/ beside this "
                             "script)")
    args = parser.parse_args(argv)
    from zoo import train  # deferred: Keras starts after the arguments are read

    results_name = "regularizers_spectrum_sweep" if args.spectrum else "regularizers"
    if args.plot is None:
        args.plot = str(results_path(__file__, f"{results_name}.png" if args.spectrum else
                                     "regularizers_spectra.png"))

    configs = dict(CONFIGS)
    for label, options in args.spectrum:
        if not isinstance(json.loads(options), dict):
            parser.error(f"--spectrum {label}: OPTIONS must be a JSON dict; got {options!r}")
        configs[f"spectrum {label}"] = CONFIGS["spectrum"][:2] + [
            f"model.spectrum_control={options}"]
    names = list(args.only if args.only is not None else CONFIGS)
    names += [f"spectrum {label}" for label, _ in args.spectrum]
    root = pathlib.Path(args.out or tempfile.mkdtemp(prefix="regularizers-"))
    rows, spectra = [], {}
    for name in names:
        out = root / name.replace("+", "_").replace(" ", "_")
        flags = common_flags(args.epochs, args.train_tokens) + ["--out", str(out)]
        for s in configs[name]:
            flags += ["--set", s]
        start = time.time()
        if train.main(flags) != 0:
            raise SystemExit(f"{name}: zoo.train failed")
        metrics = json.loads((out / "metrics.json").read_text())
        spectrum, figures = embedding_figures(out)
        spectra[name] = spectrum
        rows.append((name, [h["val_perplexity"] for h in metrics["history"]],
                     metrics["test_perplexity"], figures, time.time() - start))
        print(name, rows[-1], flush=True)
    plot(spectra, args.plot)
    command = f"--epochs {args.epochs} --train-tokens {args.train_tokens}"
    if args.only is not None:
        command += " --only" + "".join(f" {n}" for n in args.only)
    command += "".join(f" --spectrum {label} '{options}'" for label, options in args.spectrum)
    plot_name = pathlib.Path(args.plot).resolve()
    plot_name = (plot_name.relative_to(REPO) if plot_name.is_relative_to(REPO)
                 else plot_name)
    title = "Spectrum-control sweep" if args.spectrum else "Regularizers"
    lines = ["awd_lstm_advsoft_ptb at embedding 200 / hidden 400, SGD lr 30, seed 141; test "
             f"at batch 10. Spectrum plot: {plot_name}.", "",
             "| configuration | valid ppl per epoch | test ppl | s_1 | s_100 / s_1 | PCs for 95 % "
             "| mean cos(e_i, e_j) | minutes |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, valid, test, f, seconds in rows:
        lines.append(f"| {name} | {' / '.join(f'{v:.1f}' for v in valid)} | {test:.2f} | "
                     f"{f['s1']:.2f} | {f['s100_over_s1']:.3f} | {f['pc95']} | "
                     f"{f['mean_cos']:.2e} | {seconds / 60:.1f} |")
    publish(f"{title}, shortened PTB runs", "\n".join(lines),
            results_path(__file__, f"{results_name}.md"),
            f"python -m bench.heads.regularizers {command}")


if __name__ == "__main__":
    main()
