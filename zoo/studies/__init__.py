"""Studies: JSON files in this folder, each the protocol of a published table, which
`python -m zoo.study NAME` runs as trials on Ray Tune and sets beside the published cells.

A study is data, as a preset is:

    description   what it is
    reproduces    the table it reproduces (paper, table number)
    arms          {arm: {"preset": NAME, "set": {dotted field: value},
                         "scales": {"smoke": {"set": {...}}}}}: a scale's settings for
                  that arm alone come after the scale's own
                  a searched arm adds "search": {"space": NAME or {space}, "trials": N,
                  "seed": S, "algorithm": "random"|"tpe", "set": {...}, "published":
                  {field: value}}: before its trials train, a search (`zoo.studies.search`,
                  `zoo.runs.search_space`) trains N draws of the space on the preset (with
                  the scale's settings, then the search's `set`), and the arm's trials
                  train the draw of lowest validation perplexity: preset, the draw, the
                  arm's `set` (Zhang 2018 §6.3: the best of 20-epoch trials, trained longer
                  with a decaying rate), ...; `published` is the paper's best draw;
                  `arms.ARM.scales.smoke.search` changes the search at that scale
    grid          {dotted field: [values]}, optional: every arm runs at every point of the
                  cross product (Parthiban 2020 Table 4.4's (c, k) grid)
    seeds         [seed, ...] at paper scale (each trial's `training.seed`)
    metrics       what each trial contributes to the table, from its metrics.json
                  (`valid_perplexity`, `test_perplexity`, `bpc`, ...)
    measures      optional: ["rank", "word_similarity", "embedding_spectrum"], taken on
                  every finished trial (`zoo.studies.measures`); their figures
                  (`press_rank`, `word_similarity_mean`, ...) can be named in `metrics`
    baseline      optional: the arm every other arm is tested against (two-sided Wilcoxon
                  rank-sum over seeds of the first metric, as the thesis's Table 4.9)
    published     [{"arm": ARM, "point": {field: value}, METRIC: value, ...}]: the cells the
                  study reproduces (a mean over seeds where the paper ran several;
                  `METRIC_sd` and `p_value` where it printed them)
    scales        {"smoke": {"seeds": [...], "set": {...}, "grid": {...}}}: what a scale
                  changes (smoke: tiny sizes, two seeds, one epoch; its own, smaller grid)
    assumptions   [TEXT]: where an arm is not what the paper states (a missing preset
                  replaced, a setting inferred)

`load_study(name_or_path)` reads and checks one (every arm's preset, every field of `set`
and `grid` resolved against it), `list_studies()` names the bundled ones.
"""

import pathlib

from zoo.bundled_json import bundled_names, read_bundled_json
from zoo.errors import ConfigError
from zoo.studies.measures import MEASURES, unknown_measures
from zoo.studies.trials import arm_search, search_problem

_DIR = pathlib.Path(__file__).resolve().parent
SCALES = ("smoke", "paper")
KEYS = {"description", "reproduces", "arms", "grid", "seeds", "metrics", "measures",
        "baseline", "published", "scales", "assumptions"}


def list_studies():
    """Names of the bundled studies."""
    return bundled_names(_DIR)


def load_study(name):
    """The study `name` (or a path to a JSON file) as a checked dict, with `name` set."""
    path, study = read_bundled_json(name, _DIR, "study", "fix the file.",
                                    "with arms, seeds and metrics")
    check_study(study, path)
    study["name"] = path.stem
    return study


def check_study(study, where="the study"):
    """Refuse a study whose parts are missing, mistyped or name what does not exist."""
    def bad(message):
        raise ConfigError(f"{where}: {message}")

    if not isinstance(study, dict):
        bad("not a JSON object")
    unknown = set(study) - KEYS - {"name"}
    if unknown:
        bad(f"unknown key(s) {sorted(unknown)}; a study has {sorted(KEYS)}")
    for key in ("description", "reproduces", "arms", "seeds", "metrics"):
        if key not in study:
            bad(f"no {key!r}")
    arms = study["arms"]
    if not isinstance(arms, dict) or not arms:
        bad("'arms' must map arm names to {\"preset\": NAME, \"set\": {...}}")
    for arm, spec in arms.items():
        if not isinstance(spec, dict) or "preset" not in spec:
            bad(f"arm {arm!r} needs a 'preset'")
        for scale in SCALES:
            problem = search_problem(arm_search(spec, scale))
            if problem:
                bad(f"arm {arm!r}'s search at scale {scale}: {problem}")
    for key in ("seeds",):
        seeds = study[key]
        if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
            bad(f"{key!r} must be a non-empty list of integers")
    if not (isinstance(study["metrics"], list) and study["metrics"]):
        bad("'metrics' must be a non-empty list of metrics.json keys")
    measures = study.get("measures", [])
    if not isinstance(measures, list):
        bad(f"'measures' must be a list of {list(MEASURES)}")
    if unknown_measures(measures):
        bad(unknown_measures(measures))
    if study.get("baseline") is not None and study["baseline"] not in arms:
        bad(f"baseline {study['baseline']!r} is not one of the arms {sorted(arms)}")
    for scale in study.get("scales", {}):
        if scale not in SCALES:
            bad(f"scale {scale!r} is not one of {SCALES}")
    for cell in study.get("published", []):
        if cell.get("arm") not in arms:
            bad(f"a published cell names arm {cell.get('arm')!r}, not one of {sorted(arms)}")
    # every arm's configuration at every scale resolves (unknown presets or fields refused)
    from zoo.studies.trials import plan  # deferred: the plan needs zoo.runs
    for scale in SCALES:
        plan(study, scale)
