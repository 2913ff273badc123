"""Presets as folders, the KerasHub way (issue 43): `model.save_to_preset(dir)` and
`zoo.AWDLSTM.from_preset(dir_or_name)`, and `python -m zoo.train --export-preset DIR`."""

import json
import shutil

import keras
import numpy as np
import pytest

import zoo
from zoo import train
from zoo.errors import UserError
from zoo.models import preset_folder
from zoo.runs import preset_export

TOKENS = np.array([[1, 2, 3, 4], [5, 6, 7, 0]])


def _out(model):
    return keras.ops.convert_to_numpy(model(TOKENS))


@pytest.mark.parametrize("family", ["AWDLSTM", "ZarembaLSTM"])
def test_a_preset_folder_has_kerashubs_files_and_loads_back_equal(family, tmp_path):
    cls = getattr(zoo, family)
    kwargs = ({"embed_dim": 4, "hidden_dim": 6, "num_layers": 2} if family == "AWDLSTM"
              else {"hidden_dim": 6, "num_layers": 2})
    model = cls(vocab_size=9, **kwargs)
    model.build((None, None))
    words = [f"w{i}" for i in range(8)] + ["<eos>"]
    model.save_to_preset(tmp_path / "p", vocabulary=words, metadata={"note": "x"})
    files = sorted(str(p.relative_to(tmp_path / "p")) for p in (tmp_path / "p").rglob("*")
                   if p.is_file())
    assert files == ["assets/tokenizer/vocabulary.txt", "config.json", "metadata.json",
                     "model.weights.h5", "tokenizer.json"]
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert (config["class_name"], config["registered_name"]) == (family, f"zoo>{family}")
    tokenizer = json.loads((tmp_path / "p" / "tokenizer.json").read_text())
    assert tokenizer["config"] == {"vocabulary_size": 9, "end_of_sentence": "<eos>",
                                   "vocabulary_file": "assets/tokenizer/vocabulary.txt"}
    loaded = cls.from_preset(tmp_path / "p")
    np.testing.assert_array_equal(_out(loaded), _out(model))
    assert loaded.vocabulary == tuple(words)
    meta = loaded.preset_metadata
    assert meta["note"] == "x" and meta["parameter_count"] == model.count_params()
    assert meta["keras_version"] == keras.__version__
    untrained = cls.from_preset(tmp_path / "p", load_weights=False)
    assert not np.array_equal(_out(untrained), _out(model))


def test_a_preset_folder_is_replaced_whole_or_kept(tmp_path, monkeypatch):
    model = zoo.AWDLSTM(9, embed_dim=4, hidden_dim=6, num_layers=1)
    model.build((None, None))
    model.save_to_preset(tmp_path / "p")
    before = (tmp_path / "p" / "model.weights.h5").read_bytes()
    other = zoo.AWDLSTM(9, embed_dim=4, hidden_dim=6, num_layers=1, seed=5)
    other.build((None, None))

    def full_disk(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(zoo.AWDLSTM, "save_weights", full_disk)
    with pytest.raises(OSError, match="No space"):
        other.save_to_preset(tmp_path / "p")
    assert (tmp_path / "p" / "model.weights.h5").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no temporary left
    monkeypatch.undo()
    other.save_to_preset(tmp_path / "p")
    np.testing.assert_array_equal(_out(zoo.AWDLSTM.from_preset(tmp_path / "p")), _out(other))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a preset folder"):
        model.save_to_preset(tmp_path / "notes")
    with pytest.raises(ValueError, match="the vocabulary has 2 words, the model predicts 9"):
        model.save_to_preset(tmp_path / "q", vocabulary=["a", "b"])


@pytest.mark.parametrize("name", zoo.list_presets())
def test_a_preset_name_gives_the_arguments_zoo_train_builds_with(name):
    """`from_preset(name)` reads the preset file (zoo.models cannot import the run settings,
    which check the families' constructors); it must give each family the arguments
    `zoo.runs.builders.build_model` gives it."""
    from zoo.runs.config import resolve_config
    from zoo.runs.settings import RunSettings
    settings = RunSettings.from_config(resolve_config(name))
    kind, arguments = preset_folder.preset_model_arguments(zoo.load_preset(name))
    arguments.pop("vocab_size", None)
    assert kind == settings.model.kind
    assert arguments == dict(settings.training.model_arguments(), **settings.model.arguments)


def test_a_preset_name_builds_that_presets_untrained_model():
    built = zoo.AWDLSTM.from_preset("awd_lstm_ptb", embed_dim=8, hidden_dim=16)
    reference = zoo.from_preset("awd_lstm_ptb", embed_dim=8, hidden_dim=16)
    reference.build((None, None))
    assert built.count_params() == reference.count_params()
    assert built.backbone.hidden_dim == 16 and built.vocab_size == 10000
    assert built.vocabulary is None and built.preset_metadata == {"preset": "awd_lstm_ptb"}


@pytest.mark.parametrize("call, message", [
    (lambda: zoo.AWDLSTM.from_preset("zaremba_small_ptb"),
     "is of model.kind 'zaremba', not AWDLSTM's 'awd_lstm'"),
    (lambda: zoo.AWDLSTM.from_preset("no_such_preset"), "neither a preset folder"),
    (lambda: zoo.AWDLSTM.from_preset("hf://someone/awd"), "needs its download"),
])
def test_what_from_preset_refuses(call, message):
    with pytest.raises(UserError, match=message):
        call()


def test_a_folder_of_another_family_is_refused(tmp_path):
    model = zoo.ZarembaLSTM(vocab_size=7, hidden_dim=4, num_layers=1)
    model.save_to_preset(tmp_path / "p")
    with pytest.raises(UserError, match="holds a model of class ZarembaLSTM, not AWDLSTM"):
        zoo.AWDLSTM.from_preset(tmp_path / "p")


def test_zoo_train_exports_the_best_model_with_the_runs_provenance(tiny_run, tmp_path, capsys):
    """`--export-preset` (here with `--resume` of a finished run, which writes the outputs
    again from its last checkpoint): the best model, its words, and metadata.json with the
    run's figures as metrics.json has them."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert train.main(["--resume", str(run), "--export-preset", str(tmp_path / "p"),
                       "--quiet"]) == 0
    assert f"preset folder: {tmp_path / 'p'}" in capsys.readouterr().out
    loaded = zoo.AWDLSTM.from_preset(tmp_path / "p")
    np.testing.assert_allclose(_out(loaded), _out(zoo.load_model(run / "best.keras")),
                               rtol=1e-6)
    assert list(loaded.vocabulary) == (run / "vocab.txt").read_text().splitlines()
    metrics = json.loads((run / "metrics.json").read_text())
    meta = loaded.preset_metadata
    assert (meta["valid_perplexity"], meta["test_perplexity"], meta["best_epoch"]) == (
        metrics["valid_perplexity"], metrics["test_perplexity"], metrics["best_epoch"])
    assert meta["corpus"] == {"name": "synthetic", "vocabulary_size": 40,
                              "sha256": metrics["corpus_sha256"]}
    assert meta["epochs"] == {"run": 1, "of": 1} and meta["preset"] == "synthetic"
    assert meta["command"].startswith("python -m zoo.train --resume ")


def test_an_export_target_that_is_not_a_preset_folder_is_refused_before_training(
        tmp_path, capsys):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "thesis.tex").write_text("keep")
    assert train.main(["--epochs", "1", "--out", str(tmp_path / "run"),
                       "--export-preset", str(tmp_path / "target")]) == 2
    assert "--export-preset" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert preset_export.check_target(tmp_path / "new") is None
    assert not preset_folder.is_preset_folder(tmp_path / "target")
