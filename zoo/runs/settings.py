"""A run's configuration checked once into typed settings, with every default in one place.

`zoo.runs.config` resolves a preset, the command line's flags and `--set` overrides into one
configuration dict (what `config.json` holds). `RunSettings.from_config(config)` checks it
once, before anything is created, and the rest of a run reads these frozen objects:

    RunSettings       preset, corpus, model, training (+ base, finetune) and the dict itself
    CorpusSettings    the corpus part: name, split sizes / limits, the language's or lm1b's options
    ModelSettings     the model part: `kind` (zoo.models.registry) and the model's arguments
    TrainingSettings  the training part: batch sizes, bptt, epochs, optimizer, schedule, ...
    FinalEvaluation   training.final_evaluation: the final passes' bptt and batch sizes

A value a run could not use is a `ConfigError` naming the field and what it must be. Every
part's keys are checked too (`zoo.runs.setting_keys`): a key no part knows is refused with
the nearest valid one ("unknown setting training.epoch; did you mean training.epochs?"),
and the model's and a synthetic language's arguments must have the types their defaults
have (an integer argument takes no 2.5). Their ranges, which only a builder can judge, are
checked where the model or the language is built.
"""

import copy
import dataclasses
import types

from zoo.errors import ConfigError
from zoo.models.kinds import DEFAULT_KIND, MODEL_OWNED_TRAINING
from zoo.runs.setting_keys import (TOP_LEVEL, check_arguments, is_integer, is_number,
                                   language_arguments, model_arguments, refuse_unknown)

SECTIONS = ("corpus", "model", "training")

# The command-line flag that sets a `training` field, named in its error message.
FLAGS = {"batch_size": "--batch-size", "epochs": "--epochs", "seed": "--seed"}


def _epoch_list(value):
    return (isinstance(value, list) and all(is_integer(e) and e >= 1 for e in value)
            and all(a < b for a, b in zip(value, value[1:])))


# (fields, test, what the value must be): the numbers a run reads from its configuration.
_TRAINING_RULES = (
    (("batch_size", "eval_batch_size", "test_batch_size", "bptt", "epochs", "nonmono",
      "steps_per_execution"),
     lambda v: is_integer(v) and v >= 1, "a positive integer"),
    (("seed",), is_integer, "an integer"),
    (("switch_epoch", "histograms"), lambda v: is_integer(v) and v >= 0, "an integer >= 0"),
    (("lr", "weight_decay"), lambda v: is_number(v) and v >= 0, "a finite number >= 0"),
    (("clip_norm",), lambda v: v is None or is_number(v) and v >= 0,
     "a finite number >= 0 or null (no clipping)"),
    (("max_seq_len", "pad_to_multiple"), lambda v: v is None or is_integer(v) and v >= 1,
     "a positive integer or null"),
    (("partial_shuffle", "fixed_windows", "pad_to_compiled_lengths"),
     lambda v: isinstance(v, bool), "true or false"),
    (("xla_evaluation", "jit_compile"), lambda v: isinstance(v, bool) or v == "auto",
     '"auto", true or false'),
    (("eval_window",), lambda v: v in ("auto", "bptt") or is_integer(v) and v >= 1,
     '"auto" (long windows, same perplexity), "bptt" or a positive integer'),
    (("lr_decay",), lambda v: v is None or is_number(v) and 0 < v <= 1,
     "a number in (0, 1] (the factor per epoch after training.decay_after epochs) or null"),
    (("decay_after",), lambda v: is_integer(v) and v >= 0,
     "an integer >= 0 (the epochs at the initial learning rate before lr_decay applies)"),
    (("loss_reduction",), lambda v: v in ("token_mean", "sum_over_time"),
     "'token_mean' (NLL averaged over tokens) or 'sum_over_time' (summed over time, "
     "averaged over streams: TensorFlow's PTB tutorial)"),
    (("adam_beta_1",), lambda v: is_number(v) and 0 <= v < 1,
     "a number in [0, 1) (Adam's beta_1; 0 is deepmind/lamb's 'rmsprop')"),
    (("flooding_level",), lambda v: v is None or is_number(v),
     "a finite number (the flood level b) or null"),
    (("learning_rate_multipliers",),
     lambda v: v is None or isinstance(v, dict) and all(
         isinstance(k, str) and is_number(m) for k, m in v.items()),
     'an object {variable path or substring: factor}, e.g. {"embedding": 0.5}, or null'),
    (("when",), lambda v: v is None or _epoch_list(v),
     "a list of 1-based epoch numbers in increasing order after which the learning rate is "
     "divided by 10, e.g. --set training.when=[300,400] (salesforce's --when 300 400), or "
     "[] for none"),
)
_EVALUATION_FIELDS = ("bptt", "valid_batch_size", "test_batch_size")
EVALUATED_MODELS = ("best", "final")
_CORPUS_SIZES = ("train_tokens", "valid_tokens", "test_tokens")
_CORPUS_LIMITS = ("max_train_tokens", "max_valid_tokens", "max_test_tokens")
# tflm.data.lm1b.NAMES and the options zoo.runs.corpora reads (not imported: tflm.data
# starts TensorFlow); tests/zoo/runs/test_settings.py checks that they agree.
_LM1B_NAMES = ("lm1b", "1b", "1b-word", "one-billion-word", "billion-word")
_LM1B_OPTIONS = ("path", "vocab_size", "heldout", "verify", "cache")
# tflm.data.text8.NAMES and the options zoo.runs.corpora reads for it (checked alike, in
# tests/tflm/data/test_text8.py).
_TEXT8_NAMES = ("text8",)
_TEXT8_OPTIONS = ("path", "split_sizes", "verify")


def _check(section, values, fields, test, what):
    for key in fields:
        if key in values and not test(values[key]):
            flag = f" ({FLAGS[key]})" if section == "training" and key in FLAGS else ""
            raise ConfigError(f"{section}.{key}{flag} must be {what}; got "
                              f"{values[key]!r}.")


def check_training_part(values, section="training"):
    """Raise `ConfigError` naming the first key of a `training` part (or of its
    `finetune_overrides`) that no setting has, or the first value a run could not use."""
    refuse_unknown(section, values, TRAINING_KEYS)
    for rule in _TRAINING_RULES:
        _check(section, values, *rule)
    optimizer = values.get("optimizer", "sgd")
    if not (isinstance(optimizer, str) and optimizer.lower() in ("sgd", "asgd", "adam")):
        raise ConfigError(f"unknown optimizer {optimizer!r} in {section}.optimizer; use sgd, "
                          "asgd (averaged SGD) or adam.")
    if values.get("precision", "float32") not in PRECISIONS:
        raise ConfigError(f"unknown {section}.precision {values['precision']!r}; use "
                          f"{', '.join(PRECISIONS)} (a Keras dtype policy).")
    if values.get("switch", "nonmono") not in ("nonmono", "epoch", "none", None):
        raise ConfigError(f"unknown {section}.switch {values['switch']!r}; use nonmono "
                          "(NT-ASGD), epoch (ET-ASGD at switch_epoch) or none.")


@dataclasses.dataclass(frozen=True)
class FinalEvaluation:
    """`training.final_evaluation`: the final validation and test passes' protocol where
    it differs from training's (None: the training part's bptt, eval_batch_size,
    test_batch_size), and which model they evaluate: "best" (default: best.keras, the
    epoch of the best validation perplexity, as the references test) or "final"
    (final.keras, the model training ended with: Parthiban 2020's flooding-to-overfit
    tables, Tables 5.8-5.10, report the overfitted model)."""
    bptt: int = None
    valid_batch_size: int = None
    test_batch_size: int = None
    model: str = "best"

    @classmethod
    def from_dict(cls, values):
        values = values or {}
        if not isinstance(values, dict):
            raise ConfigError("training.final_evaluation must be an object with bptt, "
                              f"valid_batch_size, test_batch_size, model; got {values!r}.")
        refuse_unknown("training.final_evaluation", values, _EVALUATION_FIELDS + ("model",))
        _check("training.final_evaluation", values, _EVALUATION_FIELDS,
               lambda v: is_integer(v) and v >= 1, "a positive integer")
        if values.get("model", "best") not in EVALUATED_MODELS:
            raise ConfigError(f"training.final_evaluation.model must be one of "
                              f"{', '.join(map(repr, EVALUATED_MODELS))}; got "
                              f"{values['model']!r}.")
        return cls(**{k: values[k] for k in _EVALUATION_FIELDS + ("model",) if k in values})


# Fields of the `training` part that the model itself owns (`tflm.LanguageModel`
# arguments): given to the model only when the configuration sets them, so that a model
# family keeps its own defaults (zoo.AWDLSTM's clip_norm 0.25, zoo.ZarembaLSTM's 5).


# Keras dtype policies a run may train under: float32, or mixed (variables, carried state,
# softmax and perplexity in float32; the layers' arithmetic in bfloat16 / float16)
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """The `training` part of a configuration, checked, with its defaults.

    Streams and windows: batch_size (training streams), eval_batch_size (validation),
    test_batch_size (the final test pass), bptt, max_seq_len (cap on a random window's
    length), fixed_windows (every training window bptt long: TensorFlow's PTB tutorial),
    partial_shuffle (Press 2019), pad_to_multiple (None: 4 on JAX, else 1),
    pad_to_compiled_lengths (JAX), eval_window ("auto", "bptt" or a length),
    xla_evaluation ("auto", true, false), steps_per_execution (Keras' `compile` argument:
    the windows a dispatch runs; on JAX in one program, `tflm.backends.scanned_steps`),
    jit_compile (Keras' `compile` argument, "auto", true, false: on PyTorch true compiles
    the train step's forward pass and loss, `tflm.backends.torch_compiled_step`; on
    TensorFlow true is XLA; on JAX false runs eagerly).
    Optimisation: optimizer ("sgd", "asgd", "adam"; adam_beta_1, default 0.9), lr,
    learning_rate_multipliers,
    clip_norm, weight_decay, loss_reduction, flooding_level; averaging switch ("nonmono",
    "epoch", None) with nonmono / switch_epoch; schedule: when (lr / 10 after the listed
    epochs) or lr_decay after decay_after epochs.
    Precision: "float32", "mixed_bfloat16" or "mixed_float16" (the Keras dtype policy the
    model is built under; mixed_float16 also scales the loss: LossScaleOptimizer).
    Run: epochs, seed, histograms (TensorBoard histogram frequency), final_evaluation,
    finetune_overrides (what `--finetune` changes). `given`: the fields the configuration
    set (the model-owned ones reach the model only then: `model_arguments`).
    """
    batch_size: int = 20
    eval_batch_size: int = 10
    test_batch_size: int = 1
    bptt: int = 70
    max_seq_len: int = None
    fixed_windows: bool = False
    partial_shuffle: bool = False
    pad_to_multiple: int = None
    pad_to_compiled_lengths: bool = True
    eval_window: object = "auto"
    xla_evaluation: object = "auto"
    steps_per_execution: int = 1
    jit_compile: object = "auto"
    optimizer: str = "sgd"
    adam_beta_1: float = 0.9
    lr: float = 30.0
    learning_rate_multipliers: object = None
    clip_norm: float = 0.25
    weight_decay: float = 0.0
    loss_reduction: str = "token_mean"
    flooding_level: float = None
    switch: str = "nonmono"
    nonmono: int = 5
    switch_epoch: int = 200
    when: tuple = ()
    lr_decay: float = None
    decay_after: int = 0
    epochs: int = 1
    seed: int = 0
    histograms: int = 0
    precision: str = "float32"
    final_evaluation: FinalEvaluation = FinalEvaluation()
    finetune_overrides: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))
    given: frozenset = frozenset()

    @classmethod
    def from_dict(cls, values, section="training"):
        """The settings of a `training` part (a dict), checked (`ConfigError`)."""
        values = dict(values or {})
        check_training_part(values, section)
        overrides = values.get("finetune_overrides") or {}
        if not isinstance(overrides, dict):
            raise ConfigError(f"{section}.finetune_overrides must be an object of training "
                              f"settings; got {overrides!r}.")
        check_training_part(overrides, f"{section}.finetune_overrides")
        known = {f.name for f in dataclasses.fields(cls)} - {"given"}
        kwargs = {k: v for k, v in values.items() if k in known}
        kwargs["final_evaluation"] = FinalEvaluation.from_dict(values.get("final_evaluation"))
        kwargs["finetune_overrides"] = types.MappingProxyType(dict(overrides))
        kwargs["when"] = tuple(values.get("when") or ())
        kwargs["optimizer"] = str(values.get("optimizer", cls.optimizer)).lower()
        return cls(given=frozenset(values), **kwargs)

    def model_arguments(self):
        """The model-owned fields the configuration set (`MODEL_OWNED_TRAINING`)."""
        return {k: getattr(self, k) for k in MODEL_OWNED_TRAINING if k in self.given}

    @property
    def averaged(self):
        """Whether the optimizer is averaged SGD (NT-ASGD / ET-ASGD)."""
        return self.optimizer == "asgd"

    @property
    def final_bptt(self):
        return self.final_evaluation.bptt or self.bptt

    @property
    def final_valid_batch_size(self):
        return self.final_evaluation.valid_batch_size or self.eval_batch_size

    @property
    def final_test_batch_size(self):
        return self.final_evaluation.test_batch_size or self.test_batch_size


# The keys a `training` part may hold: TrainingSettings' fields.
TRAINING_KEYS = frozenset(f.name for f in dataclasses.fields(TrainingSettings)) - {"given"}


@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    """The `corpus` part: `name` ("synthetic", "ptb", "wikitext-2", "lm1b" or a
    directory); for a synthetic language its `kind` ("markov", "mixture", "zipf"), split
    sizes (`train_tokens`, ...) and the language's parameters (`options`); for lm1b its
    options (path, vocab_size, heldout, verify, cache); for another corpus its
    `vocab_size` (informative: the files decide it); `max_*_tokens` keep only the first
    tokens of a split, of any corpus (shortened runs on small machines)."""
    name: str = "synthetic"
    kind: str = "markov"
    train_tokens: int = None
    valid_tokens: int = None
    test_tokens: int = None
    max_train_tokens: int = None
    max_valid_tokens: int = None
    max_test_tokens: int = None
    options: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))

    @classmethod
    def from_dict(cls, values):
        """The settings of a `corpus` part (a dict), checked (`ConfigError`): its keys are
        those its corpus takes (`corpus_keys`), its sizes positive integers."""
        values = dict(values or {})
        name = values.get("name", cls.name)
        if not isinstance(name, str):
            raise ConfigError(f"corpus.name must be a corpus name or folder; got {name!r}.")
        known, where, kinds = corpus_keys(name, values.get("kind", cls.kind))
        refuse_unknown("corpus", values, known, where)
        check_arguments("corpus", values, kinds)
        _check("corpus", values, _CORPUS_SIZES, lambda v: is_integer(v) and v >= 1,
               "a positive integer")
        _check("corpus", values, _CORPUS_LIMITS,
               lambda v: v is None or is_integer(v) and v >= 1, "a positive integer or null")
        named = ("name", "kind") + _CORPUS_SIZES + _CORPUS_LIMITS
        kwargs = {k: values[k] for k in named if k in values}
        options = {k: v for k, v in values.items() if k not in named}
        return cls(options=types.MappingProxyType(options), **kwargs)

    @property
    def synthetic(self):
        return self.name == "synthetic"

    def split_sizes(self):
        """The synthetic splits' sizes the part sets (`to_corpus` keyword arguments)."""
        return {k: getattr(self, k) for k in _CORPUS_SIZES if getattr(self, k) is not None}

    def split_limit(self, split):
        """`max_<split>_tokens`, or None."""
        return getattr(self, f"max_{split}_tokens")


def corpus_keys(name, kind="markov"):
    """(keys, where, argument kinds) of a `corpus` part naming corpus `name`: a synthetic
    language takes its kind's parameters (`zoo.runs.setting_keys.language_arguments`) and
    its split sizes; lm1b its options; any other corpus (ptb, wikitext-2, a folder) its
    `vocab_size` (what the preset documents; the files decide it); every corpus the split
    limits, and the split sizes, which only a synthetic language reads (a flag set made for
    the synthetic preset stays usable with `--corpus DIR`)."""
    if name == "synthetic":
        kinds = language_arguments(kind)
        return ({"name", "kind", *_CORPUS_SIZES, *_CORPUS_LIMITS, *kinds},
                f" (a synthetic {kind} language)", kinds)
    common = {"name", *_CORPUS_SIZES, *_CORPUS_LIMITS}
    if name in _LM1B_NAMES:
        return ({*common, *_LM1B_OPTIONS}, f" (corpus {name})",
                {"vocab_size": "integer", "verify": "boolean", "cache": "boolean"})
    if name in _TEXT8_NAMES:
        return ({*common, "vocab_size", *_TEXT8_OPTIONS}, f" (corpus {name})",
                {"vocab_size": "integer", "verify": "boolean"})
    return {*common, "vocab_size"}, f" (corpus {name})", {"vocab_size": "integer"}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The `model` part: `kind`, the family (`zoo.models.registry.MODEL_KINDS`), and the
    family class's keyword arguments: their names and types checked here
    (`zoo.runs.setting_keys.model_arguments`), their ranges by the class when it is built."""
    kind: str = DEFAULT_KIND
    arguments: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))

    @classmethod
    def from_dict(cls, values):
        """The settings of a `model` part (a dict): its keys must be arguments of the
        family's class, of the types their defaults have (`ConfigError` otherwise)."""
        values = dict(values or {})
        kind = values.pop("kind", DEFAULT_KIND)
        kinds = model_arguments(kind)  # an unknown kind is refused here
        refuse_unknown("model", values, kinds, f" (model.kind {kind})")
        check_arguments("model", values, kinds)
        values.pop("vocab_size", None)  # the corpus' vocabulary decides it
        return cls(kind=kind, arguments=types.MappingProxyType(values))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A run's whole configuration, checked: its parts as settings, and `config`, the dict
    they were read from (written to `config.json`, fingerprinted in checkpoints)."""
    corpus: CorpusSettings
    model: ModelSettings
    training: TrainingSettings
    config: dict
    preset: str = None
    base: types.MappingProxyType = None
    finetune: types.MappingProxyType = None

    @classmethod
    def from_config(cls, config):
        """Check `config` (a resolved configuration dict) and read it into settings.
        Raises `ConfigError` naming the first value a run could not use, before anything
        is created."""
        if not isinstance(config, dict):
            raise ConfigError(f"a configuration is a JSON object with corpus, model and "
                              f"training parts; got {type(config).__name__}.")
        refuse_unknown("", config, SECTIONS + TOP_LEVEL)
        for section in SECTIONS:
            if not isinstance(config.get(section), dict):
                raise ConfigError(f"the configuration's {section!r} part must be a JSON "
                                  f"object; got {config.get(section)!r}.")
        return cls(corpus=CorpusSettings.from_dict(config["corpus"]),
                   model=ModelSettings.from_dict(config["model"]),
                   training=TrainingSettings.from_dict(config["training"]),
                   config=copy.deepcopy(config), preset=config.get("preset"),
                   base=config.get("base"), finetune=config.get("finetune"))

    @property
    def finetuning(self):
        """Whether this run finetunes another (`--finetune`)."""
        return bool(self.finetune)
