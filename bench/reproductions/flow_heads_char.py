"""Shortened reproduction of Andonov 2019's conditional CNF head on character-level Penn
Treebank (CPU-sized; thesis Tables 7.9, 7.10).

    TFLM_DATA_DIR=/work/shared/data python -m bench.reproductions.flow_heads_char \
        --out /tmp/flow_char \
        [--base-train-chars 800000] [--base-epochs 3] [--head-train-chars 30000]
        [--head-batch 8] [--valid-chars 20000] [--test-chars 20000] [--test-batch 1]
        [--only NAME ...] [--reuse] [--no-publish]

Every run is `python -m zoo.train --preset PRESET` with shrinking overrides: the
`awd_lstm_ptb_char` model at hidden 400 / embedding 200 (tied, so the last layer is 200
wide, as the preset's), and the first characters of each split (`corpus.max_*_tokens`):

1. base: `awd_lstm_ptb_char` (Adam lr 2e-3, batch 128, bptt 150), `--base-epochs` over the
   first `--base-train-chars` training characters;
2. on it (`--init-from base/best.keras`, as the head presets say), `--head-epochs` each over
   the first `--head-train-chars` training characters at batch `--head-batch`: the control
   (the base preset continued: what the extra steps alone give) and ccnf
   (`ccnf_ptb_char_frozen_lr0002`, base frozen, Adam 2e-3, the preset's Hutchinson trace
   in training; no importance sampling: the flow of every one of the 50 symbols is solved
   per position). The heads' training set and batch are smaller than the base's because
   ccnf solves 50 flows (d = 200) per character: one step at the preset's batch 128 would
   take minutes and tens of GB here;
3. valid at the presets' batch 10 and test at `--test-batch` (the presets' 1) on the first
   `--valid-chars` / `--test-chars` characters for every run;
4. Q_theta of every run on the first `--q-rows` test contexts (`tools.qmatrix`) and its
   ranks (`tools.rank`); V = 50, so every rank is at most 50 and the softmax bound
   d + 2 = 202 does not bind: the ranks say little here (the thesis reports none at
   character level).

`--only` runs just the named runs (the base must exist for the heads; `--only` with no
name only redoes the table); `--reuse` keeps runs whose directory holds metrics.json (and
its Q_theta). Writes the table to results/flow_heads_char.md beside this script
(`bench.harness.publish`) unless `--no-publish`.

Cost with the defaults on a 2-core CPU at load 2.4-4.3, niced (results/flow_heads_char.md):
19 min in all; base 9.4 min,
control 0.6, ccnf 8.6 (it trains at ~70 characters a second, 28x slower than the softmax),
Q_theta 7-12 s a run.
"""

import argparse
import os
import pathlib
import time

from bench.harness import publish, results_path
from bench.reproductions.commands import (display, minutes_text, preset, rank_reports,
                                          train_and_export, train_cmd)

BASE = "awd_lstm_ptb_char"
# name: (preset, label)
HEAD_RUNS = {
    "control": (BASE, "softmax, continued (control)"),
    "ccnf_frozen": ("ccnf_ptb_char_frozen_lr0002", "ccnf, frozen base"),
}
SHRINK = ["model.embed_dim=200", "model.hidden_dim=400"]


def runs(args):
    out = pathlib.Path(args.out)
    evaluation = [f"corpus.max_valid_tokens={args.valid_chars}",
                  f"corpus.max_test_tokens={args.test_chars}",
                  f"training.test_batch_size={args.test_batch}"]
    items = [("base", "softmax base", BASE,
              train_cmd(out / "base", BASE, args.base_epochs,
                        SHRINK + [f"corpus.max_train_tokens={args.base_train_chars}"]
                        + evaluation))]
    for name, (preset_name, label) in HEAD_RUNS.items():
        sets = SHRINK + [f"corpus.max_train_tokens={args.head_train_chars}",
                         f"training.batch_size={args.head_batch}"] + evaluation
        items.append((name, label, preset_name,
                      train_cmd(out / name, preset_name, args.head_epochs, sets,
                                init=out / "base" / "best.keras")))
    return items


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--base-train-chars", type=int, default=800_000)
    p.add_argument("--base-epochs", type=int, default=3)
    p.add_argument("--head-train-chars", type=int, default=30_000)
    p.add_argument("--head-batch", type=int, default=8)
    p.add_argument("--head-epochs", type=int, default=1)
    p.add_argument("--valid-chars", type=int, default=20_000)
    p.add_argument("--test-chars", type=int, default=20_000)
    p.add_argument("--test-batch", type=int, default=1)
    p.add_argument("--only", nargs="*", default=None, choices=["base", *HEAD_RUNS])
    p.add_argument("--q-rows", type=int, default=2000)
    p.add_argument("--no-q", nargs="*", default=[], help="runs whose Q_theta is not exported")
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--results", default=str(results_path(__file__, "flow_heads_char.md")))
    p.add_argument("--no-publish", action="store_true")
    args = p.parse_args()
    if not os.environ.get("TFLM_DATA_DIR"):
        p.error("set TFLM_DATA_DIR to the directory holding penn/ (e.g. /work/shared/data)")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    load_start = os.getloadavg()
    total = time.perf_counter()
    rows = []
    for name, label, preset_name, cmd in runs(args):
        done = train_and_export(args, out, log, name, cmd,
                                ["--corpus", "ptb-char", "--split", "test", "--max-rows",
                                 str(args.q_rows), "--bptt", "150"])
        if done is not None:
            rows.append(dict(name=name, label=label, preset=preset_name, cmd=cmd, **done))
    reports = rank_reports(out, log, rows)
    minutes = (time.perf_counter() - total) / 60
    load_end = os.getloadavg()
    table = report(args, rows, reports, load_start, load_end, minutes)
    publish("Shortened reproduction on character-level Penn Treebank", table,
            None if args.no_publish else args.results)


def report(args, rows, reports, load_start, load_end, minutes):
    ok = {r["name"]: r for r in rows if "error" not in r}
    base_pub = preset(BASE)["published"]
    lines = ["TensorFlow, CPU. Load average (1/5/15 min) at the start: "
             + "/".join(f"{v:.2f}" for v in load_start) + ", at the end: "
             + "/".join(f"{v:.2f}" for v in load_end) + f". This invocation: {minutes:.1f} min "
             "(TFLM_DATA_DIR set). Its runs:", ""]
    for r in rows:
        if "cmd" in r:
            lines.append(f"    {display(r['cmd'])}")
    lines += ["",
              "The presets' models shrunk to hidden 400 / embedding 200 (tied; V = 50); base "
              f"{args.base_epochs} epoch(s) over the first {args.base_train_chars:,} training "
              f"characters at the preset's batch 128; the control and ccnf "
              f"{args.head_epochs} epoch(s) over the first {args.head_train_chars:,} at batch "
              f"{args.head_batch}, Adam 2e-3 (the presets'). bpc: metrics.json (best epoch) on "
              f"the first {args.valid_chars:,} valid characters (batch 10) and the first "
              f"{args.test_chars:,} test characters (batch {args.test_batch}). Δ: test bpc "
              "minus the control's. Published: the preset's row (valid / test bpc; base, "
              f"Table 7.9: {base_pub['valid_bpc']:.3f} / {base_pub['test_bpc']:.3f}). Ranks: "
              "Q_theta of the first test rows (tools.qmatrix, batch-1 rows, float32; "
              "tools.rank): Press / numpy / effective at eps = 1e-3. Minutes: zoo.train's "
              "(training, per-epoch validation, final evaluation).", "",
              "| run | preset | epochs | valid bpc | test bpc | Δ test vs control | "
              "Δ test vs base | published valid / test | published Δ test vs base | Q rows | "
              "Press / numpy / eff. rank | minutes |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | | | {r['error']} | | | | | | | | |")
            continue
        m = r["metrics"]
        control, base = ok.get("control"), ok.get("base")
        delta = "-" if control is None or r["name"] in ("control", "base") else \
            f"{m['test_bpc'] - control['metrics']['test_bpc']:+.3f}"
        vs_base = "-" if base is None or r["name"] == "base" else \
            f"{m['test_bpc'] - base['metrics']['test_bpc']:+.3f}"
        pub = preset(r["preset"]).get("published")
        if r["name"] == "control" or pub is None:
            pub_text, pub_delta = "-", "-"
        else:
            pub_text = f"{pub['valid_bpc']:.3f} / {pub['test_bpc']:.3f}"
            pub_delta = "-" if r["name"] == "base" else \
                f"{pub['test_bpc'] - base_pub['test_bpc']:+.3f}"
        rep = reports.get(r["name"], {})
        ranks = "-" if not rep else (f"{rep.get('press_rank', 'n/a')} / "
                                     f"{rep.get('numpy_rank', 'n/a')} / "
                                     f"{rep.get('effective_rank', {}).get('1e-03', 'n/a')}")
        lines.append(
            f"| {r['label']} | {r['preset']} | {len(m['history'])} | {m['valid_bpc']:.3f} | "
            f"{m['test_bpc']:.3f} | {delta} | {vs_base} | {pub_text} | {pub_delta} | "
            f"{args.q_rows if rep else '-'} | {ranks} | {minutes_text(r['seconds'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
