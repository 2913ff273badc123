"""tflm.optimizers.Adam: torch.optim.Adam's update with the window factor in the step size."""

import numpy as np
import pytest

import keras
import torch

from tflm.optimizers import Adam
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

RNG = np.random.default_rng(3)


def test_equals_torch_adam_with_the_learning_rate_scaled_per_step():
    theta = RNG.normal(size=(4, 3)).astype("float32")
    grads = [RNG.normal(size=(4, 3)).astype("float32") * 10.0 ** -i for i in range(5)]
    scales = [1.0, 0.5, 1.3, 0.2, 1.0]
    variable = keras.Variable(theta)
    ours = Adam(0.01)
    ours.build([variable])
    param = torch.nn.Parameter(torch.tensor(theta))
    ref = torch.optim.Adam([param], lr=0.01)
    for g, s in zip(grads, scales):
        ours.set_window_scale(s)
        ours.apply([g], [variable])
        ref.param_groups[0]["lr"] = 0.01 * s  # what the references do per window
        param.grad = torch.tensor(g)
        ref.step()
        np.testing.assert_allclose(np.asarray(variable), param.detach().numpy(),
                                   rtol=1e-5, atol=1e-7)
    # the factor is a step size, not a gradient scale: Adam would ignore the latter
    assert not np.allclose(np.asarray(variable), theta)


def test_train_step_puts_the_window_factor_into_the_step_size(tmp_path):
    kw = dict(embed_dim=4, hidden_dim=6, num_layers=1, dropout=0, dropout_h=0, dropout_i=0,
              dropout_e=0, weight_dropout=0, alpha=0, beta=0, seed=1, bptt=10, clip_norm=None)
    x = RNG.integers(0, 20, size=(2, 5)).astype("int32")  # T = 5: factor 1/2
    y = RNG.integers(0, 20, size=(2, 5)).astype("int32")
    moved = {}
    for name, lr, scale in (("window", 0.01, True), ("half_lr", 0.005, False)):
        model = AWDLSTM(20, scale_by_window=scale, **kw)
        model.build()
        model.set_weights([np.full(w.shape, 0.1, "float32") + 0.01 * np.arange(w.size).reshape(
            w.shape) % 0.3 for w in model.get_weights()])
        before = [w.copy() for w in model.get_weights()]
        model.compile(optimizer=Adam(lr))
        model.train_on_batch(x, y)
        moved[name] = [a - b for a, b in zip(model.get_weights(), before)]
    for a, b in zip(moved["window"], moved["half_lr"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-8)
    path = tmp_path / "adam.keras"
    model.save(path)
    assert isinstance(keras.saving.load_model(path).optimizer, Adam)


def test_zoo_builds_it_for_training_optimizer_adam():
    from zoo.runs.builders import make_optimizer
    from zoo.runs.settings import TrainingSettings
    opt = make_optimizer(TrainingSettings.from_dict({"optimizer": "adam", "lr": 2e-3}))
    assert isinstance(opt, Adam)
    assert float(opt.learning_rate) == pytest.approx(2e-3)
