"""text8 (tflm.data.text8) on a miniature: the 90 / 5 / 5 split, the 27-character vocabulary
without <eos>, the exact round trip, the size / checksum / alphabet refusals, the download
(a monkeypatched fetch) and the hook into load_corpus, zoo's corpus settings and zoo.train."""

import hashlib
import io
import json
import math
import zipfile

import numpy as np
import pytest

from tflm.data import ChecksumError, CorpusNotFoundError, download, load_corpus, text8

N = 300_000  # characters of the miniature
SIZES = (270_000, 15_000, 15_000)  # 90 / 5 / 5 % of it


def _text(n=N, seed=0):
    """Random a-z and single spaces, starting with a space as text8 does."""
    rng = np.random.default_rng(seed)
    chars = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)[rng.integers(0, 26, n)]
    chars[rng.random(n) < 0.18] = ord(" ")
    chars[0] = ord(" ")
    return chars.tobytes().replace(b"  ", b" a")


def _write(directory, data, where="text8/text8"):
    path = directory / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _zip(data):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("text8", data)
    return buffer.getvalue()


@pytest.fixture
def published(monkeypatch):
    """Makes the miniature (and its zip) the 'published' text8: sizes and sha1s."""
    data = _text()
    archive = _zip(data)
    monkeypatch.setitem(text8.SIZES, "text8", len(data))
    monkeypatch.setitem(text8.SIZES, "text8.zip", len(archive))
    monkeypatch.setitem(text8.CHECKSUMS, "text8", ("sha1", hashlib.sha1(data).hexdigest()))
    monkeypatch.setitem(text8.CHECKSUMS, "text8.zip",
                        ("sha1", hashlib.sha1(archive).hexdigest()))
    monkeypatch.setattr(text8, "MIKOLOV2012_SPLIT", SIZES)
    return data, archive


def test_the_published_facts_are_the_ones_recorded():
    assert text8.URL == "http://mattmahoney.net/dc/text8.zip"
    assert text8.SIZES == {"text8.zip": 31_344_016, "text8": 100_000_000}
    assert text8.CHECKSUMS["text8"] == ("sha1", "0dc3edebc970dcc96137e7deda4d9995af9d93de")
    assert text8.CHECKSUMS["text8.zip"] == ("sha1",
                                            "6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e")
    assert text8.MIKOLOV2012_SPLIT == (90_000_000, 5_000_000, 5_000_000)
    assert sum(text8.MIKOLOV2012_SPLIT) == text8.TEXT_SIZE


def test_split_sizes_vocabulary_and_round_trip(tmp_path):
    data = _text()
    path = _write(tmp_path, data)
    corpus = text8.load_text8(tmp_path, split_sizes=SIZES, verify=False, download=False)
    assert corpus.name == "text8" and corpus.level == "char"
    assert [len(corpus.split(s)) for s in ("train", "valid", "test")] == list(SIZES)
    # 27 tokens, fixed ids: the space (written "_"), then a-z; no <eos>, no <unk>
    assert corpus.vocabulary.tokens == ["_"] + list("abcdefghijklmnopqrstuvwxyz")
    assert len(corpus.vocabulary) == 27 and "<eos>" not in corpus.vocabulary.tokens
    # consecutive: train = the first 90 %, valid the next 5 %, test the last 5 %
    text = data.decode("ascii")
    assert text8.decode(corpus.train) == text[:270_000]
    assert text8.decode(corpus.valid) == text[270_000:285_000]
    assert text8.decode(corpus.test) == text[285_000:]
    assert "".join(text8.decode(corpus.split(s)) for s in corpus.splits) == text
    words = corpus.vocabulary.tokens
    assert "".join(words[i] for i in corpus.train[:40]).replace("_", " ") == text[:40]
    assert corpus.paths == {s: path for s in ("train", "valid", "test")}
    np.testing.assert_array_equal(text8.encode(text[:1000]), corpus.train[:1000])
    assert text8.encode("a z").tolist() == [1, 0, 26]
    with pytest.raises(ValueError, match="ids are 0..26"):
        text8.decode([27])


def test_split_sizes_must_cover_the_file_and_the_error_gives_the_proportions(tmp_path):
    _write(tmp_path, _text())
    with pytest.raises(ValueError) as info:
        text8.load_text8(tmp_path, verify=False, download=False)
    message = str(info.value)
    assert "add up to 100,000,000 characters" in message and "has 300,000" in message
    assert "split_sizes=[270000, 15000, 15000]" in message
    assert "--set corpus.split_sizes=[270000,15000,15000]" in message
    for bad in ((1, 2), (0, 150_000, 150_000), (2.5, 1, 299_996.5), "abc"):
        with pytest.raises(ValueError, match="three positive character counts"):
            text8.load_text8(tmp_path, split_sizes=bad, verify=False, download=False)


def test_verify_refuses_a_file_that_is_not_the_published_text8(tmp_path):
    _write(tmp_path, _text())
    with pytest.raises(ChecksumError) as info:
        load_corpus("text8", tmp_path, download=False)
    message = str(info.value)
    assert "has 300,000 characters; the published text8 has 100,000,000" in message
    assert "verify=False" in message and text8.URL in message


def test_verify_checks_the_sha1_of_a_file_of_the_right_size(tmp_path, published):
    data, _ = published
    _write(tmp_path, data)
    corpus = load_corpus("text8", tmp_path, download=False)  # the hook: verified, split
    assert corpus.level == "char" and len(corpus.train) == SIZES[0]
    altered = bytearray(data)
    altered[1000] = ord("q") if altered[1000] != ord("q") else ord("r")
    _write(tmp_path, bytes(altered))
    with pytest.raises(ChecksumError, match="sha1 is .* the published text8's is"):
        load_corpus("text8", tmp_path, download=False)
    assert text8.load_text8(tmp_path, verify=False, download=False).train[1000] != \
        corpus.train[1000]


def test_a_character_outside_the_alphabet_is_refused_with_its_position(tmp_path):
    data = bytearray(_text())
    data[12_345] = ord("A")
    _write(tmp_path, bytes(data))
    with pytest.raises(ValueError, match=r"character 12,345: byte 0x41 \('A'\) is not in "
                                         r"text8's alphabet"):
        text8.load_text8(tmp_path, split_sizes=SIZES, verify=False, download=False)
    _write(tmp_path, _text()[:-1] + b"\n")  # a line break, even at the end, is refused
    with pytest.raises(ValueError, match="character 299,999: byte 0x0a"):
        text8.load_text8(tmp_path, split_sizes=SIZES, verify=False, download=False)


def test_download_through_a_monkeypatched_fetch(tmp_path, monkeypatch, published):
    data, archive = published
    calls = []
    monkeypatch.setattr(download, "fetch_bytes",
                        lambda url, timeout=60.0: calls.append(url) or archive)
    corpus = load_corpus("text8", tmp_path)
    assert calls == [text8.URL]
    assert (tmp_path / "text8" / "text8").read_bytes() == data
    assert [p.name for p in (tmp_path / "text8").iterdir()] == ["text8"]  # no temporary
    assert text8.decode(corpus.test) == data.decode("ascii")[-15_000:]
    monkeypatch.setattr(download, "fetch_bytes", pytest.fail)  # found now: no download
    again = load_corpus("text8", tmp_path)
    np.testing.assert_array_equal(again.train, corpus.train)


def test_a_corrupt_or_truncated_download_writes_nothing(tmp_path, monkeypatch, published):
    data, archive = published
    tampered = _zip(data[:-1] + (b"b" if data[-1:] != b"b" else b"c"))
    for served, size, match in (
            (archive[:-10], len(archive), "has .* bytes; the published text8.zip has"),
            (tampered, len(tampered), "Checksum mismatch")):  # the right size, other bytes
        monkeypatch.setitem(text8.SIZES, "text8.zip", size)
        monkeypatch.setattr(download, "fetch_bytes", lambda url, timeout=60.0: served)
        with pytest.raises(ChecksumError, match=match):
            load_corpus("text8", tmp_path)
        assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    monkeypatch.setitem(text8.SIZES, "text8.zip", 9)
    monkeypatch.setitem(text8.CHECKSUMS, "text8.zip",
                        ("sha1", hashlib.sha1(b"not a zip").hexdigest()))
    monkeypatch.setattr(download, "fetch_bytes", lambda url, timeout=60.0: b"not a zip")
    with pytest.raises(ChecksumError, match="not a valid zip archive"):
        load_corpus("text8", tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_not_found_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "fetch_bytes", pytest.fail)
    with pytest.raises(CorpusNotFoundError) as info:
        load_corpus("text8", tmp_path, download=False)
    message = str(info.value)
    assert "download=False" in message and str(tmp_path / "text8" / "text8") in message
    assert text8.URL in message and info.value.urls == [text8.URL]

    def offline(url, timeout=60.0):
        raise OSError("network unreachable")
    monkeypatch.setattr(download, "fetch_bytes", offline)
    with pytest.raises(CorpusNotFoundError, match="the download failed: .*network unreachable"):
        load_corpus("text8", tmp_path)


def test_a_local_zip_or_the_bare_file_is_found(tmp_path, published):
    data, archive = published
    (tmp_path / "text8.zip").write_bytes(archive)
    corpus = load_corpus("text8", tmp_path, download=False)  # unpacked, checked, split
    assert (tmp_path / "text8" / "text8").read_bytes() == data
    assert text8.decode(corpus.valid) == data.decode("ascii")[270_000:285_000]
    bare = tmp_path / "bare"
    _write(bare, data, where="text8")  # as `unzip text8.zip` leaves it
    assert len(load_corpus("text8", bare, download=False).train) == SIZES[0]
    from_path = text8.load_text8(path=tmp_path / "text8.zip")  # read without unpacking
    np.testing.assert_array_equal(from_path.train, corpus.train)


def test_zoo_settings_take_the_loaders_names_and_options(tmp_path):
    from zoo.errors import ConfigError, UserError
    from zoo.runs import settings as run_settings
    from zoo.runs.corpora import load_data
    assert run_settings._TEXT8_NAMES == text8.NAMES
    part = {"name": "text8", "verify": False, "split_sizes": list(SIZES), "vocab_size": 27,
            "path": None, "max_train_tokens": 1000}
    parsed = run_settings.CorpusSettings.from_dict(part)
    assert set(parsed.options) == {"verify", "split_sizes", "vocab_size", "path"}
    with pytest.raises(ConfigError, match="corpus.verify must be"):
        run_settings.CorpusSettings.from_dict(dict(part, verify="no"))
    with pytest.raises(ConfigError, match="cache"):
        run_settings.CorpusSettings.from_dict(dict(part, cache=True))
    _write(tmp_path, _text())
    corpus, optimal = load_data(part, data_dir=tmp_path)
    assert optimal is None and corpus.level == "char" and len(corpus.train) == 1000
    with pytest.raises(UserError, match="the published text8 has 100,000,000"):
        load_data(dict(part, verify=True), data_dir=tmp_path)
    with pytest.raises(UserError, match="cannot read corpus text8: split_sizes"):
        load_data(dict(part, split_sizes=[1, 2, 3]), data_dir=tmp_path)


def test_a_shortened_preset_run_reports_bits_per_character(tmp_path, monkeypatch, capsys):
    from zoo import train
    _write(tmp_path / "data", _text())
    monkeypatch.setenv("TFLM_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "run"
    assert train.main(["--preset", "text8_mos7_910_510", "--epochs", "1", "--out", str(out),
                       "--set", "corpus.verify=false",
                       "--set", "corpus.split_sizes=[270000,15000,15000]",
                       "--set", "corpus.max_train_tokens=4000",
                       "--set", "corpus.max_valid_tokens=800",
                       "--set", "corpus.max_test_tokens=300",
                       "--set", "model.hidden_dim=16", "--set", "model.last_dim=16",
                       "--set", "model.embed_dim=8", "--set", "training.bptt=20",
                       "--batch-size", "8", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "test bpc" in printed and "valid bpc" in printed.splitlines()[0]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["corpus"] == "text8" and metrics["vocab_size"] == 27
    assert metrics["test_bpc"] == pytest.approx(math.log2(metrics["test_perplexity"]))
    # an untrained 27-way model is near log2(27) = 4.75 bpc; one epoch is below it
    assert metrics["valid_bpc"] < math.log2(27)
