"""NT-ASGD / ET-ASGD triggers, averaged validation, best-model checkpoints, finetune stop."""

import json
import types

import numpy as np
import pytest
import keras

from tests.backends import run_in_backend
from tflm import data
from tflm.optimizers import AveragedSGD, averaged_weights
from tflm.triggers import (AveragedValidation, BestModelCheckpoint, EpochTrigger,
                           NonMonotonicTrigger)
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

SEQUENCE = [5, 4, 3, 3.5, 3.6, 3.7, 3.8, 3.9, 3.95]


def reference_switch_epoch(val_losses, nonmono):
    """salesforce/awd-lstm-lm main.py, transcribed: the 0-based epoch of the switch."""
    best_val_loss, switched = [], None
    for epoch, val_loss in enumerate(val_losses):
        if switched is None and (len(best_val_loss) > nonmono
                                 and val_loss > min(best_val_loss[:-nonmono])):
            switched = epoch
        if switched is None or switched == epoch:
            best_val_loss.append(val_loss)
    return switched


def _fake_model(averaging=False):
    opt = AveragedSGD(1.0, start_averaging=0 if averaging else None)
    return types.SimpleNamespace(optimizer=opt, stop_training=False)


def _feed(trigger, values, first_epoch=0):
    flags = []
    for epoch, value in enumerate(values, start=first_epoch):
        logs = {"val_loss": value}
        trigger.on_epoch_end(epoch, logs)
        flags.append(logs["averaging"])
    return flags


def test_nt_trigger_fires_where_the_reference_rule_says():
    # by hand, n = 5: the check at epoch t uses the values of epochs < t; at t = 8
    # min(history[:-5]) = min(5, 4, 3) = 3 < 3.95. (Appending before checking would fire at 7.)
    assert reference_switch_epoch(SEQUENCE, 5) == 8
    trigger = NonMonotonicTrigger(patience=5, verbose=0)
    trigger.set_model(_fake_model())
    flags = _feed(trigger, SEQUENCE + [3.0, 2.0])
    assert trigger.switched and trigger.switch_epoch == 8
    assert trigger.model.optimizer.is_averaging
    assert flags == [0.0] * 9 + [1.0, 1.0]
    assert trigger.history == SEQUENCE, "the switch epoch's value is appended, later ones not"
    rng = np.random.default_rng(0)
    for _ in range(20):
        values = list(np.round(rng.uniform(1, 2, size=30), 3))
        n = int(rng.integers(1, 6))
        trigger = NonMonotonicTrigger(patience=n, verbose=0)
        trigger.set_model(_fake_model())
        _feed(trigger, values)
        assert trigger.switch_epoch == reference_switch_epoch(values, n)


def test_nt_stop_mode_is_the_finetune_rule_and_checks_while_averaging():
    trigger = NonMonotonicTrigger(patience=5, on_trigger="stop", verbose=0)
    model = _fake_model(averaging=True)
    trigger.set_model(model)
    _feed(trigger, SEQUENCE[:8])
    assert not model.stop_training
    _feed(trigger, SEQUENCE[8:], first_epoch=8)
    assert model.stop_training and trigger.stopped and trigger.stop_epoch == 8
    assert trigger.history == SEQUENCE and not trigger.switched


def test_trigger_state_survives_json_and_resumes_identically():
    first = NonMonotonicTrigger(patience=5, verbose=0)
    first.set_model(_fake_model())
    _feed(first, SEQUENCE[:6])
    state = json.loads(json.dumps(first.get_state()))
    resumed = NonMonotonicTrigger(patience=5, verbose=0)
    resumed.set_model(_fake_model())
    resumed.set_state(state)
    _feed(resumed, SEQUENCE[6:], first_epoch=6)
    assert resumed.switch_epoch == 8 and resumed.history == SEQUENCE
    et = EpochTrigger(3)
    et.set_state(json.loads(json.dumps({"switched": True, "switch_epoch": 3})))
    assert et.get_state() == {"switched": True, "switch_epoch": 3}
    with pytest.raises(ValueError, match="history"):
        resumed.set_state({"switched": True})


def test_bad_arguments_and_missing_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="0"):
        NonMonotonicTrigger(patience=0)
    with pytest.raises(ValueError, match="'later'"):
        NonMonotonicTrigger(on_trigger="later")
    with pytest.raises(ValueError, match="-1"):
        EpochTrigger(epoch=-1)
    with pytest.raises(ValueError, match="best.h5"):
        BestModelCheckpoint("best.h5")
    trigger = NonMonotonicTrigger(verbose=0)
    trigger.set_model(types.SimpleNamespace(optimizer=keras.optimizers.SGD(1.0)))
    with pytest.raises(TypeError, match="AveragedSGD.*SGD"):
        trigger.on_train_begin()
    trigger.set_model(_fake_model())
    with pytest.raises(KeyError, match="val_loss.*validation_data"):
        trigger.on_epoch_end(0, {"loss": 1.0})


def _tiny_lm():
    return AWDLSTM(20, embed_dim=8, hidden_dim=8, num_layers=2, bptt=8, seed=3)


def _streams(kind, length):
    if kind == "train":  # 0 1 2 ... 9 0 1 ...: easy to learn, only tokens 0..9
        return (np.arange(length) % 10).astype("int32")
    return np.random.default_rng(1).integers(10, 20, length).astype("int32")  # unseen tokens


def test_fit_with_nt_trigger_switches_validates_and_saves_averages(tmp_path):
    model = _tiny_lm()
    model.compile(optimizer=AveragedSGD(20.0))
    train = data.lm_dataset(_streams("train", 4 * 33), 4, 8, train=False)  # 4 steps/epoch
    valid = data.lm_dataset(_streams("valid", 2 * 17), 2, 8, train=False)
    trigger = NonMonotonicTrigger(patience=1, verbose=0)
    # monitoring the averaging flag: the last save is the first epoch validated on averages
    best = BestModelCheckpoint(str(tmp_path / "best.keras"), monitor="averaging", mode="max")
    hist = model.fit(train, validation_data=valid, epochs=5, verbose=0,
                     callbacks=[trigger, best]).history
    opt = model.optimizer
    switch = reference_switch_epoch(hist["val_loss"], 1)
    assert switch is not None and switch < 4, hist["val_loss"]
    assert trigger.switch_epoch == switch
    assert hist["averaging"] == [0.0] * (switch + 1) + [1.0] * (4 - switch)
    assert opt.start_iteration == 4 * (switch + 1) and opt.average_count == 4 * (4 - switch)
    # the last validation saw the averaged weights, not the raw ones
    with averaged_weights(model) as averaged:
        assert averaged
        on_average = model.evaluate(valid, verbose=0, return_dict=True)["loss"]
    on_raw = model.evaluate(valid, verbose=0, return_dict=True)["loss"]
    assert on_average == pytest.approx(hist["val_loss"][-1], rel=1e-5)
    assert abs(on_raw - on_average) > 1e-3
    # .keras round trip keeps the raw weights, the averages and the counters
    model.save(tmp_path / "last.keras")
    loaded = keras.saving.load_model(tmp_path / "last.keras")
    for a, b in zip(opt.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert type(loaded.optimizer) is AveragedSGD and loaded.optimizer.has_average
    with averaged_weights(loaded):
        assert loaded.evaluate(valid, verbose=0, return_dict=True)["loss"] == \
            pytest.approx(on_average, rel=1e-6)
    # the checkpoint holds the weights that validation measured: the averaged ones
    assert best.best_epoch == switch + 1 and best.saved_averaged
    saved = keras.saving.load_model(tmp_path / "best.keras")
    assert saved.evaluate(valid, verbose=0, return_dict=True)["loss"] == \
        pytest.approx(hist["val_loss"][switch + 1], rel=1e-5)


def test_epoch_trigger_across_per_epoch_fit_calls(tmp_path):
    model = _tiny_lm()
    model.compile(optimizer=AveragedSGD(20.0))
    train = data.lm_dataset(_streams("train", 4 * 25), 4, 8, train=False)  # 3 steps/epoch
    valid = data.lm_dataset(_streams("valid", 2 * 17), 2, 8, train=False)
    trigger = EpochTrigger(epoch=2, verbose=0)
    extra = AveragedValidation()  # a second swapper in the list must not swap twice
    flags, val = [], []
    for epoch in range(4):  # zoo.train's loop: one fit call per epoch
        hist = model.fit(train, validation_data=valid, initial_epoch=epoch, epochs=epoch + 1,
                         verbose=0, callbacks=[trigger, extra]).history
        flags += hist["averaging"]
        val += hist["val_loss"]
    opt = model.optimizer
    assert flags == [0.0, 0.0, 1.0, 1.0] and trigger.switch_epoch == 2
    assert opt.start_iteration == 6 and opt.average_count == 6
    with averaged_weights(model):
        assert model.evaluate(valid, verbose=0, return_dict=True)["loss"] == \
            pytest.approx(val[-1], rel=1e-5)


@pytest.mark.parametrize("backend", [pytest.param("torch", marks=pytest.mark.slow), "jax"])
def test_under_other_backends(backend):
    # On JAX the averaging start once shared its buffer with the iteration counter it was
    # copied from (and the averages with the weights), and the jitted step, which donates
    # both, failed at the switch: "Attempt to donate the same buffer twice".
    out = run_in_backend(backend, """
        import numpy as np, keras, torch
        from tflm import data
        from tflm.optimizers import AveragedSGD, averaged_weights
        from tflm.triggers import EpochTrigger
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

        g = np.random.default_rng(0).normal(size=(6, 5)).astype("float32")
        var, opt = keras.Variable(np.ones(5, "float32")), AveragedSGD(0.5)
        p = torch.nn.Parameter(torch.ones(5))
        ref = torch.optim.SGD([p], lr=0.5)
        for i in range(6):
            if i == 1:
                opt.start_averaging_now()
                ref = torch.optim.ASGD([p], lr=0.5, t0=0, lambd=0.0)
            opt.apply([keras.ops.convert_to_tensor(g[i])], [var])
            p.grad = torch.tensor(g[i]); ref.step()
        avg = keras.ops.convert_to_numpy(opt.average_variables[0])
        assert np.allclose(avg, ref.state[p]["ax"].numpy(), rtol=1e-6, atol=1e-7), avg
        raw = keras.ops.convert_to_numpy(var).copy()
        opt.swap_average_weights(); opt.swap_average_weights()
        assert keras.ops.convert_to_numpy(var).tobytes() == raw.tobytes()

        model = AWDLSTM(20, embed_dim=8, hidden_dim=8, num_layers=1, bptt=8, seed=3)
        model.compile(optimizer=AveragedSGD(20.0))
        ids = (np.arange(3 * 17) % 10).astype("int32")
        train = data.lm_dataset(ids, 3, 8, train=False)
        valid = data.lm_dataset(ids[:2 * 9], 2, 8, train=False)
        hist = model.fit(train, validation_data=valid, epochs=2, verbose=0,
                         callbacks=[EpochTrigger(1, verbose=0)]).history
        with averaged_weights(model) as on:
            again = model.evaluate(valid, verbose=0, return_dict=True)["loss"]
        assert on and abs(again - hist["val_loss"][-1]) < 1e-4 * again, (again, hist)
        print("OK", hist["averaging"], model.optimizer.average_count)
    """)
    assert "OK [0.0, 1.0] 2" in out
