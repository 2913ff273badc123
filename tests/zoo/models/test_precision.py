"""Mixed precision the Keras way (issue 43): `training.precision` / `--precision` builds the
model under a Keras dtype policy; every head trains under mixed_bfloat16 with its layers
computing in bfloat16 while the variables, the carried state, the log-probabilities and the
perplexity stay float32, and gives the float32 model's log-probabilities within bfloat16's
rounding (from zero state and from the carried state)."""

import json

import keras
import numpy as np
import pytest

from zoo.models.heads import head_names
from zoo.runs.builders import build_model, make_optimizer
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings

X = np.random.default_rng(0).integers(0, 30, (4, 8))
Y = np.roll(X, -1, axis=1)


def _model(head, precision):
    config = resolve_config("awd_lstm_ptb", [
        "model.embed_dim=8", "model.hidden_dim=12", "model.num_layers=3",
        f"model.head={{\"type\": \"{head}\"}}", "model.dropout=0", "model.dropout_h=0",
        "model.dropout_i=0", "model.dropout_e=0", "model.weight_dropout=0",
        f"training.precision={precision}", "training.lr=1.0"])
    settings = RunSettings.from_config(config)
    keras.utils.set_random_seed(1)
    model = build_model(settings, 30)
    model.compile(optimizer=make_optimizer(settings.training))
    return model


# In the fast tier: the softmax, a mixture (MoS), the head that reads every layer (DOC) and
# the one that computes in float32 throughout (the ODE); the others with `-m slow`.
FAST_HEADS = ("softmax", "mos", "doc", "node")


@pytest.mark.parametrize("head", [
    h if h in FAST_HEADS else pytest.param(h, marks=pytest.mark.slow) for h in head_names()])
def test_every_head_trains_under_mixed_bfloat16_with_float32_where_it_counts(head):
    mixed, full = _model(head, "mixed_bfloat16"), _model(head, "float32")
    full.set_weights(mixed.get_weights())
    assert keras.config.dtype_policy().name == "float32"  # the global policy is left as it was
    assert mixed.backbone.lstms[0].compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in mixed.trainable_variables)
    log_probs, states = mixed.forward_with_state(X)
    assert keras.backend.standardize_dtype(log_probs.dtype) == "float32"
    assert {keras.backend.standardize_dtype(t.dtype) for s in states for t in s} == {"float32"}
    again, _ = mixed.forward_with_state(X, states)  # the float32 state goes back in
    reference, _ = full.forward_with_state(X)
    np.testing.assert_allclose(np.asarray(log_probs), np.asarray(reference), atol=0.05)
    np.testing.assert_allclose(np.asarray(again), np.asarray(full.forward_with_state(
        X, [(h, c) for h, c in full.forward_with_state(X)[1]])[0]), atol=0.05)
    logs = mixed.fit(X, Y, batch_size=4, epochs=1, verbose=0).history
    assert np.isfinite(logs["loss"][-1]) and np.isfinite(logs["perplexity"][-1])
    assert keras.backend.standardize_dtype(mixed.nll_tracker.result().dtype) == "float32"


def test_mixed_float16_scales_the_loss_and_trains():
    model = _model("softmax", "mixed_float16")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.backbone.lstms[0].compute_dtype == "float16"
    model.build((None, None))
    before = [w.copy() for w in model.get_weights()]
    # the first steps may overflow at the initial scale (2^15) and be skipped, halving it
    logs = model.fit(np.tile(X, (20, 1)), np.tile(Y, (20, 1)), batch_size=4, epochs=1,
                     verbose=0).history
    assert np.isfinite(logs["loss"][-1])
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_a_mixed_model_saves_and_loads_with_its_policy(tmp_path):
    model = _model("mos", "mixed_bfloat16")
    model.build((None, None))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.backbone.lstms[0].compute_dtype == "bfloat16"
    np.testing.assert_allclose(np.asarray(loaded(X)), np.asarray(model(X)), atol=1e-6)


def test_an_unknown_precision_is_refused():
    from zoo.errors import ConfigError
    with pytest.raises(ConfigError, match="unknown training.precision 'half'"):
        RunSettings.from_config(resolve_config("synthetic", ["training.precision=half"]))


def test_zoo_train_with_precision_saves_the_policy_with_the_model(tmp_path):
    from tests.conftest import TINY_RUN_FLAGS
    from zoo import train
    out = tmp_path / "run"
    assert train.main(["--epochs", "1", "--out", str(out), "--precision", "mixed_bfloat16",
                       *TINY_RUN_FLAGS]) == 0
    import json
    assert json.loads((out / "config.json").read_text())["training"]["precision"] == \
        "mixed_bfloat16"
    metrics = json.loads((out / "metrics.json").read_text())
    assert np.isfinite(metrics["test_perplexity"])
    assert keras.saving.load_model(out / "best.keras").backbone.lstms[0].compute_dtype == \
        "bfloat16"


@pytest.mark.parametrize("backend", ["jax", pytest.param("torch", marks=pytest.mark.slow)])
def test_zoo_train_trains_under_mixed_bfloat16_on_jax_and_torch(backend, tmp_path):
    """The AWD-LSTM's training step under mixed_bfloat16 on the other backends: on JAX its
    LSTM's written backward pass sums the kernel gradient over the window's extent in
    bfloat16 (a float32 mask there once promoted the loop's carry: a `while_loop` dtype
    error at the first step)."""
    from tests.backends import run_in_backend
    from tests.conftest import TINY_RUN_FLAGS
    out = tmp_path / "run"
    printed = run_in_backend(backend, f"""
        import json, pathlib
        from zoo import train
        assert train.main(["--epochs", "1", "--out", {str(out)!r}, "--precision",
                           "mixed_bfloat16", *{TINY_RUN_FLAGS!r}]) == 0
        metrics = json.loads(pathlib.Path({str(out)!r}, "metrics.json").read_text())
        print(metrics["history"][0]["grad_norm"], metrics["test_perplexity"])
        """)
    grad_norm, test = map(float, printed.split()[-2:])
    assert np.isfinite(grad_norm) and grad_norm > 0
    assert 1.0 < test < 40 * 1.5  # a 40-word vocabulary: near or below uniform


def test_the_flow_heads_count_their_function_evaluations_under_mixed_precision_on_torch():
    """The ODE heads' `nfe` counter is assigned inside the head's call. Under a mixed policy
    Keras 3.15's PyTorch `assign` writes an autocast variable's update into the cast copy
    and loses it (cnf's count read 0); the counter is created without autocast."""
    from tests.backends import run_in_backend
    printed = run_in_backend("torch", """
        import json, keras, numpy as np
        from zoo.runs.builders import build_model
        from zoo.runs.config import resolve_config
        from zoo.runs.settings import RunSettings
        counts = {}
        for head in ("cnf", "node"):
            for precision in ("float32", "mixed_bfloat16"):
                config = resolve_config("awd_lstm_ptb", [
                    "model.embed_dim=8", "model.hidden_dim=12", "model.num_layers=2",
                    f'model.head={{"type": "{head}"}}', f"training.precision={precision}"])
                model = build_model(RunSettings.from_config(config), 30)
                model(np.random.default_rng(0).integers(0, 30, (2, 5)))
                counts[f"{head} {precision}"] = [float(keras.ops.convert_to_numpy(v))
                                                 for v in model.variables if v.name == "nfe"]
        print(json.dumps(counts))
        """)
    counts = json.loads(printed.strip().splitlines()[-1])
    for head in ("cnf", "node"):
        assert counts[f"{head} mixed_bfloat16"] == counts[f"{head} float32"], head
        assert counts[f"{head} float32"][0] > 0, head
