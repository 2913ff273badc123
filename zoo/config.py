"""Resolving a run's configuration: preset, then command-line flags, then `--set` overrides."""

import json
import math

from zoo.errors import ConfigError
from zoo.presets import load_preset

SECTIONS = ("corpus", "model", "training")


def parse_value(text):
    """`--set` values are JSON when they parse as JSON (numbers, true, null, lists, dicts),
    else plain strings."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_override(config, assignment):
    """Apply one `key=value`: `model.dropout=0.3`, `training.lr=20`, or a bare key found in
    exactly one section (`lr=20`). Nested keys use dots (`model.head.num_experts=15`)."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects key=value; got {assignment!r}.")
    key, text = assignment.split("=", 1)
    path = key.strip().split(".")
    if path[0] not in SECTIONS:
        owners = [s for s in SECTIONS if isinstance(config.get(s), dict) and path[0] in config[s]]
        if len(owners) != 1:
            where = "several sections" if owners else "no section"
            raise ConfigError(
                f"--set {key}: the key is in {where} of the preset; prefix it with one of "
                f"{', '.join(SECTIONS)} (e.g. training.{key}).")
        path = [owners[0]] + path
    node = config
    for part in path[:-1]:
        if not isinstance(node.setdefault(part, {}), dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section.")
        node = node[part]
    node[path[-1]] = parse_value(text)
    return config


def resolve_config(preset="synthetic", overrides=(), **flags):
    """Preset dict with flags (None = keep) and `--set` overrides applied, in that order."""
    config = load_preset(preset)
    config["preset"] = preset
    for section in SECTIONS:
        config.setdefault(section, {})
    corpus = flags.pop("corpus", None)
    if corpus is not None and corpus != config["corpus"].get("name"):
        config["corpus"] = {"name": corpus}
    head = flags.pop("head", None)
    if head is not None:
        current = config["model"].get("head") or {}
        current = {"type": current} if isinstance(current, str) else dict(current)
        config["model"]["head"] = current if current.get("type") == head else {"type": head}
    for key, value in flags.items():
        if value is not None:
            config["training"][key] = value
    for assignment in overrides:
        apply_override(config, assignment)
    return config


# The command-line flag that sets a `training` field, named in its error message.
FLAGS = {"batch_size": "--batch-size", "epochs": "--epochs", "seed": "--seed"}


def _integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _epoch_list(value):
    return (isinstance(value, list) and all(_integer(e) and e >= 1 for e in value)
            and all(a < b for a, b in zip(value, value[1:])))


# (fields, test, what the value must be): the numbers a run reads from its configuration.
_TRAINING_RULES = (
    (("batch_size", "eval_batch_size", "test_batch_size", "bptt", "epochs", "nonmono"),
     lambda v: _integer(v) and v >= 1, "a positive integer"),
    (("seed",), _integer, "an integer"),
    (("switch_epoch", "histograms"), lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    (("lr", "weight_decay"), lambda v: _number(v) and v >= 0, "a finite number >= 0"),
    (("clip_norm",), lambda v: v is None or _number(v) and v >= 0,
     "a finite number >= 0 or null (no clipping)"),
    (("max_seq_len", "pad_to_multiple"), lambda v: v is None or _integer(v) and v >= 1,
     "a positive integer or null"),
    (("partial_shuffle", "fixed_windows", "pad_to_compiled_lengths"),
     lambda v: isinstance(v, bool), "true or false"),
    (("xla_evaluation",), lambda v: isinstance(v, bool) or v == "auto",
     '"auto", true or false'),
    (("eval_window",), lambda v: v in ("auto", "bptt") or _integer(v) and v >= 1,
     '"auto" (long windows, same perplexity), "bptt" or a positive integer'),
    (("lr_decay",), lambda v: v is None or _number(v) and 0 < v <= 1,
     "a number in (0, 1] (the factor per epoch after training.decay_after epochs) or null"),
    (("decay_after",), lambda v: _integer(v) and v >= 0,
     "an integer >= 0 (the epochs at the initial learning rate before lr_decay applies)"),
    (("loss_reduction",), lambda v: v in ("token_mean", "sum_over_time"),
     "'token_mean' (NLL averaged over tokens) or 'sum_over_time' (summed over time, "
     "averaged over streams: TensorFlow's PTB tutorial)"),
    (("when",), lambda v: v is None or _epoch_list(v),
     "a list of 1-based epoch numbers in increasing order after which the learning rate is "
     "divided by 10, e.g. --set training.when=[300,400] (salesforce's --when 300 400), or "
     "[] for none"),
)
_EVALUATION_FIELDS = ("bptt", "valid_batch_size", "test_batch_size")
_CORPUS_SIZES = ("train_tokens", "valid_tokens", "test_tokens")
_CORPUS_LIMITS = ("max_train_tokens", "max_valid_tokens", "max_test_tokens")


def _check(section, values, fields, test, what):
    for key in fields:
        if key in values and not test(values[key]):
            flag = f" ({FLAGS[key]})" if section == "training" and key in FLAGS else ""
            raise ConfigError(f"{section}.{key}{flag} must be {what}; got "
                              f"{values[key]!r}.")


def check_config(config):
    """Raise `ConfigError` naming the first value a run could not use, before anything is
    created: batch sizes, bptt, epochs, learning rate and the other numbers of `training`
    (its `finetune_overrides` and `final_evaluation` too), and the token counts of
    `corpus`. What only a builder can judge (optimizer and switch names, model arguments,
    synthetic-language parameters) is checked where it is built."""
    for section in SECTIONS:
        if not isinstance(config.get(section), dict):
            raise ConfigError(f"the configuration's {section!r} part must be a JSON object; "
                              f"got {config.get(section)!r}.")
    training = config["training"]
    for rule in _TRAINING_RULES:
        _check("training", training, *rule)
        _check("training.finetune_overrides", training.get("finetune_overrides") or {},
               *rule)
    _check("training.final_evaluation", training.get("final_evaluation") or {},
           _EVALUATION_FIELDS, lambda v: _integer(v) and v >= 1, "a positive integer")
    _check("corpus", config["corpus"], _CORPUS_SIZES,
           lambda v: _integer(v) and v >= 1, "a positive integer")
    _check("corpus", config["corpus"], _CORPUS_LIMITS,
           lambda v: v is None or _integer(v) and v >= 1, "a positive integer or null")
    return config
