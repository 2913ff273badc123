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
import pathlib
import sys

from zoo.errors import UserError
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.user_errors import one_line_errors


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


@one_line_errors("zoo.search")
def main(argv=None):
    start_command()
    try:
        args = build_parser().parse_args(argv)
        # deferred: a command's frameworks import after start_command (zoo.runtime.command)
        from tflm.data import CorpusNotFoundError
        from zoo.runs.checkpoint import CheckpointError
        from zoo.studies.search import search
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
