"""Shortened reproduction of Andonov 2019's ODE output heads on the synthetic high-rank language.

    python -m bench.reproductions.flow_heads_synthetic --out /tmp/flow_repro [--base-epochs 4] \
        [--head-epochs 2]

zoo's default corpus (the `synthetic` preset: a first-order Markov language of V = 500 words
whose transitions mix 4 rank-8 softmaxes, so its log-probability matrix has full rank 500)
and the preset's small AWD-LSTM (embed d = 16, hidden 128, 2 layers, SGD lr 20, clip 0.25):

1. a softmax base: `python -m zoo.train --out OUT/base --epochs BASE_EPOCHS`;
2. on it (`--init-from OUT/base/best.keras`), for every head of `--heads` (node, cnf on a
   softmax base, ccnf trained by importance sampling with 20 unigram noise words per
   position; defaults dopri5, rtol = atol = 1e-5, adjoint), frozen base
   (`model.freeze_base=true`, only the head trains) and not frozen, `--head-epochs` more
   epochs at `--lr`; and a control: the softmax base trained the same extra epochs at the
   same learning rate (what the extra epochs alone give);
3. Q_theta of every run on the first `--q-rows` test contexts (`python -m tools.qmatrix
   RUN/best.keras --corpus run --split test --max-rows Q_ROWS`, batch-1 rows, float32) and
   its ranks (`python -m tools.rank ... --json`): Press, numpy and eps-effective.

The softmax's log-probability matrix has rank <= d + 2 = 18 here; the thesis expects node
and ccnf to pass that bound, and cnf (a context-free flow: a word bias) to stay within the
base's rank + 1. Valid / test perplexity are zoo.train's (metrics.json, batch 10, the full
vocabulary: ccnf's full partition function); the gap is test perplexity minus the
language's optimal perplexity (its entropy rate, `optimal_perplexity` in metrics.json).

Writes the table (with the machine, load and commands) to results/flow_heads_synthetic.md
and the singular-value spectra to results/flow_heads_synthetic_spectra.png beside this script
(`bench.harness.publish`). `--reuse` skips runs whose directory already holds metrics.json
(to redo only the table).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

from bench.harness import REPO, publish, results_path
from bench.reproductions.commands import display, minutes_text, sh

HEADS = {
    "node": {"type": "node"},
    "cnf": {"type": "cnf", "base": "softmax"},
    "ccnf": {"type": "ccnf", "num_samples": 20},
    # the exact trace in training (unbiased; Hutchinson's biases the softmax objective)
    "ccnf_exact": {"type": "ccnf", "num_samples": 20, "trace": "exact"},
}


def train_cmd(out, args, epochs, extra=()):
    cmd = [sys.executable, "-m", "zoo.train", "--out", str(out), "--epochs", str(epochs),
           "--quiet", "--seed", str(args.seed)]
    for s in args.set:
        cmd += ["--set", s]
    return cmd + list(extra)


def runs(args):
    """(label, head name, frozen, run dir, command) in order; the base first."""
    out = pathlib.Path(args.out)
    base = out / "base"
    items = [("softmax base", "softmax", None, base, train_cmd(base, args, args.base_epochs))]
    init = ["--init-from", str(base / "best.keras"), "--set", f"training.lr={args.lr}"]
    items.append(("softmax, continued (control)", "softmax", False, out / "softmax_more",
                  train_cmd(out / "softmax_more", args, args.head_epochs, init)))
    for name in args.heads:
        for frozen in (True, False):
            tag = f"{name}_{'frozen' if frozen else 'full'}"
            extra = init + ["--set", "model.head=" + json.dumps(HEADS[name]),
                            "--set", f"model.freeze_base={str(frozen).lower()}"]
            items.append((f"{name}, {'frozen base' if frozen else 'all trained'}", name,
                          frozen, out / tag, train_cmd(out / tag, args, args.head_epochs,
                                                       extra)))
    for spec in args.extra:  # HEAD,frozen|full,LR,EPOCHS[,OPTIMIZER]
        name, mode, lr, epochs, *optimizer = spec.split(",")
        frozen = mode == "frozen"
        tag = f"{name}_{mode}_lr{lr}_ep{epochs}" + "".join(f"_{o}" for o in optimizer)
        extra = ["--init-from", str(base / "best.keras"), "--set", f"training.lr={lr}",
                 "--set", "model.head=" + json.dumps(HEADS[name]),
                 "--set", f"model.freeze_base={str(frozen).lower()}"]
        extra += [a for o in optimizer for a in ("--set", f"training.optimizer={o}")]
        note = f"extra, {optimizer[0]}" if optimizer else "extra"
        items.append((f"{name}, {'frozen base' if frozen else 'all trained'} ({note})", name,
                      frozen, out / tag, train_cmd(out / tag, args, int(epochs), extra)))
    return items


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the runs")
    p.add_argument("--base-epochs", type=int, default=4)
    p.add_argument("--head-epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2.0, help="learning rate of the head runs")
    p.add_argument("--heads", nargs="*", default=["node", "cnf", "ccnf"], choices=list(HEADS),
                   help="heads run frozen and not (none: only the base, control, --extra)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[],
                   help="extra zoo.train --set for every run (e.g. corpus.train_tokens=...)")
    p.add_argument("--extra", action="append", default=[], metavar="HEAD,frozen|full,LR,EPOCHS[,OPTIMIZER]",
                   help="an extra head run with its own learning rate, epochs and optimizer "
                        "(sgd, adam, asgd; default the preset's)")
    p.add_argument("--q-rows", type=int, default=2000)
    p.add_argument("--title", default="Shortened reproduction on the synthetic high-rank "
                   "language", help="the results section's heading")
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--results", default=str(results_path(__file__, "flow_heads_synthetic.md")))
    p.add_argument("--plot",
                   default=str(results_path(__file__, "flow_heads_synthetic_spectra.png")))
    args = p.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    load_start = os.getloadavg()
    total = time.perf_counter()
    rows = []
    for label, name, frozen, run, cmd in runs(args):
        seconds = None
        if not (args.reuse and (run / "metrics.json").exists()):
            code, seconds = sh(cmd, log)
            if code != 0:
                rows.append(dict(label=label, run=run, error=f"zoo.train exit {code}",
                                 cmd=cmd))
                continue
        q = out / f"q_{run.name}.npy"
        if not (args.reuse and q.exists()):
            sh([sys.executable, "-m", "tools.qmatrix", str(run / "best.keras"),
                "--corpus", "run", "--split", "test", "--max-rows", str(args.q_rows),
                "--out", str(q)], log)
        rows.append(dict(label=label, name=name, frozen=frozen, run=run, q=q, cmd=cmd,
                         seconds=seconds,
                         metrics=json.loads((run / "metrics.json").read_text())))
    ok = [r for r in rows if "error" not in r]
    ranks_json = out / "ranks.json"
    sh([sys.executable, "-m", "tools.rank", *[str(r["q"]) for r in ok], "--labels",
        *[r["run"].name for r in ok], "--json", str(ranks_json)], log)
    reports = {rep["label"]: rep for rep in json.loads(ranks_json.read_text())["reports"]}
    minutes = (time.perf_counter() - total) / 60
    load_end = os.getloadavg()

    first = ok[0]["metrics"]
    optimal = first["optimal_perplexity"]
    d = json.loads((ok[0]["run"] / "config.json").read_text())["model"]["embed_dim"]
    lines = ["Load average (1/5/15 min) at the start: "
             + "/".join(f"{v:.2f}" for v in load_start) + ", at the end: "
             + "/".join(f"{v:.2f}" for v in load_end) + f". Total {minutes:.1f} min (training,"
             f" export, ranks). The command runs (paths under `{args.out}`):", ""]
    for r in rows:
        lines.append(f"    {display(r['cmd'])}")
    lines += ["",
              f"Corpus {first['corpus']} (V = {first['vocab_size']}, optimal perplexity "
              f"{optimal:.2f}); model: the synthetic preset's AWD-LSTM, embed d = {d} (softmax "
              f"rank bound d + 2 = {d + 2}). Heads at their defaults (dopri5, rtol = atol = "
              "1e-5, adjoint; flows: Hutchinson's trace in training, exact in evaluation; "
              "ccnf: 20 unigram noise words per position in training, full partition function "
              "in evaluation). Perplexities: metrics.json (best epoch, batch 10). Ranks of "
              f"Q_theta on the first {args.q_rows} test contexts ({args.q_rows} x "
              f"{first['vocab_size']}, float32, tools.qmatrix batch-1 rows; tools.rank): Press "
              "/ numpy / effective rank at eps = 1e-3. val NFE: the last validation window's.",
              "",
              "| run | frozen | epochs | lr | valid ppl | test ppl | gap to optimal | "
              "Press rank | numpy rank | eff. rank 1e-3 | val NFE | minutes |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | | | | {r['error']} | | | | | | | |")
            continue
        m, rep = r["metrics"], reports.get(r["run"].name, {})
        hist = m["history"][-1]
        epochs = len(m["history"])
        lr = hist.get("learning_rate", float("nan"))
        nfe = hist.get("val_nfe")
        frozen = "-" if r["frozen"] is None else ("yes" if r["frozen"] else "no")
        lines.append(
            f"| {r['label']} | {frozen} | {epochs} | {lr:g} | {m['valid_perplexity']:.2f} | "
            f"{m['test_perplexity']:.2f} | {m['test_perplexity'] - optimal:+.2f} | "
            f"{rep.get('press_rank', 'n/a')} | {rep.get('numpy_rank', 'n/a')} | "
            f"{rep.get('effective_rank', {}).get('1e-03', 'n/a')} | "
            f"{'-' if nfe is None else int(nfe)} | "
            f"{minutes_text(r['seconds'])} |")
    if args.plot:
        plot_spectra(ok, args.plot, d)
        lines += ["", f"Singular values of Q_theta: {os.path.relpath(args.plot, REPO)}."]
    publish(args.title, "\n".join(lines), args.results)


def plot_spectra(rows, path, d):
    # deferred: matplotlib loads only when a figure is drawn
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        q = np.load(r["q"]).astype(np.float64)
        s = np.linalg.svd(q, compute_uv=False)
        ax.semilogy(np.arange(1, s.size + 1), s / s[0], label=r["run"].name,
                    lw=2 if r["name"] == "softmax" else 1)
    ax.axvline(d + 2, color="gray", ls=":", label=f"d + 2 = {d + 2}")
    ax.set_xlabel("index i")
    ax.set_ylabel("s_i / s_1")
    ax.set_ylim(1e-9, 2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Q_theta spectra, synthetic language (V = 500)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
