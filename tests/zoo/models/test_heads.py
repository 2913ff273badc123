"""Every head plugs into zoo.AWDLSTM by name; every preset builds."""

import json

import numpy as np
import pytest
import keras

import zoo
from zoo.models.heads import head_names, make_head

V = 30
TINY = dict(embed_dim=8, hidden_dim=12, num_layers=3, seed=1, bptt=6)


@pytest.mark.parametrize("name", ["softmax", "mos", "moc", "gss", "ss", "plif", "mixtape", "doc"])
def test_head_by_name_trains_saves_and_normalizes(name, tmp_path):
    assert name in head_names()
    head = {"type": name}
    if name in ("mos", "moc"):
        head["num_experts"] = 3
    if name == "plif":
        head["num_intervals"] = 50
    model = zoo.AWDLSTM(V, head=head, **TINY)
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    x = np.random.default_rng(0).integers(0, V, size=(2, 6)).astype("int32")
    logs = model.train_on_batch(x, x, return_dict=True)
    assert np.isfinite(logs["loss"])
    lp = np.asarray(model.forward_with_state(x)[0])
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, atol=1e-5)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(np.asarray(loaded.forward_with_state(x)[0]), lp)
    assert loaded.head.embedding is loaded.embedding


def test_doc_head_receives_every_layer():
    model = zoo.AWDLSTM(V, head={"type": "doc", "num_components_per_layer": [0, 2, 3]}, **TINY)
    model.build()
    assert model.head_takes_all_layers


def test_unknown_head_and_bad_arguments():
    with pytest.raises(ValueError, match="Unknown head 'nope'"):
        make_head("nope", vocab_size=10)
    with pytest.raises(ValueError, match="bogus"):
        make_head({"type": "mos", "bogus": 1}, vocab_size=10)


def _one_preset_per_model():
    """The first preset of each distinct model section and bptt: the presets that share
    them (the ablations, the NT / ET variants, ...) build the same model."""
    first = {}
    for name in zoo.list_presets():
        preset = zoo.load_preset(name)
        first.setdefault(json.dumps([preset["model"], preset["training"]["bptt"]],
                                    sort_keys=True), name)
    return list(first.values())


@pytest.mark.parametrize("name", zoo.list_presets())
def test_every_preset_states_what_it_reproduces(name):
    preset = zoo.load_preset(name)
    assert {"description", "corpus", "model", "training"} <= set(preset)
    if name != "synthetic":
        assert "published" in preset and "reproduces" in preset


@pytest.mark.parametrize("name", _one_preset_per_model())
def test_every_preset_builds_and_runs(name):
    """Each distinct model (the presets' model sections, at a tiny size) builds, runs a
    window and keeps its preset's bptt."""
    preset = zoo.load_preset(name)
    small = {"embed_dim": 8, "hidden_dim": 12}
    if preset["model"].get("kind") == "zaremba":  # one size: embedding = hidden
        small = {"hidden_dim": 12}
    head = dict(preset["model"]["head"])
    if preset["model"].get("last_dim"):  # a tied softmax reads the embedding's size
        small["last_dim"] = small["embed_dim"] if head.get("type") == "softmax" else 10
    if head.get("type") == "plif":
        head["num_intervals"] = 20
    if preset["model"].get("frage"):  # fewer popular words than the tiny vocabulary
        small["frage"] = dict(preset["model"]["frage"], popular=V // 2)
    model = zoo.from_preset(name, vocab_size=V, head=head, **small)
    x = np.zeros((1, 4), "int32")
    assert np.asarray(model.forward_with_state(x)[0]).shape == (1, 4, V)
    assert model.bptt == preset["training"]["bptt"]


def test_plif_preset_gives_the_slopes_their_own_learning_rate():
    from zoo.runs.builders import make_optimizer
    from zoo.runs.settings import TrainingSettings
    preset = zoo.load_preset("awd_lstm_plif_ptb")
    model = zoo.from_preset("awd_lstm_plif_ptb", vocab_size=V, embed_dim=8, hidden_dim=12,
                            head={"type": "plif", "num_intervals": 20})
    model.compile(optimizer=make_optimizer(TrainingSettings.from_dict(preset["training"])))
    x = np.zeros((2, 5), "int32")
    model.train_on_batch(x, x)
    multipliers = {v.path: model.optimizer.multiplier_of(v) for v in model.trainable_variables}
    plif = [m for p, m in multipliers.items() if "plif" in p]
    assert plif and all(m * preset["training"]["lr"] == pytest.approx(0.02) for m in plif)
    assert all(m == 1.0 for p, m in multipliers.items() if "plif" not in p)


def test_import_zoo_is_cheap_and_load_model_registers_the_classes(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO
    model = zoo.AWDLSTM(V, **TINY)
    model.build()
    model.save(tmp_path / "m.keras")
    code = f"""if True:
        import sys, zoo
        assert zoo.list_presets() and zoo.load_preset("synthetic")["model"]
        assert "keras" not in sys.modules, "import zoo imported Keras"
        model = zoo.load_model({str(tmp_path / "m.keras")!r})
        print(type(model).__name__, type(model.backbone).__name__, model.vocab_size)
    """
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-3:] == ["AWDLSTM", "AWDLSTMBackbone", str(V)]
