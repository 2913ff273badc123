"""Character-level PTB (tflm.data.characters): the derivation of the standard pennchar files,
its statistics, and bits per character in zoo.train and zoo.evaluate."""

import json
import math

import numpy as np
import pytest

from tflm.data import characters, load_corpus


def test_a_line_becomes_characters_with_word_boundaries():
    assert characters.char_line(" aer banknote <unk> N \n") == \
        "a e r _ b a n k n o t e _ < u n k > _ N"
    assert characters.char_line("   \n") == ""
    line = "pierre <unk> N years old will join the board"
    assert characters.words_of(characters.char_line(line)) == line


def test_ptb_char_statistics_and_the_exact_inverse(ptb_dir):
    corpus = load_corpus("ptb-char", ptb_dir)
    assert corpus.level == "char" and load_corpus("ptb", ptb_dir).level == "word"
    # 50 symbols (letters, digits, punctuation, `_`, `<eos>`); 5.01M / 393k / 442k tokens,
    # the sizes reported for the standard files.
    assert len(corpus.vocabulary) == 50
    assert [len(corpus.split(s)) for s in ("train", "valid", "test")] == [
        5_017_482, 393_042, 442_423]
    words = list(corpus.vocabulary)
    for split in ("train", "valid", "test"):
        lines = (ptb_dir / "penn" / f"{split}.txt").read_text(encoding="utf-8").splitlines()
        expected = sum(len(w) for line in lines for w in line.split()) + sum(
            max(len(line.split()) - 1, 0) for line in lines) + len(lines)
        ids = corpus.split(split)
        assert len(ids) == expected
        text = " ".join(words[i] for i in ids)
        back = [characters.words_of(chunk) for chunk in text.split("<eos>")[:-1]]
        assert back == [" ".join(line.split()) for line in lines]
    first = " ".join(words[i] for i in corpus.train[:22])
    assert first == "a e r _ b a n k n o t e _ b e r l i t z _ c"


def test_written_files_load_as_the_derived_corpus(ptb_dir, tmp_path):
    word_files = {s: ptb_dir / "penn" / f"{s}.txt" for s in ("train", "valid", "test")}
    written = characters.write_char_files(word_files, tmp_path / characters.CHAR_DIR)
    assert written["train"].read_text().startswith(" a e r _ b a n k n o t e _ ")
    from_files = characters.load_char_corpus(tmp_path)
    derived = characters.load_char_corpus(ptb_dir)
    assert from_files.paths["train"] == written["train"]
    assert list(from_files.vocabulary) == list(derived.vocabulary)
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(from_files.split(split), derived.split(split))


def test_training_and_evaluation_report_bits_per_character(ptb_dir, tmp_path, capsys,
                                                           monkeypatch):
    from zoo import evaluate, train
    monkeypatch.setenv("TFLM_DATA_DIR", str(ptb_dir))
    out = tmp_path / "run"
    assert train.main(["--corpus", "ptb-char", "--epochs", "1", "--out", str(out),
                       "--set", "corpus.max_train_tokens=3000",
                       "--set", "corpus.max_valid_tokens=800",
                       "--set", "corpus.max_test_tokens=800", "--set", "model.hidden_dim=16",
                       "--set", "model.embed_dim=8", "--set", "training.bptt=20",
                       "--batch-size", "8", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "test bpc" in printed and "valid bpc" in printed.splitlines()[0]
    metrics = json.loads((out / "metrics.json").read_text())
    for split in ("valid", "test"):
        assert metrics[f"{split}_bpc"] == pytest.approx(
            math.log2(metrics[f"{split}_perplexity"]))
    epoch = metrics["history"][0]  # the training logs: NLL / ln 2, in TensorBoard too
    assert epoch["bpc"] == pytest.approx(epoch["nll"] / math.log(2))
    assert epoch["val_bpc"] == pytest.approx(math.log2(epoch["val_perplexity"]), rel=1e-5)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set()
    for folder in ("train", "validation"):
        events = EventAccumulator(str(out / "logs" / folder))
        events.Reload()
        tags |= set(events.Tags()["scalars"]) | set(events.Tags()["tensors"])
    assert "epoch_bpc" in tags
    assert evaluate.main([str(out), "--quiet", "--json", str(tmp_path / "e.json")]) == 0
    assert capsys.readouterr().out.startswith("test bpc ")
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["bpc"] == pytest.approx(math.log(result["perplexity"]) / math.log(2))
