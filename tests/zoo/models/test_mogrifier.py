"""The Mogrifier family (`zoo.MogrifierLM`, `model.kind` "mogrifier"): lamb's wiring (skip
connections, dropouts, down-projection, MoS), parameter counts against lamb's budget, the
carried state, saving, its presets against their lamb configs, and training under JAX and
PyTorch."""

import copy

import keras
import numpy as np
import pytest

import zoo
from tests.backends import run_in_backend
from tflm.layers import LockedDropout, MoSLayer, StreamDropout
from zoo.errors import ConfigError
from zoo.models.mogrifier.mogrifier_lm import MogrifierLM
from zoo.presets.reference import (differences, implied_settings, lamb_hidden_size,
                                   lamb_parameter_count)
from zoo.runs.builders import make_optimizer
from zoo.runs.settings import TrainingSettings

V = 30


def _model(seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    kwargs.setdefault("embed_dim", 8)
    kwargs.setdefault("hidden_dim", 8)
    kwargs.setdefault("rank", 3)
    model = MogrifierLM(V, **kwargs)
    model.build()
    return model


def _tokens(seed=0, shape=(3, 10)):
    return np.random.default_rng(seed).integers(0, V, shape).astype("int32")


def test_skip_connections_sum_the_layers_outputs():
    model = _model(num_layers=3)
    out = model.backbone(_tokens())
    raw = [np.asarray(r) for r in out["raw_layer_outputs"]]
    np.testing.assert_allclose(np.asarray(out["sequence_output"]), sum(raw), atol=1e-6)
    plain = _model(num_layers=3, skip_connections=False)
    out = plain.backbone(_tokens())
    np.testing.assert_allclose(np.asarray(out["sequence_output"]),
                               np.asarray(out["raw_layer_outputs"][-1]), atol=1e-6)


def test_a_tied_softmax_gets_the_down_projection_and_mos_does_not():
    projected = _model(embed_dim=6, hidden_dim=10)
    assert projected.backbone.output_dim == 6
    assert tuple(projected.backbone.projection.kernel.shape) == (10, 6)
    log_probs = projected.forward_with_state(_tokens())[0]
    assert np.asarray(log_probs).shape == (3, 10, V)
    mos = _model(embed_dim=6, hidden_dim=10,
                 head={"type": "mos", "num_experts": 2, "latent_dropout": 0.3})
    assert mos.backbone.projection is None and isinstance(mos.head, MoSLayer)
    assert tuple(mos.head.latent_kernel.shape) == (10, 2 * 6)
    assert _model(embed_dim=6, hidden_dim=10, tie_weights=False).backbone.projection is None
    assert _model(embed_dim=8, hidden_dim=8).backbone.projection is None


def test_dropouts_are_lambs():
    model = _model(num_layers=2, input_dropout=0.5, inter_layer_dropout=0.4,
                   state_dropout=0.3, output_dropout=0.2)
    backbone = model.backbone
    assert isinstance(backbone.input_dropout, StreamDropout)
    assert [d.rate for d in backbone.inter_layer_dropouts] == [0.4]
    assert [lstm.state_dropout for lstm in backbone.lstms] == [0.3, 0.3]
    assert backbone.output_dropout.rate == 0.2
    shared = _model(input_dropout=0.5, shared_mask_dropout=True).backbone
    assert isinstance(shared.input_dropout, LockedDropout)
    tokens = _tokens()
    assert not np.allclose(np.asarray(model(tokens, training=True)),
                           np.asarray(model(tokens, training=False)), atol=1e-4)


def test_the_parameter_count_is_lambs():
    """Our model has the parameters lamb's num_params budget counts (lamb_parameter_count),
    tied softmax and MoS, full and low rank, odd and even rounds."""
    for config, kwargs in [
            (dict(input_embedding_ratio=1.0, feature_mask_rounds=5, feature_mask_rank=3,
                  mos_num_components=0), dict(embed_dim=12, rank=3, rounds=5)),
            (dict(input_embedding_ratio=0.5, feature_mask_rounds=4, feature_mask_rank=0,
                  mos_num_components=2), dict(embed_dim=6, rank=None, rounds=4,
                                              head={"type": "mos", "num_experts": 2}))]:
        config.update(num_layers=2, share_input_and_output_embeddings=True)
        model = _model(hidden_dim=12, **kwargs)
        assert model.count_params() == lamb_parameter_count(config, 12, V)


@pytest.mark.parametrize("name, hidden, embed, count", [
    ("mogrifier_ptb", 912, 912, 23_986_480), ("mogrifier_wt2", 1366, 272, 34_991_552)])
def test_presets_have_the_size_lambs_budget_gives(name, hidden, embed, count):
    preset = zoo.load_preset(name)
    config = preset["reference"]["config"]
    vocab = preset["corpus"]["vocab_size"]
    assert lamb_hidden_size(config, vocab + 1) == hidden
    assert (preset["model"]["hidden_dim"], preset["model"]["embed_dim"]) == (hidden, embed)
    assert lamb_parameter_count(config, hidden, vocab) == count == preset["published"][
        "parameters"] <= config["num_params"]
    assert lamb_parameter_count(config, hidden + 1, vocab + 1) > config["num_params"]


def test_presets_record_the_published_numbers_and_lambs_config():
    ptb, wt2 = zoo.load_preset("mogrifier_ptb"), zoo.load_preset("mogrifier_wt2")
    assert (ptb["published"]["valid"], ptb["published"]["test"]) == (51.4, 50.1)
    assert (wt2["published"]["valid"], wt2["published"]["test"]) == (57.3, 55.1)
    assert "44.9 / 44.8" in ptb["published"]["note"]
    assert "40.2 / 38.6" in wt2["published"]["note"]
    assert (ptb["model"]["rounds"], ptb["model"]["rank"]) == (5, 84)
    assert (wt2["model"]["rounds"], wt2["model"]["rank"]) == (6, 48)
    assert wt2["model"]["head"] == {"type": "mos", "num_experts": 2,
                                    "latent_dropout": wt2["model"]["output_dropout"]}
    for preset in (ptb, wt2):
        assert preset["training"]["adam_beta_1"] == 0.0  # lamb's "rmsprop"
        assert preset["reference"]["config"]["optimizer_type"] == "rmsprop"
        for words in ("averag", "drop_state_probability", "temperature", "clipped"):
            assert words in preset["deviations"], words


def test_a_changed_lamb_entry_is_reported():
    preset = copy.deepcopy(zoo.load_preset("mogrifier_ptb"))
    assert differences(preset) == []
    preset["reference"]["config"]["feature_mask_rank"] = 0
    preset["reference"]["config"]["num_params"] = 20_000_000
    found = {field: (ours, ref) for field, ours, ref in differences(preset)}
    assert found["model.rank"] == (84, 0)
    assert found["model.hidden_dim"][0] == 912 and found["model.hidden_dim"][1] < 912
    preset["reference"]["config"]["optimizer_type"] = "sgd"
    with pytest.raises(ConfigError, match="optimizer_type"):
        implied_settings(preset)


def test_adam_beta_1_setting_reaches_the_optimizer():
    optimizer = make_optimizer(TrainingSettings.from_dict({"optimizer": "adam", "lr": 0.002,
                                                           "adam_beta_1": 0.0}))
    assert optimizer.beta_1 == 0.0
    assert make_optimizer(TrainingSettings.from_dict({"optimizer": "adam"})).beta_1 == 0.9
    with pytest.raises(ConfigError, match="adam_beta_1"):
        TrainingSettings.from_dict({"optimizer": "adam", "adam_beta_1": 1.0})


def test_carried_state_equals_one_long_window():
    model = _model(num_layers=2, rounds=4, rank=2)
    tokens = _tokens(shape=(2, 12))
    whole, states = model.forward_with_state(tokens)
    first, mid = model.forward_with_state(tokens[:, :5])
    second, end = model.forward_with_state(tokens[:, 5:], mid)
    np.testing.assert_allclose(np.concatenate([np.asarray(first), np.asarray(second)], 1),
                               np.asarray(whole), atol=1e-5)
    for (h, c), (h2, c2) in zip(states, end):
        np.testing.assert_allclose(np.asarray(h2), np.asarray(h), atol=1e-5)
        np.testing.assert_allclose(np.asarray(c2), np.asarray(c), atol=1e-5)
    assert model.state_sizes() == [8, 8]


def test_keras_file_round_trip(tmp_path):
    model = _model(embed_dim=6, hidden_dim=10, rounds=3, rank=2, input_dropout=0.3,
                   head={"type": "mos", "num_experts": 2})
    path = tmp_path / "mog.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is MogrifierLM and loaded.count_params() == model.count_params()
    tokens = _tokens()
    np.testing.assert_allclose(np.asarray(loaded(tokens)), np.asarray(model(tokens)),
                               atol=1e-6)
    assert loaded.get_config()["rounds"] == 3 and loaded.backbone.projection is None
    projected = _model(embed_dim=6, hidden_dim=10)
    projected.save(tmp_path / "p.keras")
    again = keras.saving.load_model(tmp_path / "p.keras")
    np.testing.assert_allclose(np.asarray(again(tokens)), np.asarray(projected(tokens)),
                               atol=1e-6)


def test_from_preset_builds_the_family():
    model = zoo.from_preset("mogrifier_ptb", vocab_size=V, embed_dim=8, hidden_dim=8, rank=2)
    assert type(model) is MogrifierLM and model.loss_reduction == "sum_over_time"
    assert (model.bptt, model.clip_norm, model.scale_by_window) == (70, 10.0, False)
    assert model.weight_decay == pytest.approx(0.00025235335778471014)
    assert zoo.MogrifierLM is MogrifierLM


FIT = """
    import numpy as np, keras
    from tflm import data
    from tflm.optimizers import Adam
    from zoo.models.mogrifier.mogrifier_lm import MogrifierLM
    keras.utils.set_random_seed(0)
    ids = data.markov_language(20, seed=0).to_corpus(train_tokens=320, valid_tokens=100,
                                                     test_tokens=100).train
    model = MogrifierLM(20, embed_dim=6, hidden_dim=8, rounds=5, rank=2, input_dropout=0.2,
                        state_dropout=0.3, output_dropout=0.2, seed=1,
                        head={{"type": "{head}", "num_experts": 2}} if "{head}" == "mos"
                        else "softmax")
    model.compile(optimizer=Adam(0.01, beta_1=0.0))
    model.build()
    before = [np.array(keras.ops.convert_to_numpy(v)) for v in model.trainable_variables]
    history = model.fit(data.lm_dataset(ids, batch_size=4, bptt=10, train=False), epochs=2,
                        verbose=0)
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], loss
    after = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    moved = {{v.path for v, a, b in zip(model.trainable_variables, before, after)
             if not np.allclose(a, b)}}
    assert any("mogrifier_0_right" in p for p in moved), moved
    assert len(moved) == len(before), set(v.path for v in model.trainable_variables) - moved
    print("FIT_OK", loss)
"""


@pytest.mark.parametrize("backend, head", [("jax", "softmax"), ("torch", "mos")])
def test_fit_on_other_backends(backend, head):
    out = run_in_backend(backend, FIT.format(head=head))
    assert "FIT_OK" in out
