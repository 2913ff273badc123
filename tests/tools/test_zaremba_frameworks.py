"""`tools/compare_frameworks.py` on Zaremba presets: the native PyTorch peer of
`zoo.ZarembaLSTM` (tools/frameworks/torch_zaremba.py) from the shared weights by role, the
tutorial's step in `NativeTrainer`, the config resolution and the FLOP model."""

import keras
import numpy as np
import pytest

from tools.frameworks import compare as cf
from tools.frameworks.report import flops_per_token
from tools.frameworks.settings import training_settings, window_rule

torch = pytest.importorskip("torch")

V, H, B, T = 30, 8, 3, 5
HEADS = {"softmax": ({}, "softmax"),
         "mos": ({"head": {"type": "mos", "num_experts": 2, "prior_bias": True}}, None),
         "tied": ({"tie_weights": True, "output_bias": False,
                   "head": {"type": "mos", "num_experts": 2, "prior_bias": True}}, None),
         "factorized": ({"head": {"type": "mos", "num_experts": 2, "prior_bias": True,
                                  "output_rank": 3}}, None)}


def _pair(kind):
    from tools.frameworks.roles import export_keras_roles
    from tools.frameworks.torch_native import from_model_config
    from zoo.runs.builders import build_model
    from zoo.runs.settings import RunSettings
    options, _ = HEADS[kind]
    config = {"corpus": {}, "model": {"kind": "zaremba", "hidden_dim": H, **options},
              "training": {}}
    keras.utils.set_random_seed(0)
    model = build_model(RunSettings.from_config(config), V)
    model.build()
    native = from_model_config(config["model"], V, seed=0)
    native.load_roles(export_keras_roles(model))
    return model, native


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_the_native_peer_computes_the_keras_models_log_probs_and_step(kind):
    from tools.frameworks.torch_native import NativeTrainer
    from tflm.optimizers import SGD
    model, native = _pair(kind)
    x = np.random.default_rng(1).integers(0, V, (B, T))
    y = np.roll(x, -1, 1)
    native.eval()
    with torch.no_grad():
        theirs = native(torch.as_tensor(x))[0].numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), theirs, atol=2e-6)
    assert sum(p.numel() for p in native.parameters() if p.requires_grad) == \
        model.count_params()
    model.compile(optimizer=SGD(1.0), run_eagerly=True)
    model.log_window_values = True
    logs = model.train_on_batch(x, y, return_dict=True)
    trainer = NativeTrainer(native, 1.0, T, 5.0, loss_reduction="sum_over_time",
                            scale_by_window=False)
    loss, _ = trainer.train_step(torch.as_tensor(x), torch.as_tensor(y))
    np.testing.assert_allclose(float(logs["window_loss"]), float(loss), rtol=1e-5)
    from tools.frameworks.roles import export_keras_roles
    ours = export_keras_roles(model)
    for role, value in native.export_roles().items():
        np.testing.assert_allclose(ours[role], value, atol=3e-5, err_msg=role)


def test_a_zaremba_preset_resolves_with_the_tutorials_windows_and_step():
    config = cf.resolve_config("zaremba_medium_ptb", no_dropout=True)
    assert "lstm_biases" not in config["model"] and config["model"]["dropout"] == 0.0
    s = training_settings(config)
    assert (s["loss_reduction"], s["scale_by_window"], s["fixed_windows"]) == \
        ("sum_over_time", False, True)
    assert window_rule({}, s, 0)["train"] is False
    awd = training_settings(cf.resolve_config("awd_lstm_ptb"))
    assert (awd["loss_reduction"], awd["scale_by_window"]) == ("token_mean", True)


def test_flops_per_token_of_the_zaremba_models():
    medium = cf.resolve_config("zaremba_medium_ptb")
    lstm = 2 * 4 * 650 * (650 + 650)
    assert flops_per_token(medium, 10_000)["params_per_token"] == lstm + 650 * 10_000
    factorized = cf.resolve_config("zaremba_medium_mos_factorized_ptb")
    head = 650 * 10 * 650 + 650 * 10 + 10 * 256 * (10_000 + 650)
    assert flops_per_token(factorized, 10_000)["params_per_token"] == lstm + head
