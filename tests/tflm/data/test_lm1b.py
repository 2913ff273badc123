"""The 1B Word loader (tflm.data.lm1b) on a miniature copy of the release's layout: splits,
lower-casing, the top-V vocabulary, `<eos>`, the cache, and the errors for a missing,
incomplete or altered copy."""

import collections

import numpy as np
import pytest

from tflm.data import ChecksumError, CorpusNotFoundError, lm1b

WORDS = ["The", "the", "cat", "Cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away",
         "and", "then", "slept", ",", "."]


def make_release(base, lines_per_shard=3, seed=0):
    """A miniature release: 99 training and 50 heldout files of random mixed-case lines."""
    rng = np.random.default_rng(seed)
    root = base / lm1b.ROOT
    texts = {}
    for folder, names in ((lm1b.TRAIN_DIR, lm1b.TRAIN_SHARDS),
                          (lm1b.HELDOUT_DIR, lm1b.HELDOUT_SHARDS)):
        (root / folder).mkdir(parents=True)
        for name in names:
            lines = [" ".join(rng.choice(WORDS, size=rng.integers(1, 8)))
                     for _ in range(lines_per_shard)]
            text = "".join(line + "\n" for line in lines)
            (root / folder / name).write_text(text, encoding="utf-8")
            texts[name] = text
    return root, texts


def reference_tokens(texts, names):
    """NumPy-free restatement of the preprocessing: lower-case, split, <eos> per line."""
    out = []
    for name in names:
        for line in texts[name].splitlines():
            out += line.lower().split() + ["<eos>"]
    return out


def test_miniature_release_loads_as_yang_et_al_preprocess_it(tmp_path):
    root, texts = make_release(tmp_path)
    corpus = lm1b.load_lm1b(root, vocab_size=8, verify=False)
    train = reference_tokens(texts, lm1b.TRAIN_SHARDS)
    counts = collections.Counter(train)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    assert list(corpus.vocabulary) == ranked[:7] + ["<unk>"]
    assert all(w == w.lower() for w in corpus.vocabulary)
    keep = set(ranked[:7])
    for split, names in (("train", lm1b.TRAIN_SHARDS),
                         ("valid", [lm1b.HELDOUT_SHARDS[i] for i in (0, 10)]),
                         ("test", [lm1b.HELDOUT_SHARDS[i] for i in (20, 30, 40)])):
        tokens = reference_tokens(texts, names)
        expected = [corpus.vocabulary.token_to_id(w if w in keep else "<unk>") for w in tokens]
        np.testing.assert_array_equal(corpus.split(split), expected)
    eos = corpus.vocabulary.token_to_id("<eos>")
    assert (corpus.train == eos).sum() == 99 * 3 and corpus.train[-1] == eos
    # a vocabulary larger than the corpus keeps every word type, <unk> last
    full = lm1b.load_lm1b(root, vocab_size=100_000, verify=False)
    assert len(full.vocabulary) == len(counts) + 1 and full.vocabulary.tokens[-1] == "<unk>"
    # other heldout shards on request
    other = lm1b.load_lm1b(root, vocab_size=8, verify=False,
                           heldout={"valid": [1], "test": [0]})
    np.testing.assert_array_equal(other.test, corpus.valid[:len(other.test)])


def test_the_cache_maps_the_encoded_splits_and_follows_the_shards(tmp_path, monkeypatch):
    root, _ = make_release(tmp_path)
    cache = tmp_path / "cache"
    first = lm1b.load_lm1b(root, vocab_size=10, verify=False, cache_dir=cache)
    assert {p.name for p in cache.iterdir()} == {"vocab.txt", "manifest.json", "train.npy",
                                                 "valid.npy", "test.npy"}

    def no_reading(*args, **kwargs):
        raise AssertionError("the text was read again")

    with monkeypatch.context() as patch:
        patch.setattr(lm1b, "count_words", no_reading)
        again = lm1b.load_lm1b(root, vocab_size=10, verify=False, cache_dir=cache)
    assert list(again.vocabulary) == list(first.vocabulary)
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(again.split(split), first.split(split))
    # a changed shard (another size) is encoded again
    shard = root / lm1b.TRAIN_DIR / lm1b.TRAIN_SHARDS[5]
    shard.write_text(shard.read_text() + "An added LINE\n", encoding="utf-8")
    changed = lm1b.load_lm1b(root, vocab_size=10, verify=False, cache_dir=cache)
    assert len(changed.train) == len(first.train) + 4


def test_missing_incomplete_and_altered_copies_are_refused_clearly(tmp_path):
    with pytest.raises(CorpusNotFoundError, match="statmt.org") as err:
        lm1b.load_lm1b(tmp_path / "nowhere", verify=False)
    assert "training-monolingual.tokenized.shuffled" in str(err.value)
    root, _ = make_release(tmp_path, lines_per_shard=1)
    (root / lm1b.TRAIN_DIR / lm1b.TRAIN_SHARDS[3]).unlink()
    (root / lm1b.HELDOUT_DIR / lm1b.HELDOUT_SHARDS[20]).unlink()
    with pytest.raises(CorpusNotFoundError, match=r"incomplete: 2 shard") as err:
        lm1b.load_lm1b(root, verify=False)
    assert "news.en-00004-of-00100" in str(err.value)
    assert "news.en.heldout-00020-of-00050" in str(err.value)
    root2, _ = make_release(tmp_path / "second", lines_per_shard=1)
    with pytest.raises(ChecksumError, match="99 lines; the release has 30,301,028"):
        lm1b.load_lm1b(root2)  # verify: the published line counts
    fake = tmp_path / "archive.tar.gz"
    fake.write_bytes(b"not the archive")
    with pytest.raises(ChecksumError, match="1,792,209,805"):
        lm1b.verify_archive(fake)
    with pytest.raises(ValueError, match="heldout shard numbers"):
        lm1b.load_lm1b(root2, verify=False, heldout={"valid": [50], "test": [1]})


def test_zoo_names_the_corpus_lm1b(tmp_path):
    from zoo.runs.corpora import load_data
    from zoo.errors import ConfigError
    make_release(tmp_path)
    corpus, optimal = load_data({"name": "lm1b", "vocab_size": 12, "verify": False,
                                 "max_train_tokens": 50}, data_dir=tmp_path)
    assert optimal is None and len(corpus.vocabulary) == 12 and len(corpus.train) == 50
    assert (tmp_path / f"{lm1b.ROOT}-cache-12" / "train.npy").exists()
    with pytest.raises(ConfigError, match="unknown setting"):
        load_data({"name": "lm1b", "vocab_sise": 12}, data_dir=tmp_path)
    with pytest.raises(CorpusNotFoundError, match="not a directory"):
        load_data({"name": "lm1b"}, data_dir=tmp_path / "empty")
    from zoo.errors import UserError
    with pytest.raises(UserError, match="30,301,028"):  # verify is on by default
        load_data({"name": "lm1b", "cache": False}, data_dir=tmp_path)


@pytest.mark.parametrize("name, exact, published", [("lm1b_softmax", 119_293_600, "119M"),
                                                     ("lm1b_mos7", 112_850_364, "113M")])
def test_table_10_presets_have_the_published_size(name, exact, published):
    """The trainable parameters are affine in V (embedding rows and output biases), so two
    small vocabularies give the count at V = 100,000 without building a 119M model: the
    tied models' counts, which round to Table 3's."""
    import zoo
    from zoo.presets.reference import differences
    preset = zoo.load_preset(name)
    assert preset["corpus"] == {"name": "lm1b", "vocab_size": 100_000}
    assert differences(preset) == []
    counts = []
    for vocab in (1000, 2000):
        model = zoo.from_preset(name, vocab)
        model.build()
        counts.append(sum(int(np.prod(w.shape)) for w in model.trainable_weights))
    per_word = (counts[1] - counts[0]) // 1000
    assert per_word == preset["model"]["embed_dim"] + 1  # embedding row + output bias
    assert counts[0] + per_word * 99_000 == exact
    assert f"{round(exact / 1e6)}M" == preset["published"]["parameters"] == published
    sampled = preset["model"]["head"].get("num_samples")
    assert (sampled == 8192) == (name == "lm1b_softmax")


@pytest.mark.parametrize("name", ["lm1b_softmax", pytest.param("lm1b_mos7",
                                                                marks=pytest.mark.slow)])
def test_tiny_table_10_preset_trains_on_the_miniature_release(name, tmp_path, capsys):
    import json

    from zoo import train
    make_release(tmp_path, lines_per_shard=1)
    out = tmp_path / "run"
    code = train.main(["--preset", name, "--data-dir", str(tmp_path), "--out", str(out),
                       "--epochs", "1", "--batch-size", "4", "--quiet",
                       "--set", "corpus.verify=false", "--set", "corpus.vocab_size=12",
                       "--set", "model.embed_dim=8", "--set", "model.hidden_dim=8",
                       "--set", "model.last_dim=8", "--set", "training.bptt=5",
                       "--set", "training.eval_batch_size=2",
                       *(["--set", "model.head.num_samples=4"] if name == "lm1b_softmax"
                         else [])])
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["vocab_size"] == 12 and np.isfinite(metrics["test_perplexity"])
    assert len(metrics["history"]) == 1 and np.isfinite(metrics["valid_perplexity"])
