"""A study's table: per arm and grid point, each metric's mean +- standard deviation over
the seeds that finished, the published cell beside it and the difference, and the two-sided
Wilcoxon rank-sum test of every arm against the baseline (Parthiban 2020 Tables 4.8 / 4.9).

    mean = sum(x) / n,  sd = sqrt(sum((x - mean)^2) / (n - 1))   (n >= 2; "-" for one seed)
    difference = our mean - the published value
    p = `zoo.studies.significance.wilcoxon_rank_sum`(arm's values, baseline's values) at the
        same grid point, on the study's first metric

A metric is a key of the trial's metrics.json or of its measures.json (`press_rank`,
`word_similarity_mean`, ...: `zoo.studies.measures`). `cells(study, trials, folder)` reads
the trial folders; `markdown(rows, study)` and `write_csv(rows, path)` write what
`python -m zoo.study` prints and saves.
"""

import csv
import json
import math

from zoo.runs.run_state import run_state
from zoo.studies.measures import flat, read_measures
from zoo.studies.significance import summary, wilcoxon_rank_sum


def _published(study, arm, point):
    for cell in study.get("published", []):
        if cell["arm"] == arm and cell.get("point", {}) == point:
            return cell
    return {}


def cells(study, trials, folder):
    """One row per (arm, point), in the study's order: {arm, point, seeds, states,
    values {metric: [per finished seed]}, mean, sd, published, difference, p_value}."""
    rows = {}
    for trial in trials:
        key = (trial.arm, trial.point)
        row = rows.setdefault(key, {"arm": trial.arm, "point": trial.point_dict, "seeds": [],
                                    "states": {}, "values": {m: [] for m in study["metrics"]}})
        path = folder / "trials" / trial.name
        state = run_state(path)
        row["states"][trial.seed] = state
        if state != "finished":
            continue
        metrics = {**json.loads((path / "metrics.json").read_text()),
                   **flat(read_measures(path))}
        row["seeds"].append(trial.seed)
        for metric in study["metrics"]:
            value = metrics.get(metric)
            row["values"][metric].append(float(value) if value is not None else math.nan)
    baseline = study.get("baseline")
    first = study["metrics"][0]
    for (arm, point), row in rows.items():
        row["mean"], row["sd"], row["difference"] = {}, {}, {}
        published = _published(study, arm, row["point"])
        row["published"] = {k: v for k, v in published.items() if k not in ("arm", "point")}
        for metric, values in row["values"].items():
            finite = [v for v in values if math.isfinite(v)]
            stats = summary(finite) if len(finite) >= 2 else None
            row["mean"][metric] = (stats["mean"] if stats else
                                   finite[0] if finite else None)
            row["sd"][metric] = stats["sd"] if stats else None
            if row["mean"][metric] is not None and metric in row["published"]:
                row["difference"][metric] = row["mean"][metric] - row["published"][metric]
        row["p_value"] = None
        if baseline and arm != baseline and (baseline, point) in rows:
            ours, theirs = row["values"][first], rows[baseline, point]["values"][first]
            if min(len(ours), len(theirs)) >= 2 and all(map(math.isfinite, ours + theirs)):
                row["p_value"] = wilcoxon_rank_sum(ours, theirs).pvalue
    return list(rows.values())


def _number(value, digits=2):
    return "-" if value is None else f"{value:,.{digits}f}"


def _point_text(point):
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items()) or "-"


def markdown(rows, study):
    """The table: arm, point, seeds finished of planned, then per metric ours (mean +- sd),
    published (+- its sd where printed), difference; then the p-value against the
    baseline (and the published one where printed)."""
    metrics, baseline = study["metrics"], study.get("baseline")
    head = ["arm", "point", "seeds"]
    for m in metrics:
        head += [f"{m} (ours)", f"{m} (published)", "difference"]
    if baseline:
        head.append(f"p vs {baseline} ({metrics[0]})")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        done = len(row["seeds"])
        cells_ = [row["arm"], _point_text(row["point"]), f"{done} of {len(row['states'])}"]
        for m in metrics:
            ours = _number(row["mean"][m])
            if row["sd"][m] is not None:
                ours += f" +- {_number(row['sd'][m])}"
            published = _number(row["published"].get(m))
            if row["published"].get(f"{m}_sd") is not None:
                published += f" +- {_number(row['published'][f'{m}_sd'])}"
            cells_ += [ours, published, _number(row["difference"].get(m))]
        if baseline:
            p = "-" if row["p_value"] is None else f"{row['p_value']:.3g}"
            if row["published"].get("p_value") is not None:
                p += f" (published {row['published']['p_value']:.3g})"
            cells_.append(p)
        lines.append("| " + " | ".join(cells_) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows, path, metrics):
    """The same cells, one line per (arm, point), machine-read."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arm", "point", "seeds_finished", "seeds_planned"]
                        + [f"{m}_{part}" for m in metrics
                           for part in ("mean", "sd", "published", "difference")]
                        + ["p_value"])
        for row in rows:
            writer.writerow([row["arm"], json.dumps(row["point"]), len(row["seeds"]),
                             len(row["states"])]
                            + [row[part].get(m) if part != "published" else
                               row["published"].get(m)
                               for m in metrics for part in ("mean", "sd", "published",
                                                             "difference")]
                            + [row["p_value"]])
