"""A study's trials: every arm at every point of its grid with every seed, each a
`zoo.train` configuration with a folder name that says which.

    trial = arm x point x seed
    config = the arm's preset, then (a searched arm) its search's chosen draw, then the
             arm's `set`, then the scale's `set` (smoke's tiny sizes win over an arm's
             own), then the arm's own `set` at that scale (`arms.ARM.scales.smoke.set`: a
             MoS arm's experts), then the point's fields, then `training.seed = seed`

The folder is `trials/<arm>[__<field>=<value>...]__seed<seed>` (fields by their last name),
stable across runs of the study, so that a study run again finds its trials where it left
them (`zoo.runs.run_state`).
"""

import dataclasses
import itertools
import json

from zoo.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run of a study: its arm, grid point ({dotted field: value}), seed, folder name
    and `zoo.train` configuration."""

    arm: str
    point: tuple  # ((dotted field, value), ...) in the grid's order
    seed: int
    name: str
    config: dict = dataclasses.field(compare=False, hash=False)

    @property
    def point_dict(self):
        return dict(self.point)


SEARCH_KEYS = {"space", "trials", "seed", "algorithm", "set", "published"}
ALGORITHMS = ("random", "tpe")


def arm_search(spec, scale):
    """The arm's search at `scale` (its `search`, then `scales.SCALE.search`'s changes), or
    None for an arm that is not searched."""
    if "search" not in spec:
        return None
    found = spec["search"]
    if isinstance(found, dict):
        found = dict(found)
        if scale != "paper":
            found.update(spec.get("scales", {}).get(scale, {}).get("search", {}))
    return found


def search_problem(arm_spec):
    """What is wrong with an arm's search (`arm_search`), or "" (also for None)."""
    if arm_spec is None:
        return ""
    if not isinstance(arm_spec, dict):
        return "'search' must be an object with 'space' and 'trials'"
    unknown = set(arm_spec) - SEARCH_KEYS
    if unknown:
        return f"unknown key(s) {sorted(unknown)}; a search has {sorted(SEARCH_KEYS)}"
    if "space" not in arm_spec:
        return "no 'space' (a built-in space's name, or the space itself)"
    trials = arm_spec.get("trials")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        return f"'trials' must be an integer >= 1, not {trials!r}"
    if not isinstance(arm_spec.get("seed", 0), int):
        return f"'seed' must be an integer, not {arm_spec['seed']!r}"
    if arm_spec.get("algorithm", "random") not in ALGORITHMS:
        return f"'algorithm' must be one of {ALGORITHMS}, not {arm_spec['algorithm']!r}"
    return ""


def scale_settings(study, scale):
    """(seeds, {dotted field: value}, grid) of `study` at `scale`."""
    override = study.get("scales", {}).get(scale, {}) if scale != "paper" else {}
    seeds = override.get("seeds", study["seeds"])
    return list(seeds), dict(override.get("set", {})), dict(override.get("grid",
                                                                      study.get("grid", {})))


def _value_text(value):
    return json.dumps(value, separators=(",", ":")).strip('"')


def trial_name(arm, point, seed):
    fields = "".join(f"__{key.split('.')[-1]}={_value_text(value)}" for key, value in point)
    return f"{arm}{fields}__seed{seed}"


def assignments(fields):
    """`--set` assignments ("field=JSON value") of {dotted field: value}."""
    return [f"{key}={json.dumps(value)}" for key, value in fields.items()]


def stand_in_draw(search):
    """A searched arm's draw before its search has run: the search's first random draw,
    so that the fields of the space are checked against the preset."""
    # deferred: the plan needs zoo.runs
    from zoo.runs.search_space import load_space, sample
    return sample(load_space(search["space"]), search.get("seed", 0), 0)


def plan(study, scale="paper", seeds=None, draws=None):
    """The study's trials at `scale` (`seeds`: the first N of the scale's seeds, or all),
    each configuration resolved and checked before any trial trains. `draws` ({searched
    arm: {field: value}}) are the searches' chosen draws; an arm not in it is planned with
    its `stand_in_draw`."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.config import resolve_config
    from zoo.runs.settings import RunSettings

    all_seeds, scale_set, grid = scale_settings(study, scale)
    if seeds is not None:
        if not 1 <= seeds <= len(all_seeds):
            raise ConfigError(f"--seeds {seeds}: the study has {len(all_seeds)} seed(s) at "
                              f"scale {scale} ({all_seeds}); give 1 to {len(all_seeds)}.")
        all_seeds = all_seeds[:seeds]
    keys = list(grid)
    points = [tuple(zip(keys, values)) for values in itertools.product(*grid.values())]
    trials = []
    for arm, spec in study["arms"].items():
        search = arm_search(spec, scale)
        draw = {} if search is None else (draws or {}).get(arm) or stand_in_draw(search)
        arm_scale = spec.get("scales", {}).get(scale, {}).get("set", {})
        arm_overrides = (assignments(draw) + assignments(spec.get("set", {}))
                         + assignments(scale_set) + assignments(arm_scale))
        for point in points:
            for seed in all_seeds:
                overrides = (arm_overrides + assignments(dict(point))
                             + [f"training.seed={seed}"])
                try:
                    config = resolve_config(spec["preset"], overrides)
                    RunSettings.from_config(config)
                except ConfigError as err:
                    raise ConfigError(f"study {study.get('name', '')} arm {arm!r} "
                                      f"({spec['preset']}) at scale {scale}: {err}") from err
                trials.append(Trial(arm, point, seed, trial_name(arm, point, seed), config))
    names = [t.name for t in trials]
    if len(set(names)) != len(names):
        raise ConfigError("two trials of the study share a folder name; make the grid's "
                          "fields differ in their last names")
    return trials
