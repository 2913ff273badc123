"""Random-search spaces over preset fields: distributions, constraints, and the built-in
Table A.2 space of Zhang 2018.

A space is a JSON object (a file, or a name in `SPACES`):

    {"description": "...",
     "fields": {"training.clip_norm": {"uniform": [5.0, 10.0]},
                "training.lr": {"log_uniform": [0.1, 10.0]},
                "model.num_layers": {"int": [1, 3]},
                "model.head.type": {"choice": ["softmax", "mos"]},
                        "training.epochs": {"value": 20}},
     "constraints": [{"product": ["training.batch_size", "training.bptt",
                                  "model.hidden_dim"], "at_most": 1.2e6}]}

Each field is a dotted path into a `zoo.train` configuration (as `--set` takes them) and one
distribution: `uniform` [a, b] (a + (b - a) U), `log_uniform` [a, b] (exp of a uniform
draw over [log a, log b], a > 0), `int` [a, b] (every integer a..b equally likely, both
ends included), `choice` [v1, v2, ...] (equally likely), `value` x (fixed) and `same_as`
another field (its sampled value, e.g. an embedding size equal to the hidden size). A constraint
`{"product": [fields], "at_most": c}` (or `at_least`) must hold for every sample: a draw
that breaks one is thrown away and the whole configuration drawn again (rejection
sampling, as one draws uniformly from the constrained region).

Trial i of a search with seed s draws from `numpy.random.default_rng([s, i])`, so its
configuration depends on (space, s, i) only: the same seed gives the same trials whatever
the number of trials, and a resumed search draws what the first one drew.

Reference: Bergstra & Bengio 2012, "Random search for hyper-parameter optimization"; Zhang
2018 §6.3 and Appendix A.2 (seeds/004).
"""

import json
import math
import pathlib

import numpy as np

from zoo.errors import ConfigError

DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice", "value", "same_as")

# Zhang 2018 Table A.2: the ranges of the random search for MoS on the Zaremba LSTM
# (batch x bptt x hidden <= 1.2e6; each trial 20 epochs at lr 1.0, no decay). Mapped onto
# the fields of the Zaremba presets (zoo/presets/zaremba_*.json):
#   initial scale (0, 0.1)        -> model.init_scale, uniform
#   max norm [5, 10]              -> training.clip_norm, uniform
#   layers [1, 3], hidden [500, 1500], batch [10, 30], bptt [20, 50], K [2, 20] -> int
#   keep probability (0.3, 0.5)   -> model.dropout = 1 - keep, uniform on (0.5, 0.7)
#                                    (the same distribution as a uniform keep probability)
#   embedding size = hidden size  (the Zaremba model has no separate embedding size)
#   validation batch = batch      -> same_as (the tutorial validates with the training config)
#   stage 1 & 2 = 20 & 20, decay 1.0, lr 1.0 -> training.epochs 20, training.lr_decay 1.0
#                                    (a constant lr: the preset's, 1.0 in the seed)
# Not searched: "RNN mode basic or block" (TensorFlow 1's two LSTM cells compute the same
# function; Keras has one LSTM); the learning rate is the preset's (1.0 in the seed).
ZHANG2018_MOS = {
    "description": "Zhang 2018 Table A.2: random search for MoS on the Zaremba LSTM "
                   "(batch x bptt x hidden <= 1.2e6, 20 epochs per trial at lr 1.0)",
    "reference": "Zhang 2018 (seeds/004) Appendix A.2, Table A.2; the search's best: init "
                 "0.02, clip 7.2919, 3 layers, hidden 900, batch 28, bptt 40, keep 0.4411, "
                 "K 14 (Table 6.2: valid 78.618 / test 73.565 after 100 epochs with decay "
                 "0.8)",
    "fields": {
        "model.init_scale": {"uniform": [0.0, 0.1]},
        "training.clip_norm": {"uniform": [5.0, 10.0]},
        "model.num_layers": {"int": [1, 3]},
        "model.hidden_dim": {"int": [500, 1500]},
        "training.batch_size": {"int": [10, 30]},
        "training.bptt": {"int": [20, 50]},
        "training.eval_batch_size": {"same_as": "training.batch_size"},
        "model.dropout": {"uniform": [0.5, 0.7]},
        "model.head.num_experts": {"int": [2, 20]},
        "training.epochs": {"value": 20},
        "training.lr_decay": {"value": 1.0},
    },
    "constraints": [{"product": ["training.batch_size", "training.bptt", "model.hidden_dim"],
                     "at_most": 1.2e6}],
}

SPACES = {"zhang2018_mos": ZHANG2018_MOS}

MAX_DRAWS = 10_000  # rejection sampling gives up after this many draws for one trial


def load_space(name_or_path):
    """The space named `name_or_path` (`SPACES`), read from a JSON file, or given as a dict
    (a study's inline space), checked."""
    if isinstance(name_or_path, dict):
        space = json.loads(json.dumps(name_or_path))
        space.setdefault("name", "inline")
        return check_space(space)
    if name_or_path in SPACES:
        space = json.loads(json.dumps(SPACES[name_or_path]))
        space.setdefault("name", name_or_path)
        return check_space(space)
    path = pathlib.Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"--space {name_or_path}: neither a built-in space "
                          f"({', '.join(SPACES)}) nor a JSON file.")
    try:
        space = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"--space {path}: not valid JSON ({err}).") from None
    if isinstance(space, dict):
        space.setdefault("name", path.stem)
    return check_space(space)


def _bad(field, spec, what):
    return ConfigError(f"search space field {field!r}: {json.dumps(spec)} is not a valid "
                       f"distribution; {what}")


def _pair(field, spec, kind, integer=False):
    bounds = spec[kind]
    ok = (isinstance(bounds, list) and len(bounds) == 2
          and all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
                  for b in bounds) and bounds[0] <= bounds[1])
    if not ok or (integer and not all(float(b).is_integer() for b in bounds)):
        raise _bad(field, spec, f"{kind} takes [low, high] with low <= high"
                   + (" (integers)" if integer else "") + f", e.g. {{\"{kind}\": [1, 3]}}.")
    if kind == "log_uniform" and bounds[0] <= 0:
        raise _bad(field, spec, "log_uniform needs low > 0.")


def check_space(space):
    """Raise `ConfigError` naming the first malformed part of `space`; returns it."""
    if not isinstance(space, dict) or not isinstance(space.get("fields"), dict) \
            or not space["fields"]:
        raise ConfigError('a search space is a JSON object with a non-empty "fields" object '
                          '(dotted field -> distribution), e.g. {"fields": {"training.lr": '
                          '{"log_uniform": [0.1, 10]}}}.')
    fields = space["fields"]
    for field, spec in fields.items():
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
            raise _bad(field, spec, f"use exactly one of {', '.join(DISTRIBUTIONS)}.")
        kind = next(iter(spec))
        if kind in ("uniform", "log_uniform", "int"):
            _pair(field, spec, kind, integer=kind == "int")
        elif kind == "choice" and not (isinstance(spec[kind], list) and spec[kind]):
            raise _bad(field, spec, "choice takes a non-empty list of values.")
        elif kind == "same_as":
            target = spec[kind]
            if target not in fields or "same_as" in fields[target]:
                raise _bad(field, spec, "same_as names another field of the space that is "
                           "drawn from a distribution.")
    for constraint in space.get("constraints", []):
        names = constraint.get("product") if isinstance(constraint, dict) else None
        bounds = [k for k in ("at_most", "at_least") if isinstance(constraint, dict)
                  and k in constraint]
        if not (isinstance(names, list) and names and all(n in fields for n in names)
                and bounds):
            raise ConfigError(f"search space constraint {json.dumps(constraint)}: use "
                              '{"product": [fields of the space], "at_most": c} (or '
                              '"at_least").')
    return space


def _draw(spec, rng):
    kind, arg = next(iter(spec.items()))
    if kind == "uniform":
        return float(arg[0] + (arg[1] - arg[0]) * rng.random())
    if kind == "log_uniform":
        return float(math.exp(rng.uniform(math.log(arg[0]), math.log(arg[1]))))
    if kind == "int":
        return int(rng.integers(int(arg[0]), int(arg[1]) + 1))
    if kind == "choice":
        return arg[int(rng.integers(len(arg)))]
    return arg  # value


def satisfies(space, values):
    """Whether `values` ({field: value}) meets every constraint of `space`."""
    for constraint in space.get("constraints", []):
        product = math.prod(float(values[n]) for n in constraint["product"])
        if "at_most" in constraint and product > constraint["at_most"]:
            return False
        if "at_least" in constraint and product < constraint["at_least"]:
            return False
    return True


def sample(space, seed, trial):
    """{field: value} of trial `trial` (0-based) of a search with `seed`: drawn from
    `default_rng([seed, trial])`, redrawn until every constraint holds."""
    rng = np.random.default_rng([int(seed), int(trial)])
    fields = space["fields"]
    for _ in range(MAX_DRAWS):
        values = {f: _draw(s, rng) for f, s in fields.items() if "same_as" not in s}
        for field, spec in fields.items():
            if "same_as" in spec:
                values[field] = values[spec["same_as"]]
        if satisfies(space, values):
            return {f: values[f] for f in fields}
    raise ConfigError(f"search space {space.get('name', '')!r}: no draw out of {MAX_DRAWS} "
                      "met its constraints; widen the ranges or relax the constraints.")


def apply_sample(config, values):
    """Set each dotted field of `values` in `config` (in place); a field whose parent is not
    a section of the configuration is refused, naming it, so a misspelt path fails before
    anything trains."""
    for field, value in values.items():
        path = field.split(".")
        node = config
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                known = ", ".join(sorted(k for k, v in node.items() if isinstance(v, dict)))
                raise ConfigError(f"search space field {field!r}: the configuration has no "
                                  f"section {part!r} there (sections: {known}); fix the "
                                  "field or choose a preset that has it.")
            node = node[part]
        node[path[-1]] = value
    return config
