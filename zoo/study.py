"""`python -m zoo.study`: one command for a published table: its arms, grid and seeds as
trials on Ray Tune, then our cells beside the published ones, with spreads and p-values.

    python -m zoo.study NAME|FILE [--scale smoke|paper] [--seeds N] [--out DIR]
        [--address ADDR] [--workers W] [--data-dir D] [--list]

A study (`zoo.studies`: a JSON file like a preset) names the table it reproduces, its arms
(presets plus overrides), grid, seeds, the metrics each trial contributes and the published
cells. Every trial is a normal `zoo.train` run folder, `DIR/trials/<arm>[__field=value]__seed<s>`
(`python -m zoo.evaluate` works on it), trained on Ray Tune (`zoo.studies.engine`): locally
by default, on a running Ray cluster with `--address` (see the README), one trial per CPU,
or per GPU where the cluster has GPUs; a failed trial is retried from its last checkpoint and
reported if it fails again.

Run the same command again and it resumes: finished trials are skipped, interrupted ones
continue from their last epoch checkpoint, the rest train. A folder made for another study,
scale or seed count is refused.

Writes into DIR: `study.json` (what was run), `results.md` (the table; also printed),
`results.csv`, `curves.png` (validation perplexity per arm, mean +- 1 SD over the seeds), the
figures of the study's measures (`zoo.studies.figures`: rank against perplexity, Q and
embedding spectra, word-similarity bars and win counts; each trial's figures in its
`measures.json`) and Tune's records under `engine/`. A searched arm (`zoo.studies`:
`"search"`) first trains its search in `searches/ARM/` (zoo.search's folder: trial_XXX,
summary.md, chosen.json); its trials then train the draw of lowest validation perplexity,
and results.md sets that draw beside the paper's. `--scale smoke` runs the study's tiny
version (small sizes, two seeds, one epoch) in minutes on a CPU: the check that a study runs
before it is given a cluster.

Exit codes: 0; 1 if a trial failed after its retries (the table shows what finished); 2 for
a bad command (unknown study, a field a preset does not have, Ray not installed), one line
on stderr; 130 on Ctrl-C (finished trials are kept).

Reference: Parthiban 2020 thesis §4.3.5, Tables 4.4-4.9 (seeds/000).
"""

import argparse
import json
import pathlib
import sys

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.user_errors import check_output_dir, one_line_errors

STUDY_FILE = "study.json"


def build_parser():
    p = argparse.ArgumentParser(prog="python -m zoo.study",
                                description=__doc__.splitlines()[0])
    p.add_argument("study", nargs="?", help="a bundled study (--list) or a study JSON file")
    p.add_argument("--scale", choices=("smoke", "paper"), default="paper",
                   help="paper: the study as published (default); smoke: its tiny version")
    p.add_argument("--seeds", type=int, metavar="N", help="the first N of the scale's seeds")
    p.add_argument("--out", help="the study's folder (default: study_NAME_SCALE)")
    p.add_argument("--address", help="a running Ray cluster to join (HOST:PORT, or 'auto'); "
                                     "default: a local one on this machine")
    p.add_argument("--workers", type=int, metavar="W",
                   help="trials at a time (default: as many as the cluster's CPUs / GPUs)")
    p.add_argument("--data-dir", help="where named corpora lie (on every machine)")
    p.add_argument("--list", action="store_true", help="print the bundled studies and exit")
    return p


def _check_folder(folder, record):
    path = folder / STUDY_FILE
    if path.exists():
        found = json.loads(path.read_text())
        if {k: found.get(k) for k in ("study", "scale", "seeds")} != \
                {k: record[k] for k in ("study", "scale", "seeds")}:
            raise UserError(f"{folder} holds study {found.get('study')!r} at scale "
                            f"{found.get('scale')!r} with seeds {found.get('seeds')}; resume "
                            "it with its own command or choose another --out.")
    elif (folder / "trials").exists():
        raise UserError(f"{folder} holds trials but no {STUDY_FILE}: not a study's folder; "
                        "choose another --out.")


def _run_searches(study, scale, folder, data_dir, address, workers):
    """Each searched arm's search (`zoo.studies.search.search_arm`), before any trial:
    ({arm: its chosen draw}, {what failed: error}, the draws' markdown for results.md)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.studies.search import draw_table, search_arm
    from zoo.studies.trials import arm_search
    draws, failed, text = {}, {}, ""
    for arm, spec in study["arms"].items():
        arm_spec = arm_search(spec, scale)
        if arm_spec is None:
            continue
        print(f"zoo.study: arm {arm}: searching {arm_spec['trials']} draws first", flush=True)
        row, search_failed = search_arm(study, arm, scale, folder, data_dir, address, workers)
        failed.update({f"searches/{arm}/{trial}": error
                       for trial, error in search_failed.items()})
        text += "\n" + draw_table(arm, row, arm_spec)
        if row is None:
            failed[arm] = "no trial of its search finished; its trials were not trained"
        else:
            draws[arm] = row["values"]
    return draws, failed, text


def run_study(name, scale="paper", seeds=None, out=None, address=None, workers=None,
              data_dir=None):
    """Run (or resume) the study; returns (table rows, {failed trial: error})."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.corpora import load_data
    from zoo.runs.run_state import run_state
    from zoo.studies import aggregate, engine, figures, load_study
    from zoo.studies.trials import arm_search, plan
    study = load_study(name)
    trials = plan(study, scale, seeds)  # searched arms with stand-in draws: every field checked
    folder = pathlib.Path(out or f"study_{study['name']}_{scale}")
    check_output_dir(folder, "--out")
    record = {"study": study["name"], "scale": scale, "seeds": sorted({t.seed for t in trials}),
              "reproduces": study["reproduces"], "trials": [t.name for t in trials]}
    _check_folder(folder, record)
    for corpus in {json.dumps(t.config["corpus"], sort_keys=True) for t in trials}:
        load_data(json.loads(corpus), data_dir)  # a missing corpus: exit 2 before any trial
    (folder / "trials").mkdir(parents=True, exist_ok=True)
    atomic_files.write_json(folder / STUDY_FILE, {**record, "definition": study})
    with engine.one_session():  # the searches' trials and the study's on one cluster
        draws, failed, searches = _run_searches(study, scale, folder, data_dir, address,
                                                workers)
        if draws:
            trials = plan(study, scale, seeds, draws)
        runnable = [t for t in trials  # a searched arm trains once its search chose a draw
                    if t.arm in draws or arm_search(study["arms"][t.arm], scale) is None]
        states = [run_state(folder / "trials" / t.name) for t in runnable]
        done = sum(s in engine.DONE for s in states)
        print(f"zoo.study: {study['name']} ({study['reproduces']}), scale {scale}: "
              f"{len(runnable)} trials in {folder}: {done} done before, "
              f"{states.count('interrupted')} to resume, {states.count('new')} new",
              flush=True)
        failed.update(engine.run_trials([(t.name, t.config, folder / "trials" / t.name)
                                         for t in runnable], folder / "engine",
                                        data_dir=data_dir, address=address, workers=workers,
                                        measures=study.get("measures", [])))
    rows = aggregate.cells(study, trials, folder)
    table = (f"## {study['name']}: {study['reproduces']} (scale {scale})\n\n"
             + aggregate.markdown(rows, study))
    table += searches
    if study.get("assumptions"):
        table += "\nAssumed: " + " ".join(study["assumptions"]) + "\n"
    table += engine.failures_text(failed)
    print(table)
    with atomic_files.failing_in_one_line(folder / "results.md", "the table is printed above "
                                          "and every trial's run folder is whole"):
        atomic_files.write_text(folder / "results.md", table)
    aggregate.write_csv(rows, folder / "results.csv", study["metrics"])
    figures.curves(trials, folder, folder / "curves.png",
                   f"{study['name']} ({scale}): validation perplexity, mean +- 1 SD")
    measures = study.get("measures", [])
    if "rank" in measures:
        figures.rank_vs_perplexity(trials, folder, folder / "rank_vs_perplexity.png",
                                   f"{study['name']} ({scale})")
        figures.spectra(trials, folder, folder / "q_spectra.png", "q")
    if "embedding_spectrum" in measures:
        figures.spectra(trials, folder, folder / "embedding_spectra.png", "embedding")
    if "word_similarity" in measures:
        figures.word_similarity(trials, folder, folder / "word_similarity.png",
                                folder / "win_counts.png")
    return rows, failed


@one_line_errors("zoo.study")
def main(argv=None):
    start_command()
    try:
        args = build_parser().parse_args(argv)
        # deferred: a command's frameworks import after start_command (zoo.runtime.command)
        from tflm.data import CorpusNotFoundError
        from zoo.errors import ConfigError
        from zoo.studies import list_studies
        imports_done()
        if args.list or not args.study:
            print("\n".join(list_studies()))
            return 0 if args.list else 2
        try:
            _, failed = run_study(args.study, args.scale, args.seeds, args.out, args.address,
                                  args.workers, args.data_dir)
        except (UserError, ConfigError, CorpusNotFoundError) as err:
            print(f"zoo.study: error: {err}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("zoo.study: interrupted; finished trials are kept, and the same command "
              "continues the study (an interrupted trial resumes from its last epoch).",
              file=sys.stderr)
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    run_command(main)
