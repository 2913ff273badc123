"""The text8 presets (Yang et al. 2018 Table 12) and the WikiText-103 presets: their models'
parameter counts against the published ones, what they record as published, the
`wikitext-103` corpus name, and a shortened training run of each WikiText-103 preset on a
miniature WikiText-103."""

import json

import numpy as np
import pytest

from tflm.data import CorpusNotFoundError, download, load_corpus
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
from zoo.presets import load_preset
from zoo.runs.builders import from_preset

# preset: (Table 12's #Param as printed, train / valid / test bpc, our model's count)
TABLE_12 = {
    "text8_softmax": ("8.42M", (1.35, 1.41, 1.49), 8_424_475),
    "text8_mos7_910_510": ("8.45M", (1.35, 1.40, 1.49), 8_448_517),
    "text8_mos7_750": ("8.45M", (1.38, 1.42, 1.50), 8_474_277),
    "text8_mos10_860_452": ("8.43M", (1.35, 1.41, 1.49), 8_432_711),
    "text8_mos10_683": ("8.43M", (1.38, 1.42, 1.50), 8_434_394),
}


@pytest.mark.parametrize("name", sorted(TABLE_12))
def test_text8_presets_record_table_12_and_build_its_sizes(name):
    printed, (train, valid, test), count = TABLE_12[name]
    preset = load_preset(name)
    published = preset["published"]
    assert (published["train_bpc"], published["valid_bpc"], published["test_bpc"]) == (
        train, valid, test)
    assert published["parameters"] == printed and f"{count:,}" in published["note"]
    assert preset["corpus"] == {"name": "text8", "vocab_size": 27}
    assert preset["model"]["num_layers"] == 1 and preset["model"]["tie_weights"]
    assert "assumed" in preset["reference"] and "last window" in preset["deviations"]
    training, model = preset["training"], preset["model"]
    assert (training["optimizer"], training["lr"], training["switch"]) == ("asgd", 20.0,
                                                                           "nonmono")
    assert (training["batch_size"], training["bptt"], training["epochs"]) == (128, 150, 50)
    assert model["dropout"] == model["dropout_i"] == model["dropout_e"] == 0.0
    assert model["weight_dropout"] == model["alpha"] == model["beta"] == 0.0
    model = from_preset(name)
    model.build()
    assert model.count_params() == count
    rounded = f"{count / 1e6:.2f}M"
    # every row's count is the printed one but MoS-7 (750, 750)'s: 8.47M against 8.45M
    assert (rounded == printed) == (name != "text8_mos7_750"), (name, rounded)


def _count(vocab, hidden, embed, head, tie=True, biases=2):
    model = AWDLSTM(vocab, embed_dim=embed, hidden_dim=hidden, last_dim=hidden, num_layers=1,
                    tie_weights=tie, head=head, init="pytorch", lstm_biases=biases, seed=0)
    model.build()
    return model.count_params()


def test_only_the_tied_27_symbol_model_has_the_softmax_rows_842m():
    softmax = {"type": "softmax"}
    assert _count(27, 1024, 1024, softmax) == 8_424_475          # 8.42M: Table 12
    assert _count(27, 1024, 1024, softmax, tie=False) == 8_452_150  # untied: 8.45M
    assert _count(28, 1024, 1024, softmax) == 8_425_500          # with <eos>: 8.43M
    mos7 = {"type": "mos", "num_experts": 7}
    assert _count(27, 910, 510, mos7, biases=1) == 8_444_877     # one LSTM bias: 8.44M
    assert _count(27, 750, 750, mos7, tie=False) == 8_494_554
    assert _count(28, 750, 750, mos7) == 8_475_028


WT103 = ("awd_lstm_wt103", "awd_lstm_mos_wt103")


@pytest.mark.parametrize("name", WT103)
def test_wt103_presets_say_nothing_is_published_and_give_the_qrnn_as_context(name):
    preset = load_preset(name)
    published = preset["published"]
    assert published["valid"] is None and published["test"] is None
    assert published["note"].startswith("none published for this model")
    context = published["context"]
    assert (context["valid"], context["test"]) == (32.0, 33.0)
    assert "1803.08240" in context["source"] and "--model QRNN" in context["model"]
    assert preset["corpus"] == {"name": "wikitext-103", "vocab_size": 267735}
    assert preset["model"]["head"]["type"] == ("softmax" if name == "awd_lstm_wt103"
                                               else "mos")
    assert "no adaptive or split softmax head" in preset["deviations"]
    from zoo.models.heads import head_names
    assert not [h for h in head_names() if "adaptive" in h or "split" in h]
    assert preset["training"]["epochs"] == 14
    # the WikiText-2 preset's command, on WikiText-103 for 14 epochs
    wt2 = load_preset("awd_lstm_wt2" if name == "awd_lstm_wt103" else "awd_lstm_mos_wt2")
    assert preset["reference"]["train"].replace("--epochs 14", "").split()[2:] == [
        w for w in wt2["reference"]["train"].replace("--epochs 750", "").replace(
            "--epochs 1000", "").replace("wikitext-2", "wikitext-103").replace(
            "WT2.pt", "WT103.pt").replace("WT2", "WT103").split()[2:]]
    assert {k: v for k, v in preset["model"].items()} == wt2["model"]


def test_wt103_full_size_models_build():
    counts = {}
    for name in WT103:
        model = from_preset(name)
        model.build()
        counts[name] = model.count_params()
    # 267,735 x 400 tied embedding + its bias + the three LSTMs 400-1150-1150-400
    assert counts["awd_lstm_wt103"] == 267_735 * 400 + 267_735 + 20_211_600
    assert counts["awd_lstm_mos_wt103"] == 105_481_085


def _wt103(directory, seed=0):
    """A miniature wikitext-103/ folder in the release's layout (wiki.*.tokens)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)] + ["the", "<unk>", "@-@", ",", "."]
    folder = directory / "wikitext-103"
    folder.mkdir(parents=True)
    for split, lines in (("train", 300), ("valid", 60), ("test", 60)):
        text = [" \n", " = Title = \n", " \n"]
        text += [" " + " ".join(rng.choice(words, rng.integers(5, 25))) + " \n"
                 for _ in range(lines)]
        (folder / f"wiki.{split}.tokens").write_text("".join(text), encoding="utf-8")
    return folder


def test_wikitext_103_is_a_corpus_name_and_is_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "fetch_bytes", pytest.fail)  # must not be called
    with pytest.raises(CorpusNotFoundError) as info:
        load_corpus("wikitext-103", tmp_path)
    message = str(info.value)
    assert "WikiText-103 (wikitext-103) not found" in message
    assert "wikitext-103-v1.zip" in message and "no built-in download" in message
    assert info.value.urls == []
    folder = _wt103(tmp_path)
    corpus = load_corpus("wt103", tmp_path)
    assert corpus.name == "wikitext-103" and corpus.level == "word"
    assert corpus.paths["train"] == folder / "wiki.train.tokens"
    assert "<eos>" in corpus.vocabulary.tokens and "@-@" in corpus.vocabulary.tokens
    assert len(corpus.valid) == sum(len(line.split()) + 1 for line in
                                    (folder / "wiki.valid.tokens").read_text().splitlines())


@pytest.mark.parametrize("name", WT103)
def test_wt103_presets_train_shortened_on_a_miniature(name, tmp_path, monkeypatch):
    from zoo import train
    _wt103(tmp_path / "data")
    monkeypatch.setenv("TFLM_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "run"
    assert train.main(["--preset", name, "--epochs", "1", "--out", str(out),
                       "--set", "corpus.max_train_tokens=1500",
                       "--set", "corpus.max_valid_tokens=300",
                       "--set", "corpus.max_test_tokens=100",
                       "--set", "model.hidden_dim=16", "--set", "model.last_dim=8",
                       "--set", "model.embed_dim=8", "--set", "training.bptt=10",
                       "--batch-size", "4", "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["corpus"] == "wikitext-103"
    # 65 words, "=", "Title" and <eos>
    assert metrics["vocab_size"] == 65 + 3 and np.isfinite(metrics["test_perplexity"])
