"""Shortened reproduction of Andonov 2019's ODE output heads on Penn Treebank (CPU-sized).

    TFLM_DATA_DIR=/work/shared/data python -m bench.reproductions.flow_heads_ptb \
        --out /tmp/flow_ptb \
        [--train-tokens 100000] [--base-epochs 3] [--head-epochs 1] [--lr 1] [--only NAME ...]

The thesis' rows (Tables 7.3, 7.4, 7.7) as their presets run them, at a size this CPU
trains in minutes: every run is `python -m zoo.train --preset PRESET` with the same
shrinking overrides as bench/heads/regularizers.py (embedding 200, hidden 400, the first
`--train-tokens` PTB training tokens; test batch 10 where the preset evaluates the full
test split at batch 1):

1. base: `node_base_awd_lstm_ptb` (the thesis' AWD-LSTM base, SGD lr 20), `--base-epochs`;
2. on it (`--init-from base/best.keras`, as the presets say), `--head-epochs` each, at
   `--lr` (see below): the control (the base preset continued, what the extra epochs
   alone give), node (`node_ptb_raw_{frozen,full}_lr01`), cnf on the softmax
   (`cnf_ptb_raw_{frozen,full}_lr1`) and ccnf (`ccnf_ptb_raw_{frozen,full}_lr01`: batch 12,
   importance sampling with 20 unigram noise words, valid / test on the first 400 tokens at
   batch 1) with the control evaluated on the same 400 tokens (`control_400`: the control's
   command with the ccnf presets' corpus limits and batch-1 evaluation);
3. Q_theta of every run on the first `--q-rows` test contexts (`--q-rows-ccnf` for ccnf, whose
   every row solves V flows) with `tools.qmatrix` and its ranks with `tools.rank`.

The presets' learning rates (0.01-1) are the thesis' for hundreds of steps per epoch and
tens of epochs; a shortened run makes ~70-120 steps an epoch, so `--lr` (default 1, the cnf
rows 5-8's) replaces them for every head and the control alike (the table says so).

`--only` runs just the named runs (the base must exist; `--only` with no name only redoes
the table); `--reuse` keeps runs whose directory holds metrics.json (and its Q_theta); the
table lists every run found under `--out`. Writes the table to results/flow_heads_ptb.md
beside this script (`bench.harness.publish`) unless `--no-publish`.

Cost on a 2-core CPU at load ~8 (results/flow_heads_ptb.md): base 3 epochs 5 min, control
2, cnf 14, node 32 min per epoch-run; at load 1.2-4.3 (niced): node_full 9 min, ccnf_frozen
23 min (a 14-min training epoch with its validation, then the 400-token passes at batch 1
over all 10,000 words' flows) plus 4 min for its 400 Q_theta rows. The ccnf runs evaluate
in chunks of 1,000 words (`model.head.vocab_chunk`): the whole vocabulary in one solve ran
out of memory (23.5 GiB) in the per-epoch validation at batch 10.
"""

import argparse
import os
import pathlib
import time

from bench.harness import publish, results_path
from bench.reproductions.commands import (display, minutes_text, preset, rank_reports,
                                          train_and_export, train_cmd)

BASE = "node_base_awd_lstm_ptb"
# name: (preset, label, frozen, 400-token evaluation)
HEAD_RUNS = {
    "control": (BASE, "softmax, continued (control)", None, False),
    "node_frozen": ("node_ptb_raw_frozen_lr01", "node, frozen base", True, False),
    "node_full": ("node_ptb_raw_full_lr01", "node, all trained", False, False),
    "cnf_frozen": ("cnf_ptb_raw_frozen_lr1", "cnf (softmax base), frozen base", True, False),
    "cnf_full": ("cnf_ptb_raw_full_lr1", "cnf (softmax base), all trained", False, False),
    # the same with the exact trace in training (Hutchinson's biases the objective)
    "cnf_frozen_exact": ("cnf_ptb_raw_frozen_lr1", "cnf (softmax base), frozen base, exact "
                         "trace in training", True, False),
    "control_400": (BASE, "softmax, continued (control), first 400 tokens", None, True),
    "ccnf_frozen": ("ccnf_ptb_raw_frozen_lr01", "ccnf, frozen base", True, True),
    "ccnf_full": ("ccnf_ptb_raw_full_lr01", "ccnf, all trained", False, True),
}
SHRINK = ["model.embed_dim=200", "model.hidden_dim=400"]


def runs(args):
    out = pathlib.Path(args.out)
    common = SHRINK + [f"corpus.max_train_tokens={args.train_tokens}"]
    items = [("base", "softmax base", BASE, None, False,
              train_cmd(out / "base", BASE, args.base_epochs,
                        common + ["training.test_batch_size=10"]))]
    for name, (preset_name, label, frozen, first400) in HEAD_RUNS.items():
        sets = common + [f"training.lr={args.lr}"]
        if name.endswith("_exact"):
            sets += ["model.head.trace=exact"]
        if name.startswith("ccnf"):
            # evaluation solves every word's flow: one solve of (10, 39, 10,000, 200) in the
            # per-epoch validation at batch 10 ran out of memory (23.5 GiB) here; chunks of
            # 1,000 words bound it at no cost in time (bench/heads/results/
            # flow_heads_ccnf_eval.md, the batch-1 table);
            # the word-level ccnf presets now set it as well
            sets += ["model.head.vocab_chunk=1000"]
        if first400:
            if preset_name == BASE:
                sets += ["corpus.max_valid_tokens=401", "corpus.max_test_tokens=401",
                         'training.final_evaluation={"valid_batch_size": 1, '
                         '"test_batch_size": 1}']
        else:
            sets += ["training.test_batch_size=10"]
        items.append((name, label, preset_name, frozen, first400,
                      train_cmd(out / name, preset_name, args.head_epochs, sets,
                                init=out / "base" / "best.keras")))
    return items


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train-tokens", type=int, default=100_000)
    p.add_argument("--base-epochs", type=int, default=3)
    p.add_argument("--head-epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--only", nargs="*", default=None, choices=["base", *HEAD_RUNS])
    p.add_argument("--q-rows", type=int, default=2000)
    p.add_argument("--q-rows-ccnf", type=int, default=400)
    p.add_argument("--no-q", nargs="*", default=[], help="runs whose Q_theta is not exported")
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--results", default=str(results_path(__file__, "flow_heads_ptb.md")))
    p.add_argument("--no-publish", action="store_true")
    args = p.parse_args()
    if not os.environ.get("TFLM_DATA_DIR"):
        p.error("set TFLM_DATA_DIR to the directory holding ptb/ (e.g. /work/shared/data)")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    load_start = os.getloadavg()
    total = time.perf_counter()
    rows = []
    for name, label, preset_name, frozen, first400, cmd in runs(args):
        rows_q = args.q_rows_ccnf if name.startswith("ccnf") else args.q_rows
        done = train_and_export(args, out, log, name, cmd,
                                ["--corpus", "ptb", "--split", "test", "--max-rows", str(rows_q)])
        if done is not None:
            rows.append(dict(name=name, label=label, preset=preset_name, frozen=frozen,
                             first400=first400, cmd=cmd, q_rows=rows_q, **done))
    reports = rank_reports(out, log, rows)
    minutes = (time.perf_counter() - total) / 60
    load_end = os.getloadavg()
    table = report(args, rows, reports, load_start, load_end, minutes)
    publish("Shortened reproduction on Penn Treebank", table,
            None if args.no_publish else args.results)


def published(preset_name):
    pub = preset(preset_name).get("published")
    if not pub:
        return "-"
    return f"{pub['valid']:.2f} / {pub['test']:.2f}"


def report(args, rows, reports, load_start, load_end, minutes):
    ok = {r["name"]: r for r in rows if "error" not in r}
    lines = ["TensorFlow, CPU. Load average (1/5/15 min) at the start: "
             + "/".join(f"{v:.2f}" for v in load_start) + ", at the end: "
             + "/".join(f"{v:.2f}" for v in load_end) + f". This invocation: {minutes:.1f} min "
             "(TFLM_DATA_DIR set). Its runs:", ""]
    for r in rows:
        if "cmd" in r:
            lines.append(f"    {display(r['cmd'])}")
    lines += ["",
              f"The presets' models shrunk to embedding 200 / hidden 400 (softmax rank bound "
              f"d + 2 = 202), the first {args.train_tokens:,} PTB training tokens; base "
              f"{args.base_epochs} epochs at the base preset's SGD lr 20, every head run and "
              f"the control {args.head_epochs} epoch(s) at lr {args.lr:g} (the presets' "
              "0.01-1 are for ~660 steps an epoch over tens of epochs: see the script's "
              "docstring). Perplexities: metrics.json (best epoch; full valid / test splits "
              "at batch 10, except the ccnf rows and control_400: the first 400 tokens at "
              "batch 1, as the ccnf presets and the thesis' Table 7.7). Δ: test perplexity "
              "minus the control's on the same tokens. Published: the preset's row (valid / "
              "test) and its gain over the thesis' base (Table 7.1: 60.93 / 58.67; on the "
              "first 400 tokens, Table 7.8: 59.64 / 50.30). Ranks: Q_theta of the first "
              "rows of the test split (tools.qmatrix batch-1 rows, float32; tools.rank): "
              "Press / numpy / effective at eps = 1e-3. Minutes: zoo.train's (training, "
              "per-epoch validation, final evaluation).", "",
              "| run | preset | epochs | lr | valid ppl | test ppl | Δ test vs control | "
              "Δ test vs base | published valid / test | published Δ test vs base | Q rows | "
              "Press / numpy / eff. rank | minutes |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- "
              "| ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | | | | {r['error']} | | | | | | | |")
            continue
        m = r["metrics"]
        hist = m["history"]
        control = ok.get("control_400" if r["first400"] else "control")
        delta = "-" if control is None or r["name"].startswith("control") or r["name"] == "base" \
            else f"{m['test_perplexity'] - control['metrics']['test_perplexity']:+.2f}"
        base = ok.get("base")
        vs_base = "-" if base is None or r["name"] == "base" or r["first400"] else \
            f"{m['test_perplexity'] - base['metrics']['test_perplexity']:+.2f}"
        pub = preset(r["preset"]).get("published") if r["name"] not in ("base",) else None
        if r["name"].startswith("control") or pub is None:
            pub_text, pub_delta = ("60.93 / 58.67 (Table 7.1)" if r["name"] == "base"
                                   else "-"), "-"
        else:
            base_test = 50.30 if r["first400"] else 58.67
            pub_text = f"{pub['valid']:.2f} / {pub['test']:.2f}"
            pub_delta = f"{pub['test'] - base_test:+.2f}"
        rep = reports.get(r["name"], {})
        ranks = "-" if not rep else (f"{rep.get('press_rank', 'n/a')} / "
                                     f"{rep.get('numpy_rank', 'n/a')} / "
                                     f"{rep.get('effective_rank', {}).get('1e-03', 'n/a')}")
        lr = hist[-1].get("learning_rate", float("nan"))
        lines.append(
            f"| {r['label']} | {r['preset']} | {len(hist)} | {lr:g} | "
            f"{m['valid_perplexity']:.2f} | {m['test_perplexity']:.2f} | {delta} | {vs_base} "
            f"| {pub_text} "
            f"| {pub_delta} | {r['q_rows'] if rep else '-'} | {ranks} | "
            f"{minutes_text(r['seconds'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
