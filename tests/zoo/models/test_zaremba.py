"""The Zaremba / TF-PTB-tutorial model (Zhang 2018): parameter counts, initialisation,
dropout placement, the time-summed loss, the per-epoch decay, and parity with a PyTorch peer
of the tutorial on identical weights."""

import gc

import keras
import numpy as np
import pytest

import zoo
from tflm.epoch_decay import EpochDecay, decayed_rate
from tflm.optimizers import SGD
from zoo.errors import ConfigError
from zoo.models.zaremba.zaremba_lm import ZarembaLSTM
from tests.backends import run_tests_in_backend

V, H, B = 30, 8, 3
ZAREMBA_PRESETS = [n for n in zoo.list_presets() if n.startswith("zaremba_")]
# One preset per distinct model (BMLG = BM, the tuned medium MoS = medium MoS: same model).
COUNTED = [n for n in ZAREMBA_PRESETS if n not in ("zaremba_bmlg_ptb",
                                                    "zaremba_medium_mos_tuned_ptb")]


def _model(seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    kwargs.setdefault("hidden_dim", H)
    model = ZarembaLSTM(V, **kwargs)
    model.build()
    return model


@pytest.mark.parametrize("name", COUNTED)
def test_parameter_count_equals_the_seeds(name, monkeypatch):
    """Every row whose count the thesis prints (exact values inferred from the printed
    millions: 5.258 M = 5,257,615, ...) is built with exactly that many parameters."""
    # The count does not depend on the values: zeros instead of 100M random draws (7x faster)
    for cls in (keras.initializers.RandomUniform, keras.initializers.GlorotUniform,
                keras.initializers.Orthogonal):
        monkeypatch.setattr(cls, "__call__",
                            lambda self, shape, dtype=None: keras.ops.zeros(shape, dtype))
    published = zoo.load_preset(name)["published"]
    model = zoo.from_preset(name)
    model.build()
    count = model.count_params()
    del model
    gc.collect()
    assert count == published["parameters"]
    printed = float(published["parameters_printed"].split()[0])
    assert round(count / 1e6, 3) == printed


def test_the_baselines_have_the_tutorials_counts():
    counts = {n: zoo.load_preset(f"zaremba_{n}_ptb")["published"]["parameters"]
              for n in ("small", "medium", "large")}
    assert counts == {"small": 4_651_600, "medium": 19_775_200, "large": 66_022_000}
    assert [zoo.load_preset(f"zaremba_{n}_ptb")["published"]["test"]
            for n in ("small", "medium", "large")] == [114.396, 83.179, 78.195]


def test_presets_where_the_count_implies_k10_say_so():
    for twin, of in (("zaremba_bmlg_ptb", "zaremba_bm_ptb"),
                     ("zaremba_medium_mos_tuned_ptb", "zaremba_medium_mos_ptb")):
        assert zoo.load_preset(twin)["model"] == zoo.load_preset(of)["model"]
        assert (zoo.load_preset(twin)["published"]["parameters"]
                == zoo.load_preset(of)["published"]["parameters"])
    for name in ("zaremba_medium_mos_tied_ptb", "zaremba_medium_mos_factorized_ptb"):
        preset = zoo.load_preset(name)
        assert preset["model"]["head"]["num_experts"] == 10
        assert "K = 10" in preset["published"]["note"] and "K = 10" in preset["deviations"]
    assert zoo.load_preset("zaremba_medium_mos_ptb")["model"]["head"]["num_experts"] == 15


def test_every_weight_is_uniform_in_the_init_scale_and_the_lstm_biases_start_at_zero():
    model = _model(init_scale=0.07, head={"type": "mos", "num_experts": 3, "prior_bias": True,
                                          "output_rank": 4})
    for v in model.weights:
        value = keras.ops.convert_to_numpy(v)
        if v.path.endswith("lstm_cell/bias"):
            assert np.all(value == 0), v.path  # BasicLSTMCell: zero bias, forget_bias 0
        else:
            assert np.abs(value).max() <= 0.07 and value.std() > 0.07 / 4, v.path
    # distinct draws (a shared Keras initializer would repeat them)
    firsts = {float(keras.ops.convert_to_numpy(v).ravel()[0]) for v in model.weights
              if not v.path.endswith("bias")}
    assert len(firsts) == len([v for v in model.weights if not v.path.endswith("bias")])
    for lstm in model.lstms:
        assert not lstm.cell.unit_forget_bias


def test_dropout_is_on_the_non_recurrent_connections_only_with_fresh_masks_per_step():
    model = _model(dropout=0.5, seed=3)
    backbone = model.backbone
    for lstm in backbone.lstms:
        assert (lstm.weight_dropout, lstm.dropout, lstm.recurrent_dropout) == (0.0, 0.0, 0.0)
    assert [type(d).__name__ for d in [backbone.input_dropout, *backbone.dropouts]] == \
        ["StreamDropout"] * 3  # per stream under tf.distribute (tests/tflm/test_distribute.py)
    kept = keras.ops.convert_to_numpy(
        backbone.input_dropout(np.ones((2, 50, H), "float32"), training=True)) > 0
    assert not all((kept[:, t] == kept[:, 0]).all() for t in range(1, 50))  # not locked
    assert 0.35 < kept.mean() < 0.65
    x = np.random.default_rng(0).integers(0, V, (2, 6))
    a, _ = model.forward_with_state(x, training=False)
    b, _ = model.forward_with_state(x, training=False)
    np.testing.assert_array_equal(a, b)  # evaluation: no dropout


def test_time_summed_loss_is_the_nll_summed_over_time_and_averaged_over_streams():
    rng = np.random.default_rng(1)
    model = _model(loss_reduction="sum_over_time")
    logits = rng.normal(size=(B, 5, V))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    y = rng.integers(0, V, (B, 5))
    x = rng.integers(0, V, (B, 5))
    x[1, 3:] = -1  # padding (tflm.data.PAD_ID): no loss there
    loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs.astype("float32"), inputs=x)
    nll = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0] * (x >= 0)
    np.testing.assert_allclose(float(loss), nll.sum() / B, rtol=1e-5)
    assert float(tokens) == (x >= 0).sum()
    with pytest.raises(ValueError, match="loss_reduction must be one of"):
        ZarembaLSTM(V, loss_reduction="mean")


def test_the_time_summed_loss_steps_t_times_as_far_as_the_token_mean():
    x = np.random.default_rng(2).integers(0, V, (B, 7))
    y = np.roll(x, -1, axis=1)
    moved = {}
    for reduction in ("token_mean", "sum_over_time"):
        model = _model(loss_reduction=reduction, clip_norm=None)
        model.compile(optimizer=SGD(0.01), run_eagerly=True)
        before = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
        model.train_on_batch(x, y)
        moved[reduction] = [keras.ops.convert_to_numpy(v) - w
                            for v, w in zip(model.trainable_variables, before)]
    for mean, summed in zip(moved["token_mean"], moved["sum_over_time"]):
        np.testing.assert_allclose(summed, 7 * mean, atol=1e-6)


def test_epoch_decay_is_the_tutorials_rule():
    rates = [decayed_rate(1.0, 0.5, 4, i) for i in range(13)]
    assert rates == [1.0] * 4 + [0.5 ** k for k in range(1, 10)]
    schedule = EpochDecay(1 / 1.15, decay_after=14, learning_rate=1.0)
    np.testing.assert_allclose([schedule.rate(i) for i in (13, 14, 54)],
                               [1.0, 1 / 1.15, 1.15 ** -41])
    with pytest.raises(ValueError, match="decay must be a number in"):
        EpochDecay(1.15, decay_after=1)
    with pytest.raises(ValueError, match="decay_after must be an integer"):
        EpochDecay(0.5, decay_after=-1)


def test_epoch_decay_sets_the_optimizers_rate_at_each_epoch_and_resumes():
    model = _model()
    model.compile(optimizer=SGD(1.0))
    decay = EpochDecay(0.5, decay_after=2)
    decay.set_model(model)
    decay.on_train_begin()
    seen = []
    for epoch in range(4):
        decay.on_epoch_begin(epoch)
        seen.append(float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))
    assert seen == [1.0, 1.0, 0.5, 0.25]
    resumed = EpochDecay(0.5, decay_after=2)
    resumed.set_state(decay.get_state())  # lr_0, not the decayed rate the optimizer holds
    resumed.set_model(model)
    resumed.on_train_begin()
    assert resumed.rate(4) == 0.125


def test_the_schedule_and_its_fields_are_checked():
    from zoo.runs.builders import build_model, make_lr_schedule
    from zoo.runs.settings import RunSettings, TrainingSettings
    assert isinstance(make_lr_schedule(TrainingSettings.from_dict(
        {"lr": 1.0, "lr_decay": 0.8, "decay_after": 6})), EpochDecay)
    with pytest.raises(ConfigError, match="set one of them"):
        make_lr_schedule(TrainingSettings.from_dict({"lr_decay": 0.8, "when": [3]}))
    for field, value, message in (("lr_decay", 1.5, "a number in \\(0, 1\\]"),
                                  ("decay_after", -2, "an integer >= 0"),
                                  ("loss_reduction", "mean", "'token_mean'"),
                                  ("fixed_windows", "yes", "true or false")):
        config = zoo.load_preset("zaremba_small_ptb")
        config["training"][field] = value
        with pytest.raises(ConfigError, match=f"training.{field} must be {message}"):
            RunSettings.from_config(config)
    with pytest.raises(ConfigError, match="unknown model.kind 'gru'"):
        build_model(RunSettings.from_config(
            {"corpus": {}, "model": {"kind": "gru"}, "training": {}}), V)


def test_a_saved_model_reloads_with_equal_outputs(tmp_path):
    model = _model(tie_weights=True, output_bias=False,
                   head={"type": "mos", "num_experts": 2, "prior_bias": True})
    x = np.random.default_rng(4).integers(0, V, (2, 5))
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = zoo.load_model(path)
    assert type(loaded).__name__ == "ZarembaLSTM" and loaded.loss_reduction == "sum_over_time"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)),
                                  keras.ops.convert_to_numpy(loaded(x)))
    assert loaded.embedding.output_bias is None and loaded.count_params() == model.count_params()


# ---- parity with the tutorial in PyTorch ------------------------------------------------

torch = pytest.importorskip("torch")


def _pair(num_experts=0):
    from tflm.testing.zaremba_peer import ZarembaPeer, load_keras_weights
    head = ({"type": "mos", "num_experts": num_experts, "prior_bias": True} if num_experts
            else "softmax")
    model = _model(head=head, hidden_dim=H, clip_norm=5.0)
    peer = ZarembaPeer(V, H, num_experts=num_experts)
    load_keras_weights(peer, model)
    return model, peer


@pytest.mark.parametrize("num_experts", [0, 3])
def test_forward_and_tutorial_steps_equal_the_pytorch_peer(num_experts):
    """Dropout off: the log-probabilities over carried windows, the time-summed cost and the
    weights after three SGD steps (lr 1, global clip 5, some clipped) agree."""
    model, peer = _pair(num_experts)
    model.compile(optimizer=SGD(1.0), run_eagerly=True)
    rng = np.random.default_rng(5)
    data = rng.integers(0, V, (B, 19))
    state = peer.init_hidden(B)
    states = None
    for start in (0, 6, 12):
        x, y = data[:, start:start + 6], data[:, start + 1:start + 7]
        ours, states = model.forward_with_state(x, states)
        with torch.no_grad():
            theirs, state = peer(torch.as_tensor(x), state)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), theirs.numpy(), atol=2e-6)
    state = peer.init_hidden(B)
    for start in (0, 6, 12):
        x, y = data[:, start:start + 6], data[:, start + 1:start + 7]
        logs = model.train_on_batch(x, y, return_dict=True)
        cost, state = peer.tutorial_step(torch.as_tensor(x), torch.as_tensor(y), state, lr=1.0,
                                         max_grad_norm=5.0)
    from tflm.testing.zaremba_peer import ZarembaPeer, load_keras_weights
    ours = ZarembaPeer(V, H, num_experts=num_experts)
    load_keras_weights(ours, model)
    theirs = dict(peer.named_parameters())
    for name, value in ours.named_parameters():
        np.testing.assert_allclose(value.detach().numpy(), theirs[name].detach().numpy(),
                                   atol=3e-5, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(float(logs["loss"]), float(cost), rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_parity_holds_on_the_other_keras_backends(backend):
    """The same parity tests under JAX and PyTorch (a subprocess each: Keras fixes its
    backend per process)."""
    out = run_tests_in_backend(backend, __file__,
                               "pytorch_peer or t_times or reloads or uniform")
    assert " passed" in out and "skipped" not in out, out[-2000:]
