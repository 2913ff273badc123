"""Two-sided Wilcoxon rank-sum test between two samples (e.g. test perplexities over seeds),
and the command that runs it on two sets of `zoo.train` run folders:

    python -m tools.stats RUN [RUN ...] --vs RUN [RUN ...] [--metric test_perplexity]
        [--labels A B] [--alpha 0.05] [--json FILE]

which prints each set's runs, mean +- standard deviation (over the runs, n - 1 in the
denominator, as the thesis's tables) and median, then the test's sentence.

The test and the summary are `zoo.studies.significance`'s (Parthiban 2020 thesis §4.3.5,
Table 4.9), which `python -m zoo.study` uses for its arms.

Example:
    >>> r = wilcoxon_rank_sum([57.2, 57.4, 57.1, 57.5, 57.3], [56.1, 56.0, 56.3, 55.9, 56.2],
    ...                       label_a="Softmax", label_b="GSS")
    >>> round(r.pvalue, 4)
    0.009
"""

import argparse
import json
import pathlib
import sys

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.user_errors import check_output_file, one_line_errors
from zoo.studies.significance import summary, wilcoxon_rank_sum


def run_metric(folder, metric):
    """`metric` of the finished `zoo.train` run in `folder` (its metrics.json); a
    `UserError` naming the folder and what to do otherwise."""
    path = pathlib.Path(folder) / "metrics.json"
    if not path.is_file():
        raise UserError(f"{folder}: no metrics.json; give folders of finished zoo.train runs")
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not readable as JSON ({err})") from err
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        numeric = sorted(k for k, v in metrics.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise UserError(f"{path} has no number {metric!r}; --metric takes one of "
                        f"{', '.join(numeric)}")
    return float(value)


def compare_runs(runs_a, runs_b, metric="test_perplexity", alpha=0.05, labels=("A", "B")):
    """The two sets' metric values, their summaries and `wilcoxon_rank_sum` between them."""
    a = [run_metric(r, metric) for r in runs_a]
    b = [run_metric(r, metric) for r in runs_b]
    test = wilcoxon_rank_sum(a, b, alpha=alpha, label_a=labels[0], label_b=labels[1])
    arms = [{"label": label, "runs": [str(r) for r in runs], "values": values,
             **summary(values)} for label, runs, values in ((labels[0], runs_a, a),
                                                           (labels[1], runs_b, b))]
    return {"metric": metric, "arms": arms,
            "test": {"statistic": test.statistic, "pvalue": test.pvalue,
                     "significant": test.significant, "alpha": alpha,
                     "sentence": test.sentence}}


def format_comparison(result):
    lines = [f"| arm | runs | mean +- sd | median | {result['metric']} per run |",
             "| --- | ---: | --- | ---: | --- |"]
    for arm in result["arms"]:
        lines.append(f"| {arm['label']} | {arm['n']} | {arm['mean']:.2f} +- {arm['sd']:.2f} | "
                     f"{arm['median']:.2f} | {', '.join(f'{v:.2f}' for v in arm['values'])} |")
    return "\n".join(lines + ["", result["test"]["sentence"]])


@one_line_errors("tools.stats")
def main(argv=None):
    """Entry point of `python -m tools.stats`; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m tools.stats",
                                description="Wilcoxon rank-sum test between two sets of "
                                "zoo.train runs (e.g. one per seed of two models).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders of the first arm")
    p.add_argument("--vs", nargs="+", required=True, metavar="RUN",
                   help="run folders of the second arm")
    p.add_argument("--metric", default="test_perplexity",
                   help="a number of each run's metrics.json (default test_perplexity)")
    p.add_argument("--labels", nargs=2, default=("A", "B"), metavar=("A", "B"))
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.json:
        check_output_file(args.json, "--json", make_folders=True)
    try:
        result = compare_runs(args.runs, args.vs, args.metric, args.alpha, tuple(args.labels))
    except ValueError as err:
        if isinstance(err, UserError):
            raise
        raise UserError(str(err)) from err
    print(format_comparison(result))
    if args.json:
        pathlib.Path(args.json).absolute().parent.mkdir(parents=True, exist_ok=True)
        atomic_files.write_result_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
