"""The record of reproductions: every preset run to its end or partway, next to its paper.

    python -m bench.reproductions.record RUN_DIR [RUN_DIR ...] [--hardware TEXT]
    python -m bench.reproductions.record          # rewrite the page from the record alone

Each RUN_DIR is a `python -m zoo.train` run folder, finished (its metrics.json) or still
partway (its checkpoint: the epochs done so far, no test figure). Its entry, keyed by preset,
seed, backend and hardware, replaces the one it had in `results/record.json`, and the page
`results/record.md` is written anew from every entry: per preset, each seed's epochs run of
the schedule's total, best validation and test perplexity, the published figures (the
preset's `published`), the command that reproduces the run, and the validation curves
(`results/record_<preset>.png`, the published figure as a line). A partial run says
"partial: k of N epochs", and its figures are what those epochs gave; a number appears only
from a run that was made.
"""

import argparse
import datetime
import json
import pathlib
import shlex
import statistics

from bench.harness import publish, results_path, this_command
from tools.frameworks.machine import machine_line
from zoo.presets import load_preset
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings

RECORD = results_path(__file__, "record.json")
PAGE = results_path(__file__, "record.md")


def _flatten(node, prefix=""):
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and key != "head":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def train_command(config):
    """The `python -m zoo.train` line that reproduces `config` (a run's config.json): its
    preset, seed and epochs, and a `--set` for every other field that differs."""
    preset = config.get("preset") or "synthetic"
    base = _flatten({s: resolve_config(preset).get(s, {}) for s in ("corpus", "model",
                                                                    "training")})
    ours = _flatten({s: config.get(s, {}) for s in ("corpus", "model", "training")})
    training = config.get("training", {})
    words = ["python", "-m", "zoo.train", "--preset", preset]
    for flag, key in (("--seed", "seed"), ("--epochs", "epochs")):
        if key in training:
            words += [flag, str(training[key])]
    for key in sorted(ours):
        if key in ("training.seed", "training.epochs") or ours[key] == base.get(key):
            continue
        words += ["--set", f"{key}={json.dumps(ours[key], separators=(',', ':'))}"]
    return shlex.join(words)


def entry_of(run_dir, hardware, backend):
    """The record entry of one run folder (finished or partway)."""
    run_dir = pathlib.Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    settings = RunSettings.from_config(config)
    metrics_path = run_dir / "metrics.json"
    if metrics_path.exists():
        metrics = json.loads(metrics_path.read_text())
        history = metrics["history"]
        valid, test = metrics["valid_perplexity"], metrics["test_perplexity"]
        backend = metrics.get("backend", backend)
        best_epoch = metrics["best_epoch"]
    else:
        state = json.loads((run_dir / "checkpoint" / "state.json").read_text())
        history = state["history"]
        best = min(history, key=lambda h: h["val_perplexity"]) if history else None
        valid, test = (best["val_perplexity"] if best else None), None
        best_epoch = best["epoch"] if best else None
    total = settings.training.epochs
    published = (load_preset(settings.preset).get("published") or {}) if settings.preset else {}
    return {"preset": settings.preset, "seed": settings.training.seed, "backend": backend,
            "hardware": hardware, "command": train_command(config),
            "epochs_run": len(history), "epochs_total": total,
            "complete": metrics_path.exists() and len(history) >= total,
            "best_epoch": best_epoch, "valid": valid, "test": test,
            "curve": [h["val_perplexity"] for h in history],
            "published": {k: published.get(k) for k in ("valid", "test", "note")},
            "date": datetime.date.today().isoformat()}


def merge(entries, new):
    """`entries` with `new` in place of the entry of the same preset, seed, backend and
    hardware (appended when there is none)."""
    key = ("preset", "seed", "backend", "hardware")
    kept = [e for e in entries if any(e[k] != new[k] for k in key)]
    return sorted(kept + [new], key=lambda e: (e["preset"] or "", e["seed"], e["backend"]))


def _ppl(value):
    return "-" if value is None else f"{value:.2f}"


def page(entries):
    """The record's markdown body: a table per preset, its spread, its curve figure."""
    lines = []
    for preset in sorted({e["preset"] for e in entries}):
        rows = [e for e in entries if e["preset"] == preset]
        pub = rows[0]["published"]
        lines += [f"## {preset}", "",
                  f"Published: valid {_ppl(pub.get('valid'))}, test {_ppl(pub.get('test'))}"
                  f" ({pub.get('note') or 'the preset names no source'}).", "",
                  "| seed | backend | hardware | epochs | best epoch | valid | test | command |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in rows:
            status = (f"{e['epochs_run']} of {e['epochs_total']}" if e["complete"] else
                      f"partial: {e['epochs_run']} of {e['epochs_total']}")
            lines.append(f"| {e['seed']} | {e['backend']} | {e['hardware']} | {status} | "
                         f"{e['best_epoch']} | {_ppl(e['valid'])} | {_ppl(e['test'])} | "
                         f"`{e['command']}` |")
        done = [e for e in rows if e["complete"]]
        if len(done) >= 2:
            for split in ("valid", "test"):
                values = [e[split] for e in done]
                lines.append("")
                lines.append(f"{split}: mean {statistics.mean(values):.2f} over {len(values)} "
                             f"seeds, range {min(values):.2f}-{max(values):.2f}.")
        lines += ["", f"![{preset} validation curves](record_{preset}.png)", ""]
    return "\n".join(lines)


def figure(entries, preset, path):
    """Validation perplexity per epoch of every seed of `preset`, the published line."""
    import matplotlib  # deferred: plotting only when the record is written
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [e for e in entries if e["preset"] == preset]
    fig, ax = plt.subplots(figsize=(6, 4))
    for e in rows:
        label = f"seed {e['seed']}, {e['backend']}" + ("" if e["complete"] else " (partial)")
        ax.plot(range(1, len(e["curve"]) + 1), e["curve"], marker="o", ms=3, label=label)
    published = rows[0]["published"].get("valid")
    if published is not None:
        ax.axhline(published, color="k", ls="--", lw=1, label=f"published valid {published}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation perplexity")
    ax.set_yscale("log")
    ax.set_title(preset)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.reproductions.record",
                                description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", help="zoo.train run folders to add or update")
    p.add_argument("--hardware", default=machine_line(),
                   help="where the runs were made (default: this machine)")
    p.add_argument("--backend", default="tensorflow",
                   help="the Keras backend of runs whose metrics.json does not name it "
                        "(partial runs; default tensorflow, zoo.train's default)")
    p.add_argument("--record", default=str(RECORD), help="the record's JSON file")
    args = p.parse_args(argv)
    record = pathlib.Path(args.record)
    entries = json.loads(record.read_text()) if record.exists() else []
    for run in args.runs:
        entries = merge(entries, entry_of(run, args.hardware, args.backend))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(entries, indent=2) + "\n")
    for preset in {e["preset"] for e in entries}:
        figure(entries, preset, record.parent / f"record_{preset}.png")
    publish("Reproductions: presets run to their end or partway", page(entries),
            record.parent / PAGE.name, command=this_command())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
