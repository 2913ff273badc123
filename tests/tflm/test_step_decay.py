"""`--when` (tflm.step_decay.StepDecay, `training.when`): the learning rate divided by 10 after
the listed epochs as salesforce/awd-lstm-lm main.py does it, across a resume, with SGD,
Adam and averaged SGD; and the character-level PTB preset that uses it."""

import json
import math

import keras
import numpy as np
import pytest

from tflm import optimizers
from tflm.step_decay import StepDecay
from tflm.triggers import EpochTrigger
from zoo import train
from zoo.runs.builders import make_lr_schedule, make_optimizer, make_trigger
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings, TrainingSettings
from zoo.errors import ConfigError
from zoo.presets import load_preset
from zoo.presets.reference import (REFERENCE_DEFAULTS, differences, implied_settings,
                                   parse_command)

TINY = ["--set", "corpus.train_tokens=2000", "--set", "corpus.valid_tokens=400",
        "--set", "corpus.test_tokens=400", "--set", "corpus.vocab_size=20",
        "--set", "model.hidden_dim=8", "--set", "model.embed_dim=4",
        "--set", "model.num_layers=1", "--set", "training.bptt=10", "--batch-size", "8",
        "--quiet"]


def reference_rates(lr0, when, epochs, switch_after=None):
    """The learning rate each 1-based epoch trains with in salesforce main.py's loop: in
    the branch of epochs validated without averaging, the switch (a new ASGD at args.lr)
    comes first, then `if epoch in args.when: lr /= 10.`; averaged epochs skip both."""
    lr, averaging, rates = lr0, False, []
    for epoch in range(1, epochs + 1):
        rates.append(lr)
        if not averaging:
            if epoch == switch_after:
                averaging, lr = True, lr0
            if epoch in when:
                lr /= 10.0
    return rates


# (when, the 1-based epoch after which averaging starts): before, at and after a listed one.
CASES = [((3, 5), None), ((1, 2, 3), None), ((2, 4), 3), ((2, 4), 4), ((4,), 2), ((1, 6), 6),
         ((), 3)]


def test_rates_equal_the_reference_loop():
    for when, switch_after in CASES:
        schedule = StepDecay(when, learning_rate=2e-3)
        schedule.averaging_from = switch_after  # = the 0-based index of the first averaged
        expected = reference_rates(2e-3, when, 8, switch_after)
        assert [schedule.rate(k) for k in range(8)] == pytest.approx(expected, rel=1e-12), \
            (when, switch_after)


class _Rates(keras.callbacks.Callback):
    """The learning rate each epoch's first step uses."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.rates.append(float(keras.ops.convert_to_numpy(
                self.model.optimizer.learning_rate)))


def _fit(optimizer, callbacks, epochs=4, initial_epoch=0, model=None):
    x = np.random.RandomState(0).randn(16, 3).astype("float32")
    if model is None:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
    rates = _Rates()
    model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=epochs,
              initial_epoch=initial_epoch, verbose=0, callbacks=[*callbacks, rates])
    return rates.rates, model


def test_fit_divides_after_each_listed_epoch():
    for make in (optimizers.SGD, optimizers.Adam, keras.optimizers.SGD):
        rates, _ = _fit(make(1.0), [StepDecay((1, 3))])
        np.testing.assert_allclose(rates, [1.0, 0.1, 0.1, 0.01], rtol=1e-6, err_msg=str(make))


def test_averaged_sgd_keeps_the_rate_of_its_switch():
    # ET-ASGD from 0-based epoch 2 (after 1-based epoch 2): epoch 3 is listed, but averaged
    # epochs are not divided, and the switch restarts at lr_0 (divided: 2 is listed).
    rates, _ = _fit(optimizers.AveragedSGD(1.0),
                    [EpochTrigger(2, verbose=0), StepDecay((1, 2, 3))], epochs=5)
    np.testing.assert_allclose(rates, [1.0, 0.1, 0.1, 0.1, 0.1], rtol=1e-6)
    rates, _ = _fit(optimizers.AveragedSGD(1.0),
                    [EpochTrigger(2, verbose=0), StepDecay((1,))], epochs=4)
    np.testing.assert_allclose(rates, [1.0, 0.1, 1.0, 1.0], rtol=1e-6)


def test_state_carries_the_schedule_across_fit_calls():
    # One fit per epoch, a fresh callback each time restored from the last one's state, and
    # the optimizer's rate reset in between: what a resumed run does. Averaging from 0-based
    # epoch 3: epoch 4 keeps the switch's rate (lost state would give 1.0 or 0.01).
    first = StepDecay((2, 3), learning_rate=1.0)
    rates, model = _fit(optimizers.AveragedSGD(1.0), [EpochTrigger(3, verbose=0), first],
                        epochs=3)
    state = json.loads(json.dumps(first.get_state()))
    assert state == {"learning_rate": 1.0, "averaging_from": None}
    got = []
    for epoch in (3, 4):
        model.optimizer.learning_rate = 123.0
        again = StepDecay((2, 3))
        again.set_state(state)
        more, _ = _fit(None, [EpochTrigger(3, verbose=0), again], epochs=epoch + 1,
                       initial_epoch=epoch, model=model)
        got += more
        state = again.get_state()
    np.testing.assert_allclose(rates + got, [1.0, 1.0, 0.1, 0.1, 0.1], rtol=1e-6)
    assert state["averaging_from"] == 3


def test_bad_arguments_are_refused_naming_them():
    for when, message in [((0, 300), "epoch numbers >= 1"), ((400, 300), "increasing order"),
                          ((300, 300), "increasing order"), ((1.5,), "whole epoch numbers"),
                          ("300", "list of epoch numbers"), (300, "list of epoch numbers")]:
        with pytest.raises(ValueError, match=message) as err:
            StepDecay(when)
        assert repr(when) in str(err.value)
    with pytest.raises(ValueError, match="divisor must be a finite number > 0.*got 0"):
        StepDecay((1,), divisor=0)
    with pytest.raises(ValueError, match="learning_rate must be .* got -1"):
        StepDecay((1,), learning_rate=-1)
    with pytest.raises(ValueError, match="no initial learning rate"):
        StepDecay((1,)).rate(0)
    with pytest.raises(ValueError, match="set_state needs a dict"):
        StepDecay((1,)).set_state({"averaging_from": 2})


def test_config_check_names_a_bad_when():
    for value in (300, [0, 300], [400, 300], [300, 300], [1.5], ["300"], True, "[300,400]"):
        with pytest.raises(ConfigError, match=r"training\.when must be a list of 1-based ep") \
                as err:
            RunSettings.from_config({"corpus": {}, "model": {}, "training": {"when": value}})
        assert repr(value) in str(err.value) and "training.when=[300,400]" in str(err.value)
        assert len(str(err.value).splitlines()) == 1
    for good in (None, [], [300, 400]):
        RunSettings.from_config({"corpus": {}, "model": {}, "training": {"when": good}})
    assert make_lr_schedule(TrainingSettings.from_dict({"when": []})) is None
    assert make_lr_schedule(TrainingSettings()) is None


def test_zoo_run_divides_logs_and_resumes_with_the_divided_rate(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["--epochs", "2", "--out", str(out), *TINY, "--set", "training.lr=5",
                       "--set", "training.when=[1,2]"]) == 0, capsys.readouterr().err
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["lr_schedule"] == {"learning_rate": 5.0, "averaging_from": None}
    # Resumed after epoch 2: epoch 3 trains with both divisions, though the checkpointed
    # optimizer holds the rate of epoch 2.
    assert train.main(["--resume", str(out), "--epochs", "3", "--quiet"]) == 0, \
        capsys.readouterr().err
    history = json.loads((out / "metrics.json").read_text())["history"]
    np.testing.assert_allclose([h["learning_rate"] for h in history], [5.0, 0.5, 0.05],
                               rtol=1e-6)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tensorflow as tf
    logged = {}
    for f in (out / "logs" / "train").glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(f), size_guidance={"tensors": 0, "scalars": 0})
        acc.Reload()
        tags = acc.Tags()
        if "epoch_learning_rate" in tags.get("scalars", []):
            logged.update({e.step: e.value for e in acc.Scalars("epoch_learning_rate")})
        if "epoch_learning_rate" in tags.get("tensors", []):
            logged.update({e.step: float(tf.make_ndarray(e.tensor_proto))
                           for e in acc.Tensors("epoch_learning_rate")})
    assert logged == pytest.approx({0: 5.0, 1: 0.5, 2: 0.05}, rel=1e-6)


def test_a_bad_when_on_the_command_line_is_one_line(tmp_path, capsys):
    code = train.main(["--out", str(tmp_path / "r"), *TINY, "--set", "training.when=[400,300]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "training.when" in err and "[400, 300]" in err
    assert not (tmp_path / "r").exists()


# --- the character-level PTB preset -----------------------------------------------------------

def test_char_preset_is_the_salesforce_command():
    preset = load_preset("awd_lstm_ptb_char")
    assert differences(preset) == []
    implied = implied_settings(preset)
    assert implied["training.when"] == [300, 400] and implied["training.optimizer"] == "adam"
    assert "training.switch" not in implied  # Adam never switches to ASGD
    assert preset["corpus"]["name"] == "ptb-char"
    assert (preset["training"]["seed"], preset["training"]["clip_norm"]) == (1111, 0.25)
    assert (preset["training"]["eval_batch_size"], preset["training"]["test_batch_size"]) == \
        (10, 1)
    published = preset["published"]
    for split in ("valid", "test"):  # bpc = loss / ln 2 (to the table's rounding)
        assert published[f"{split}_bpc"] == pytest.approx(
            published[f"{split}_loss"] / math.log(2), abs=6e-3)
    assert "364" in published["note"]
    training = RunSettings.from_config(resolve_config("awd_lstm_ptb_char")).training
    assert isinstance(make_optimizer(training), optimizers.Adam)
    assert make_trigger(training) is None
    schedule = make_lr_schedule(training)
    assert schedule.when == (300, 400)
    assert [schedule.rate(k) for k in (299, 300, 399, 400)] == pytest.approx(
        [2e-3, 2e-4, 2e-4, 2e-5])


def test_when_is_read_as_argparse_nargs_plus():
    defaults = REFERENCE_DEFAULTS["salesforce/awd-lstm-lm"]
    assert defaults["when"] == [-1] and defaults["optimizer"] == "sgd"
    flags = parse_command("python main.py --when 25 35 --lr 1e-3 --optimizer adam", defaults)
    assert flags["when"] == [25, 35] and flags["lr"] == 1e-3 and flags["optimizer"] == "adam"
    assert parse_command("python main.py --lr 3 --when 7", defaults)["when"] == [7]
    with pytest.raises(ConfigError, match="--when needs values"):
        parse_command("python main.py --when --lr 3", defaults)
    preset = load_preset("awd_lstm_ptb_char")
    preset["training"]["when"] = [300]
    assert differences(preset) == [("training.when", [300], [300, 400])]
    assert "when" not in REFERENCE_DEFAULTS["zihangdai/mos"]  # salesforce's flag only


def test_char_preset_trains_at_tiny_size(ptb_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFLM_DATA_DIR", str(ptb_dir))
    out = tmp_path / "char"
    assert train.main(["--preset", "awd_lstm_ptb_char", "--epochs", "2", "--out", str(out),
                       "--set", "corpus.max_train_tokens=2000",
                       "--set", "corpus.max_valid_tokens=400",
                       "--set", "corpus.max_test_tokens=200",
                       "--set", "model.hidden_dim=8", "--set", "model.embed_dim=4",
                       "--set", "model.num_layers=1", "--set", "training.bptt=20",
                       "--batch-size", "8",
                       "--set", "training.when=[1]", "--quiet"]) == 0, capsys.readouterr().err
    assert "test bpc" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["corpus"] == "ptb-char" and metrics["vocab_size"] == 50
    np.testing.assert_allclose([h["learning_rate"] for h in metrics["history"]],
                               [2e-3, 2e-4], rtol=1e-6)
