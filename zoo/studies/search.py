"""Searches over a preset's fields on the study engine: random search (each draw from
`zoo.runs.search_space`) or Optuna's TPE (`zoo.studies.tpe`), every trial a `zoo.train`
run folder with its draw in `sample.json`, and the summary table of the trials.
`python -m zoo.search` is its command line, and a study's searched arm (`zoo.studies`:
an arm with `"search"`) runs its search here before its trials train the best draw.

Trial i of a random search draws with `default_rng([seed, i])` and is `OUT/trial_<i>`; a
search run again skips finished trials, resumes interrupted ones and refuses a folder drawn
with other values. Reference: Zhang 2018 §6.3 and Appendix A.2 (seeds/004); Bergstra &
Bengio 2012.
"""

import json
import math
import pathlib

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.user_errors import check_output_dir
from zoo.studies.trials import arm_search, assignments, scale_settings

SAMPLE_FILE = "sample.json"
CHOSEN_FILE = "chosen.json"
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
    from zoo.studies.engine import one_session, run_trials
    if trials < 1:
        raise UserError(f"--trials must be >= 1; got {trials}.")
    space = load_space(space_name)
    out = pathlib.Path(out)
    check_output_dir(out, "--out")  # before any trial trains
    if algorithm == "tpe":
        with one_session():  # one cluster for every batch Optuna asks for
            numbers, failed = _tpe(preset, space, trials, seed, out, epochs, overrides,
                                   data_dir, address, workers)
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


def chosen(rows):
    """The summary row (`summary_row`) of the finished trial of lowest validation
    perplexity, or None when no trial finished."""
    best = sorted(rows, key=_sort_key)
    if best and _sort_key(best[0])[0] == 0:
        return best[0]
    return None


def search_arm(study, arm, scale, folder, data_dir=None, address=None, workers=None):
    """Run (or resume) the search of the study's searched `arm` at `scale` in
    `folder/searches/ARM` (zoo.search's folder: trial_XXX, summary.md, engine/). Its trials
    are the arm's preset with the scale's `set` and the search's `set`, then each draw.
    Returns (the chosen summary row or None, {trial folder: error})."""
    spec = study["arms"][arm]
    arm_spec = arm_search(spec, scale)
    _, scale_set, _ = scale_settings(study, scale)
    out = pathlib.Path(folder) / "searches" / arm
    rows, failed = search(spec["preset"], arm_spec["space"], arm_spec["trials"],
                          arm_spec.get("seed", 0), out,
                          overrides=assignments(scale_set) + assignments(arm_spec.get("set",
                                                                                      {})),
                          data_dir=data_dir, address=address, workers=workers,
                          algorithm=arm_spec.get("algorithm", "random"))
    row = chosen(rows)
    if row is not None:
        atomic_files.write_json(out / CHOSEN_FILE, {"trial": row["dir"], "values": row["values"],
                                                    "valid_perplexity": row["valid"]})
    return row, failed


def draw_table(arm, row, arm_spec):
    """Markdown: the searched arm's chosen draw beside the paper's (`published`), field by
    field, with the search's size; a sentence when no trial finished."""
    title = (f"### Search for arm {arm}: {arm_spec.get('algorithm', 'random')}, "
             f"{arm_spec['trials']} trial{'s' * (arm_spec['trials'] != 1)}, seed "
             f"{arm_spec.get('seed', 0)}\n\n")
    if row is None:
        return title + "No trial of the search finished: the arm was not trained.\n"
    published = arm_spec.get("published", {})
    lines = [f"Chosen: {row['dir']} (validation perplexity {row['valid']:.2f}).", "",
             "| field | chosen | published |", "| --- | --- | --- |"]
    for field in list(row["values"]) + [f for f in published if f not in row["values"]]:
        lines.append(f"| `{field}` | {_fmt(row['values'].get(field, '-'))} | "
                     f"{_fmt(published.get(field, '-'))} |")
    return title + "\n".join(lines) + "\n"
