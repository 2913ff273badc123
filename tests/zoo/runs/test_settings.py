"""Strict settings (`zoo.runs.settings`, `zoo.runs.setting_keys`): every part's keys and
value types are checked before a run creates anything, with the nearest valid key named;
what the bundled presets carry stays accepted."""

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from zoo.errors import ConfigError
from zoo.presets import list_presets
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings, corpus_keys
from zoo.runs.setting_keys import (SYNTHETIC_LANGUAGES, language_arguments, model_arguments,
                                   synthetic_maker)
from zoo.models.registry import MODEL_KINDS, model_class


def _settings(preset="synthetic", *overrides):
    return RunSettings.from_config(resolve_config(preset, list(overrides)))


@pytest.mark.parametrize("name", list_presets())
def test_every_bundled_preset_resolves(name):
    settings = _settings(name)
    assert settings.preset == name and settings.model.kind in MODEL_KINDS


@pytest.mark.parametrize("preset, override, message", [
    ("synthetic", "training.epoch=1", "unknown setting training.epoch; did you mean "
                                      "training.epochs?"),
    ("synthetic", "training.lrr=3", "unknown setting training.lrr; did you mean training.lr?"),
    ("synthetic", "corpus.max_train_token=100", "did you mean corpus.max_train_tokens?"),
    ("awd_lstm_ptb", "corpus.max_train_token=100", "unknown setting corpus.max_train_token "
                                                    "(corpus ptb); did you mean "
                                                    "corpus.max_train_tokens?"),
    ("awd_lstm_ptb", "corpus.temperature=0.3", "unknown setting corpus.temperature (corpus "
                                               "ptb);"),
    ("synthetic", "corpus.temprature=0.3", "did you mean corpus.temperature?"),
    ("synthetic", "model.hiden_dim=5", "unknown setting model.hiden_dim (model.kind awd_lstm); "
                                       "did you mean model.hidden_dim?"),
    ("zaremba_small_ptb", "model.dropout_h=0.2", "(model.kind zaremba); did you mean "
                                                  "model.dropout?"),
    ("synthetic", "training.final_evaluation.bpt=5", "did you mean "
                                                     "training.final_evaluation.bptt?"),
    ("synthetic", "training.finetune_overrides.lrr=5", "did you mean "
                                                       "training.finetune_overrides.lr?"),
    ("synthetic", "model.xyzzy=1", "the model part takes alpha, beta, bptt,"),
])
def test_an_unknown_key_is_refused_with_the_nearest_valid_one(preset, override, message):
    with pytest.raises(ConfigError) as err:
        _settings(preset, override)
    assert message in str(err.value)


def test_an_unknown_top_level_key_is_refused():
    config = resolve_config("synthetic")
    config["descripton"] = "typo"
    with pytest.raises(ConfigError, match="unknown setting descripton; did you mean "
                                          "description?"):
        RunSettings.from_config(config)
    with pytest.raises(ConfigError, match="a JSON object with corpus, model and training"):
        RunSettings.from_config(["corpus"])


@pytest.mark.parametrize("override, message", [
    ("model.hidden_dim=2.5", "model.hidden_dim must be an integer; got 2.5."),
    ("model.hidden_dim=big", "model.hidden_dim must be an integer; got 'big'."),
    ("model.num_layers=true", "model.num_layers must be an integer; got True."),
    ("model.dropout=high", "model.dropout must be a finite number; got 'high'."),
    ("model.tie_weights=1", "model.tie_weights must be true or false; got 1."),
    ("corpus.seed=1.5", "corpus.seed must be an integer; got 1.5."),
    ("corpus.vocab_size=40.0", "corpus.vocab_size must be an integer; got 40.0."),
    ("training.optimizer=sgdd", "unknown optimizer 'sgdd' in training.optimizer; use sgd, "
                                "asgd (averaged SGD) or adam."),
    ("training.switch=sometimes", "unknown training.switch 'sometimes'; use nonmono"),
    ("training.learning_rate_multipliers=3", "training.learning_rate_multipliers must be an "
                                             "object"),
    ("model.kind=gru", "unknown model.kind 'gru'; use one of awd_lstm, mogrifier, zaremba."),
    ("corpus.kind=gauss", "unknown synthetic corpus kind 'gauss' (corpus.kind)"),
    ("training.jit_compile=yes", 'training.jit_compile must be "auto", true or false; '
                                 "got 'yes'."),
])
def test_a_value_of_the_wrong_type_is_refused(override, message):
    with pytest.raises(ConfigError) as err:
        _settings("synthetic", override)
    assert message in str(err.value)


@pytest.mark.parametrize("value, expected", [("true", True), ("false", False),
                                             ("auto", "auto")])
def test_jit_compile_reaches_the_training_settings(value, expected):
    assert _settings("synthetic", f"training.jit_compile={value}").training.jit_compile \
        == expected
    assert _settings("synthetic", "corpus.seed=1").training.jit_compile == "auto"


def test_what_presets_carry_is_accepted():
    settings = _settings("awd_lstm_ptb", "corpus.max_train_tokens=100")
    assert settings.corpus.options["vocab_size"] == 10000  # documents the corpus
    assert settings.corpus.max_train_tokens == 100
    lm1b = RunSettings.from_config({"corpus": {"name": "lm1b", "path": "/x", "vocab_size": 12,
                                               "heldout": None, "verify": False,
                                               "cache": True, "max_valid_tokens": 5},
                                    "model": {}, "training": {}})
    assert dict(lm1b.corpus.options) == {"path": "/x", "vocab_size": 12, "heldout": None,
                                         "verify": False, "cache": True}
    zipf = RunSettings.from_config({"corpus": {"name": "synthetic", "kind": "zipf",
                                               "exponent": 1.1, "vocab_size": 50},
                                    "model": {}, "training": {}})
    assert zipf.corpus.options["exponent"] == 1.1
    # the mixture's parameters are not the zipf language's
    with pytest.raises(ConfigError, match=r"corpus.component_rank \(a synthetic zipf "
                                          r"language\)"):
        RunSettings.from_config({"corpus": {"name": "synthetic", "kind": "zipf",
                                            "component_rank": 3}, "model": {}, "training": {}})


def test_the_keys_read_from_the_sources_are_the_signatures():
    # setting_keys reads the signatures from the source files (no Keras import); they must
    # be what Python itself sees.
    for kind, (module, name) in MODEL_KINDS.items():
        cls = model_class(kind)
        expected = {}
        for c in cls.__mro__:
            if c.__module__.split(".")[0] in ("zoo", "tflm") and "__init__" in vars(c):
                for p in inspect.signature(c.__init__).parameters.values():
                    if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                        expected.setdefault(p.name, p.default)
        kinds = model_arguments(kind)
        assert set(kinds) == set(expected), kind
        for parameter, default in expected.items():
            if isinstance(default, bool):
                assert kinds[parameter] == "boolean", parameter
            elif isinstance(default, int):
                assert kinds[parameter] == "integer", parameter
            elif isinstance(default, float):
                assert kinds[parameter] == "number", parameter
    for kind in SYNTHETIC_LANGUAGES:
        names = set(inspect.signature(synthetic_maker(kind)).parameters)
        assert set(language_arguments(kind)) == names, kind


def test_the_lm1b_names_and_options_are_the_loaders():
    from tflm.data import lm1b
    for name in lm1b.NAMES:
        keys, _, _ = corpus_keys(name)
        assert {"path", "vocab_size", "heldout", "verify", "cache"} <= keys
    assert "path" not in corpus_keys("ptb")[0]


def test_checking_a_configuration_imports_no_framework():
    # A PyTorch-only worker of tools/compare_frameworks.py reads its settings too.
    code = textwrap.dedent("""
        import sys
        from zoo.runs.config import resolve_config
        from zoo.runs.settings import RunSettings
        RunSettings.from_config(resolve_config("zaremba_small_ptb"))
        RunSettings.from_config(resolve_config("synthetic"))
        print(sorted(m for m in ("keras", "tensorflow", "torch", "jax") if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().replace("'", '"')) == []


def test_split_limits_apply_to_a_synthetic_corpus_too():
    from zoo.runs.corpora import load_data
    corpus, optimal = load_data({"name": "synthetic", "vocab_size": 20, "train_tokens": 500,
                                 "valid_tokens": 300, "test_tokens": 300,
                                 "max_train_tokens": 120})
    assert len(corpus.train) == 120 and len(corpus.valid) == 300 and optimal > 1


def test_the_run_words_per_second_weighs_every_epoch_by_its_time():
    from zoo.runs.training import run_words_per_second
    history = [{"words_per_second": 1000.0, "train_seconds": 6.0},   # 6,000 tokens (traced)
               {"words_per_second": 3000.0, "train_seconds": 2.0},   # 6,000 tokens
               {"epoch": 3}]                                         # no timing: skipped
    assert run_words_per_second(history) == pytest.approx(12000 / 8)
    assert run_words_per_second([]) is None
