"""`python -m zoo.search`: random search over a preset's fields, each trial a `zoo.train` run.

    python -m zoo.search --preset NAME --space zhang2018_mos|SPACE.json --trials N \
        --seed S --out DIR [--epochs E] [--set key=value ...] [--data-dir D]
        [--algorithm random|tpe] [--address ADDR] [--workers W]

Trial i draws its fields from the space (`zoo.runs.search_space`: uniform, log-uniform, int,
choice; constraints by rejection) with `default_rng([S, i])`, applies them to the preset
(after `--set`, before `--epochs`, which shortens every trial), and trains it with
`zoo.runs.training.run` into `DIR/trial_XXX`: a normal run directory (config.json, metrics.json,
best.keras, ... `python -m zoo.evaluate DIR/trial_003` works on it) plus `sample.json`, the
drawn values. The trials run on the study engine (`zoo.studies.engine`: Ray Tune, the
`study` extra): side by side on a local Ray cluster by default (`--workers` caps them), on
a running cluster with `--address`; Tune's records go to `DIR/engine/`. At the end
`DIR/summary.md` holds a markdown table of every trial sorted by validation perplexity
(printed as well); trials that diverged are listed last, and trials that failed after
the engine's retries are named below it.

`--algorithm tpe` asks Optuna's TPE sampler instead (`zoo.studies.tpe`: Bayesian
optimisation of the validation perplexity, `--workers` trials asked at a time, draws that
break a constraint rejected untrained, the search's state in `DIR/optuna.db`); trial k is
Optuna's trial number k.

Resumable: run the same command again and a finished trial (metrics.json, or a recorded
divergence) is not rerun, an interrupted one continues from its last epoch checkpoint
(`zoo.runs.resume`), and the rest are trained. A trial directory whose `sample.json` differs
from what the command draws (another seed, space or preset) is refused, naming it.

Exit codes: 0; 1 if a trial failed after its retries; 2 for a bad command (unknown preset
or space, a field the configuration does not have, Ray not installed), one line on stderr;
130 on Ctrl-C (what finished is kept).

Reference: Zhang 2018 §6.3 and Appendix A.2 (seeds/004); Bergstra & Bengio 2012.
"""

import argparse
import json
import math
import pathlib
import sys

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.user_errors import check_output_dir, one_line_errors

SAMPLE_FILE = "sample.json"


def build_parser():
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.search_space import SPACES
    p = argparse.ArgumentParser(prog="python -m zoo.search",
                                description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True, help="the preset every trial starts from")
    p.add_argument("--space", required=True,
                   help=f"a built-in space ({', '.join(SPACES)}) or a JSON file: "
                        "{\"fields\": {dotted field: distribution}, \"constraints\": [...]}")
    p.add_argument("--trials", type=int, required=True, metavar="N", help="number of trials")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the draws (trial i uses default_rng([S, i])); default 0")
    p.add_argument("--out", required=True, help="search directory: DIR/trial_000, ..., "
                                                "DIR/summary.md")
    p.add_argument("--epochs", type=int, metavar="E",
                   help="train every trial E epochs (overrides the space and preset)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="fixed overrides applied to the preset before the draws (repeatable)")
    p.add_argument("--data-dir", help="where named corpora lie")
    p.add_argument("--address", help="a running Ray cluster to join (HOST:PORT, or 'auto'); "
                                     "default: a local one on this machine")
    p.add_argument("--workers", type=int, metavar="W",
                   help="trials at a time (default: as many as the cluster's CPUs / GPUs)")
    p.add_argument("--algorithm", choices=("random", "tpe"), default="random",
                   help="random: trial i drawn with default_rng([S, i]) (default); tpe: "
                        "Optuna's TPE sampler with seed S, --workers trials asked at a time, "
                        "its state in OUT/optuna.db")
    p.add_argument("--quiet", action="store_true",
                   help="accepted for older commands: trials on the engine always print one "
                        "line per epoch")
    return p


def trial_config(preset, overrides, values, epochs=None):
    """The configuration of one trial: preset, `--set` overrides, drawn values, --epochs."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.config import resolve_config
    from zoo.runs.settings import RunSettings
    from zoo.runs.search_space import apply_sample
    config = resolve_config(preset, overrides)
    apply_sample(config, values)
    if epochs is not None:
        config["training"]["epochs"] = int(epochs)
    RunSettings.from_config(config)  # every trial's configuration checked before any trains
    return config


def trial_dir(out, index):
    return pathlib.Path(out) / f"trial_{index:03d}"


def trial_state(path):
    """"finished", "diverged", "interrupted" (a checkpoint, no results) or "new"."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.run_state import run_state
    return run_state(path)


def _check_sample(path, record):
    sample_path = path / SAMPLE_FILE
    if not sample_path.exists():
        if trial_state(path) != "new":
            raise UserError(f"{path} holds a run but no {SAMPLE_FILE}: not a trial of this "
                            "search; choose another --out.")
        return
    found = json.loads(sample_path.read_text())
    if found.get("values") != record["values"] or found.get("preset") != record["preset"]:
        raise UserError(f"{path} was drawn with other values ({sample_path}) than this "
                        "command draws (another --seed, --space, --preset or --set); resume "
                        "with the original command or choose another --out.")


def summary_row(index, path):
    """{trial, status, valid, test, best_epoch, parameters, words_per_second, values}."""
    record = json.loads((path / SAMPLE_FILE).read_text())
    row = {"trial": index, "dir": path.name, "values": record["values"],
           "status": trial_state(path)}
    if row["status"] == "finished":
        metrics = json.loads((path / "metrics.json").read_text())
        row.update(valid=metrics.get("valid_perplexity"), test=metrics.get("test_perplexity"),
                   best_epoch=metrics.get("best_epoch"), parameters=metrics.get("parameters"),
                   words_per_second=metrics.get("words_per_second"))
    return row


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _sort_key(row):
    valid = row.get("valid")
    ok = row["status"] == "finished" and valid is not None and math.isfinite(valid)
    return (0 if ok else 1, valid if ok else 0.0, row["trial"])


def summary_table(rows, title=""):
    """Markdown table of the trials, best validation perplexity first."""
    fields = list(rows[0]["values"]) if rows else []
    head = ["rank", "trial", "valid ppl", "test ppl", "best epoch", "params", "words/s"] + \
        [f"`{f}`" for f in fields]
    lines = ([f"## {title}", ""] if title else []) + [
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, row in enumerate(sorted(rows, key=_sort_key), start=1):
        if row["status"] == "finished":
            cells = [f"{row['valid']:.2f}", f"{row['test']:.2f}", str(row["best_epoch"]),
                     f"{row['parameters']:,}", f"{row['words_per_second'] or 0:,.0f}"]
        else:
            cells = [row["status"], "-", "-", "-", "-"]
        values = [_fmt(row["values"][f]) for f in fields]
        lines.append("| " + " | ".join([str(rank), row["dir"]] + cells + values) + " |")
    return "\n".join(lines) + "\n"


def _record(preset, space, seed, index, overrides, epochs, values, algorithm):
    record = {"preset": preset, "space": space.get("name"), "seed": seed, "trial": index,
              "overrides": list(overrides), "epochs": epochs, "values": values}
    if algorithm != "random":
        record["algorithm"] = algorithm
    return record


def _new_trial_folder(path, record):
    if trial_state(path) == "new":
        path.mkdir(parents=True, exist_ok=True)
        atomic_files.write_json(path / SAMPLE_FILE, record)


def _tpe(preset, space, trials, seed, out, epochs, overrides, data_dir, address, workers):
    """The TPE search (`zoo.studies.tpe`): (trained trial numbers, {folder: error})."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.search_space import sample
    from zoo.studies.engine import run_trials
    from zoo.studies.tpe import import_optuna, tpe_search
    import_optuna()  # missing: exit 2 before anything is written
    trial_config(preset, overrides, sample(space, seed, 0), epochs)  # the fields exist
    failures = {}

    def run_batch(batch):
        runs = []
        for number, values in batch:
            config = trial_config(preset, overrides, values, epochs)
            config["search"] = {"space": space.get("name"), "seed": seed, "trial": number,
                                "algorithm": "tpe"}
            record = _record(preset, space, seed, number, overrides, epochs, values, "tpe")
            path = trial_dir(out, number)
            _check_sample(path, record)
            _new_trial_folder(path, record)
            runs.append((path.name, config, path))
        failures.update(run_trials(runs, out / "engine", data_dir=data_dir, address=address,
                                   workers=workers))
        return {number: summary_row(number, trial_dir(out, number)).get("valid")
                for number, _ in batch}

    out.mkdir(parents=True, exist_ok=True)
    return tpe_search(space, trials, seed, out, workers, run_batch), failures


def search(preset, space_name, trials, seed, out, epochs=None, overrides=(), data_dir=None,
           address=None, workers=None, algorithm="random"):
    """Run (or resume) the search on the study engine (`zoo.studies.engine`, Ray Tune);
    returns (the summary rows: every trial, in trial order; {trial folder: error} for the
    trials that failed after their retries)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.search_space import load_space, sample
    from zoo.studies.engine import run_trials
    if trials < 1:
        raise UserError(f"--trials must be >= 1; got {trials}.")
    space = load_space(space_name)
    out = pathlib.Path(out)
    check_output_dir(out, "--out")  # before any trial trains
    if algorithm == "tpe":
        numbers, failed = _tpe(preset, space, trials, seed, out, epochs, overrides, data_dir,
                               address, workers)
        return _summarise([summary_row(n, trial_dir(out, n)) for n in numbers], failed,
                          f"TPE search (Optuna): preset {preset}, space {space.get('name')}, "
                          f"seed {seed}, {trials} trial{'s' * (trials != 1)}", epochs, out)
    plans = []
    for index in range(trials):  # every draw and configuration checked before training
        values = sample(space, seed, index)
        config = trial_config(preset, overrides, values, epochs)
        config["search"] = {"space": space.get("name"), "seed": seed, "trial": index}
        record = _record(preset, space, seed, index, overrides, epochs, values, "random")
        _check_sample(trial_dir(out, index), record)
        plans.append((index, record, config))
    for index, record, _ in plans:
        _new_trial_folder(trial_dir(out, index), record)
    failed = run_trials([(trial_dir(out, i).name, config, trial_dir(out, i))
                         for i, _, config in plans], out / "engine", data_dir=data_dir,
                        address=address, workers=workers)
    return _summarise([summary_row(index, trial_dir(out, index)) for index, _, _ in plans],
                      failed, f"Random search: preset {preset}, space {space.get('name')}, "
                      f"seed {seed}, {trials} trial{'s' * (trials != 1)}", epochs, out)


def _summarise(rows, failed, title, epochs, out):
    """Print and write summary.md; returns (rows, failed)."""
    title += f" of {epochs} epoch{'s' * (epochs != 1)}" if epochs else ""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.studies.engine import failures_text
    table = summary_table(rows, title) + failures_text(failed)
    print(table)
    with atomic_files.failing_in_one_line(out / "summary.md", "the table is printed above "
                                          "and every trial's run folder is whole"):
        atomic_files.write_text(out / "summary.md", table)
    return rows, failed


@one_line_errors("zoo.search")
def main(argv=None):
    start_command()
    try:
        args = build_parser().parse_args(argv)
        # deferred: a command's frameworks import after start_command (zoo.runtime.command)
        from tflm.data import CorpusNotFoundError
        from zoo.runs.checkpoint import CheckpointError
        imports_done()
        try:
            _, failed = search(args.preset, args.space, args.trials, args.seed, args.out,
                               epochs=args.epochs, overrides=args.set,
                               data_dir=args.data_dir, address=args.address,
                               workers=args.workers, algorithm=args.algorithm)
        except (UserError, CorpusNotFoundError, CheckpointError) as err:
            print(f"zoo.search: error: {err}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("zoo.search: interrupted; finished trials are kept, and the same command "
              "continues the search (an interrupted trial resumes from its last epoch).",
              file=sys.stderr)
        return 130
    print(f"summary in {pathlib.Path(args.out) / 'summary.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    run_command(main)
