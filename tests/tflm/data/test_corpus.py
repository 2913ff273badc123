"""Vocabulary, corpus loading (PTB, WikiText-2, plain directories) and downloads."""

import hashlib
import io
import time
import zipfile

import numpy as np
import pytest

from tests.conftest import data_dir
from tflm.data import (ChecksumError, Corpus, CorpusNotFoundError, Vocabulary, default_data_dir,
                       load_corpus)
from tflm.data import download


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    """These tests build no Keras state: skip conftest's per-test clear_session (0.2 s each)."""
    yield

# --- Vocabulary -----------------------------------------------------------------------------


def test_vocabulary_first_appearance_order_and_lookup():
    vocab = Vocabulary.from_sequences([["b", "a", "b", "<eos>"], ["c", "a", "<eos>"]])
    assert vocab.tokens == ["b", "a", "<eos>", "c"]
    assert list(vocab) == vocab.tokens and len(vocab) == 4
    assert [vocab.token_to_id(t) for t in ("b", "a", "<eos>", "c")] == [0, 1, 2, 3]
    assert [vocab.id_to_token(i) for i in range(4)] == vocab.tokens
    assert vocab.encode(["c", "b"]).tolist() == [3, 0]
    assert vocab.encode(["c"]).dtype == np.int32
    assert vocab.decode(np.array([2, 1])) == ["<eos>", "a"]
    assert "c" in vocab and "d" not in vocab


def test_vocabulary_unknown_token_message():
    with pytest.raises(KeyError) as info:
        Vocabulary(["a", "<unk>"]).token_to_id("zebra")
    message = str(info.value)
    assert "zebra" in message and "no such word" in message
    assert "has '<unk>' (id 1)" in message
    with pytest.raises(KeyError) as info:
        Vocabulary(["a"]).token_to_id("zebra")
    assert "no '<unk>'" in str(info.value) and "zebra" in str(info.value)


def test_vocabulary_rejects_bad_ids_and_duplicates():
    vocab = Vocabulary(["a", "b"])
    with pytest.raises(IndexError, match="0..1"):
        vocab.id_to_token(2)
    with pytest.raises(IndexError):
        vocab.id_to_token(-1)
    with pytest.raises(ValueError, match="'a' appears twice"):
        Vocabulary(["a", "b", "a"])


def test_vocabulary_save_load_round_trip(tmp_path):
    vocab = Vocabulary(["the", "<unk>", "Zürich", "N", "<eos>", "日本"])
    path = tmp_path / "vocab.txt"
    vocab.save(path)
    assert path.read_bytes() == "the\n<unk>\nZürich\nN\n<eos>\n日本\n".encode("utf-8")
    loaded = Vocabulary.load(path)
    assert loaded == vocab and loaded.tokens == vocab.tokens
    assert loaded != Vocabulary(["the"])
    path.write_text("a\n\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        Vocabulary.load(path)


# --- Real corpora ---------------------------------------------------------------------------


@pytest.mark.ptb
def test_ptb_statistics(ptb_dir):
    start = time.process_time()
    ptb = load_corpus("ptb", ptb_dir, download=False)
    parse_seconds = time.process_time() - start
    assert len(ptb.vocabulary) == 10_000
    assert (len(ptb.train), len(ptb.valid), len(ptb.test)) == (929_589, 73_760, 82_430)
    assert all(a.dtype == np.int32 and a.ndim == 1 for a in (ptb.train, ptb.valid, ptb.test))
    assert ptb.name == "ptb" and ptb.splits == ("train", "valid", "test")
    # Order of first appearance: the first line of ptb.train.txt starts "aer banknote ...".
    assert ptb.vocabulary.tokens[:3] == ["aer", "banknote", "berlitz"]
    assert ptb.train[:3].tolist() == [0, 1, 2]
    eos = ptb.vocabulary.token_to_id("<eos>")
    lines = sum(1 for _ in open(ptb_dir / "penn" / "train.txt", encoding="utf-8"))
    assert int((ptb.train == eos).sum()) == lines == 42_068
    assert ptb.train[-1] == eos
    assert "<unk>" in ptb.vocabulary
    assert parse_seconds < 3.0, f"parsing PTB took {parse_seconds:.2f} s of CPU"


@pytest.mark.ptb
def test_ptb_aliases_load_the_same_corpus(ptb_dir):
    a = load_corpus("penn", ptb_dir, download=False)
    b = load_corpus("Penn-Treebank", ptb_dir, download=False)
    c = load_corpus(ptb_dir / "penn")  # a plain directory path
    assert a.vocabulary == b.vocabulary == c.vocabulary
    np.testing.assert_array_equal(a.test, c.test)


@pytest.fixture
def wikitext2_dir():
    root = data_dir()
    if not all((root / "wikitext-2" / f"{s}.txt").exists() for s in ("valid", "test")):
        pytest.skip(f"WikiText-2 valid/test not found under {root} (set TFLM_DATA_DIR)")
    return root


def test_wikitext2_evaluation_splits(wikitext2_dir, monkeypatch):
    monkeypatch.setattr(download, "fetch_bytes", _offline)
    wt2 = load_corpus("wt2", wikitext2_dir, splits=("valid", "test"))
    assert wt2.train is None and wt2.splits == ("valid", "test")
    assert (len(wt2.valid), len(wt2.test)) == (217_646, 245_569)
    assert wt2.name == "wikitext-2"
    # Vocabulary built from valid then test, in order of first appearance.
    assert wt2.valid[:5].tolist() == [0, 1, 2, 3, 1]  # blank line, then " = Homarus gammarus = "
    assert wt2.vocabulary.id_to_token(0) == "<eos>"
    assert wt2.vocabulary.id_to_token(1) == "="
    with pytest.raises(ValueError, match="no 'train' split"):
        wt2.split("train")


def test_wikitext2_missing_train_is_an_error_unless_splits_given(wikitext2_dir, monkeypatch):
    monkeypatch.setattr(download, "fetch_bytes", _offline)
    with pytest.raises(CorpusNotFoundError) as info:
        load_corpus("wikitext-2", wikitext2_dir)
    message = str(info.value)
    assert "wikitext-2/train.txt" in message and "wiki.train.tokens" in message
    assert download.WIKITEXT2_URL in message
    assert "splits=('valid', 'test')" in message


# --- Plain directories ----------------------------------------------------------------------


def _write_splits(directory, names, texts):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in zip(names, texts):
        (directory / name).write_text(text, encoding="utf-8")


def test_custom_directory_tokenization(tmp_path):
    _write_splits(tmp_path, ["train.txt", "valid.txt", "test.txt"],
                  ["the cat sat\n\n  a  dog\n", "a bird\n", "the zebra\tcat\n"])
    corpus = load_corpus(tmp_path)
    vocab = corpus.vocabulary
    # Blank lines get <eos> too; order of first appearance over train, valid, test.
    assert vocab.tokens == ["the", "cat", "sat", "<eos>", "a", "dog", "bird", "zebra"]
    assert corpus.train.tolist() == [0, 1, 2, 3, 3, 4, 5, 3]
    assert corpus.valid.tolist() == [4, 6, 3]
    assert corpus.test.tolist() == [0, 7, 1, 3]
    assert corpus.name == tmp_path.name
    np.testing.assert_array_equal(corpus.split("validation"), corpus.valid)
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        corpus.split("dev")


def test_mikolov_file_names_and_layouts(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "fetch_bytes", _offline)
    texts = ["a b\n", "b c\n", "c d\n"]
    _write_splits(tmp_path / "one" / "penn", [f"ptb.{s}.txt" for s in ("train", "valid", "test")],
                  texts)
    _write_splits(tmp_path / "two", [f"ptb.{s}.txt" for s in ("train", "valid", "test")], texts)
    one = load_corpus("ptb", tmp_path / "one")
    two = load_corpus("penn", tmp_path / "two")
    three = load_corpus(tmp_path / "two")
    assert one.vocabulary.tokens == ["a", "b", "<eos>", "c", "d"]
    for other in (two, three):
        assert other.vocabulary == one.vocabulary
        np.testing.assert_array_equal(other.test, one.test)


def test_directory_with_vocab_file_keeps_ids_and_controls_eos(tmp_path):
    _write_splits(tmp_path, ["train.txt", "valid.txt", "test.txt", "vocab.txt"],
                  ["x y\nz\n", "y\n", "z x\n", "z\ny\nx\n"])
    corpus = load_corpus(tmp_path)
    assert corpus.vocabulary.tokens == ["z", "y", "x"]
    assert corpus.train.tolist() == [2, 1, 0]  # no <eos>: vocab.txt has none
    (tmp_path / "vocab.txt").write_text("<eos>\nz\ny\nx\n", encoding="utf-8")
    assert load_corpus(tmp_path).train.tolist() == [3, 2, 0, 1, 0]
    (tmp_path / "test.txt").write_text("z w\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"test.txt, line 1: word 'w' is not in the fixed"):
        load_corpus(tmp_path)


def test_directory_errors_name_what_is_missing(tmp_path):
    with pytest.raises(CorpusNotFoundError, match="neither a known corpus name"):
        load_corpus(tmp_path / "nowhere")
    _write_splits(tmp_path, ["train.txt", "valid.txt"], ["a\n", "a\n"])
    (tmp_path / "penn").mkdir()
    with pytest.raises(CorpusNotFoundError) as info:
        load_corpus(tmp_path)
    message = str(info.value)
    assert "missing split(s) test" in message and "test.txt" in message
    assert "load_corpus('ptb'" in message
    assert load_corpus(tmp_path, splits=("train", "valid")).test is None
    with pytest.raises(ValueError, match="subset of"):
        load_corpus(tmp_path, splits=("train", "dev"))


def test_corpus_validates_ids():
    vocab = Vocabulary(["a", "b"])
    with pytest.raises(ValueError, match=r"ids in \[0, 2\]"):
        Corpus(vocab, train=[0, 2])
    with pytest.raises(ValueError, match="1-D integer array"):
        Corpus(vocab, train=[[0, 1]])
    assert "train=3" in repr(Corpus(vocab, train=[0, 1, 1], name="toy"))


# --- Data directory and downloads -----------------------------------------------------------


def _offline(url, timeout=60.0):
    raise OSError("network unreachable (test)")


def test_default_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TFLM_DATA_DIR", str(tmp_path / "env"))
    assert default_data_dir() == tmp_path / "env"
    monkeypatch.delenv("TFLM_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_data_dir() == tmp_path / "cache" / "tflm" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".cache" / "tflm" / "data"


def test_missing_corpus_download_failure_is_quick_and_explained(tmp_path, monkeypatch):
    calls = []

    def fail(url, timeout=60.0):
        calls.append(url)
        raise OSError("network unreachable (test)")

    monkeypatch.setattr(download, "fetch_bytes", fail)
    monkeypatch.setenv("TFLM_DATA_DIR", str(tmp_path))  # used when data_dir is not given
    start = time.perf_counter()
    with pytest.raises(CorpusNotFoundError) as info:
        load_corpus("ptb")
    assert time.perf_counter() - start < 1.0
    assert isinstance(info.value, FileNotFoundError)
    message = str(info.value)
    assert str(tmp_path) in message
    for needle in ("penn/train.txt", "ptb.train.txt", "TFLM_DATA_DIR", "data_dir",
                   "<dir>/penn/train.txt", "network unreachable",
                   download.PTB_URL.format(split="train")):
        assert needle in message, needle
    assert calls == [download.PTB_URL.format(split="train")]
    assert info.value.directory == tmp_path and "penn/test.txt" in info.value.expected
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_download_disabled(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "fetch_bytes", pytest.fail)  # must not be called
    with pytest.raises(CorpusNotFoundError, match="download=False"):
        load_corpus("ptb", tmp_path, download=False)


def _fake_ptb(monkeypatch, texts):
    """Serves `texts` (split -> bytes) for the PTB URLs with matching checksums."""
    by_url = {download.PTB_URL.format(split=s): data for s, data in texts.items()}
    table = {s: ("sha256", hashlib.sha256(d).hexdigest()) for s, d in texts.items()}
    monkeypatch.setitem(download.CHECKSUMS, "ptb", table)
    monkeypatch.setattr(download, "fetch_bytes", lambda url, timeout=60.0: by_url[url])


def test_download_writes_verified_files(tmp_path, monkeypatch):
    texts = {"train": b"a b\nc\n", "valid": b"b\n", "test": b"c a\n"}
    _fake_ptb(monkeypatch, texts)
    corpus = load_corpus("ptb", tmp_path)
    assert corpus.vocabulary.tokens == ["a", "b", "<eos>", "c"]
    for split, data in texts.items():
        assert (tmp_path / "penn" / f"{split}.txt").read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "penn").iterdir()) == [
        "test.txt", "train.txt", "valid.txt"]  # no temporary files left


def test_checksum_mismatch_leaves_no_file(tmp_path, monkeypatch):
    _fake_ptb(monkeypatch, {"train": b"a\n", "valid": b"a\n", "test": b"a\n"})
    monkeypatch.setattr(download, "fetch_bytes", lambda url, timeout=60.0: b"tampered\n")
    with pytest.raises(ChecksumError) as info:
        load_corpus("ptb", tmp_path)
    message = str(info.value)
    assert "Checksum mismatch" in message and download.PTB_URL.format(split="train") in message
    assert hashlib.sha256(b"tampered\n").hexdigest() in message
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == []


def test_wikitext2_download_extracts_the_zip(tmp_path, monkeypatch):
    texts = {"train": b" = A =\n x y\n", "valid": b" y z\n", "test": b" z\n"}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for split, data in texts.items():
            z.writestr(f"wikitext-2/wiki.{split}.tokens", data)
    archive = buffer.getvalue()
    monkeypatch.setitem(download.CHECKSUMS, "wikitext-2", {
        s: ("sha1", hashlib.sha1(d).hexdigest()) for s, d in texts.items()})
    urls = []
    monkeypatch.setattr(download, "fetch_bytes",
                        lambda url, timeout=60.0: urls.append(url) or archive)
    corpus = load_corpus("wikitext-2", tmp_path)
    assert urls == [download.WIKITEXT2_URL]
    assert corpus.vocabulary.tokens[:3] == ["=", "A", "<eos>"]
    for split, data in texts.items():
        assert (tmp_path / "wikitext-2" / f"{split}.txt").read_bytes() == data


def test_write_atomic_removes_temporary_file_on_failure(tmp_path):
    target = tmp_path / "penn" / "train.txt"
    with pytest.raises(TypeError):
        download.write_atomic(target, "not bytes")
    assert list((tmp_path / "penn").iterdir()) == []
    download.write_atomic(target, b"ok\n")
    assert target.read_bytes() == b"ok\n"


def test_embedded_checksums_match_the_shared_table():
    readme = data_dir() / "README.md"
    if not readme.exists():
        pytest.skip(f"{readme} not found")
    text = readme.read_text(encoding="utf-8")
    for name, sub in (("ptb", "penn"), ("wikitext-2", "wikitext-2")):
        for split, (algorithm, digest) in download.CHECKSUMS[name].items():
            if algorithm == "sha256":
                assert f"{sub}/{split}.txt" in text and digest in text, (name, split)
