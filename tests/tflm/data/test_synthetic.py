"""The synthetic high-rank Markov language."""

import json
import time

import numpy as np
import pytest
from scipy import stats

from tflm.data import load_corpus, synthetic
from tflm.data.synthetic import MarkovLanguage, markov_language


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    """These tests build no Keras state: skip conftest's per-test clear_session (0.2 s each)."""
    yield


@pytest.fixture(scope="module")
def lang64():
    return markov_language(64, seed=0)


def test_rows_normalize_and_match_the_formula(lang64):
    a = lang64.true_log_probs
    assert a.shape == (64, 64) and a.dtype == np.float64
    np.testing.assert_allclose(np.log(np.exp(a).sum(axis=1)), 0.0, atol=1e-12)
    g = np.random.default_rng(0).standard_normal((64, 64)) / 0.5
    expected = g - np.log(np.exp(g).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(a, expected, atol=1e-12)
    assert (lang64.vocab_size, lang64.temperature, lang64.seed) == (64, 0.5, 0)


def test_true_rank_is_full(lang64):
    assert lang64.true_rank == 64
    rng = np.random.default_rng(1)
    low = rng.standard_normal((64, 2)) @ rng.standard_normal((2, 64))
    low = low - np.log(np.exp(low).sum(axis=1, keepdims=True))
    assert MarkovLanguage(low).true_rank <= 3  # rank 2 plus the row normalizer


def test_stationary_distribution_and_entropy_rate(lang64):
    pi, p = lang64.stationary, np.exp(lang64.true_log_probs)
    assert pi.dtype == np.float64 and pi.shape == (64,) and (pi > 0).all()
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pi @ p, pi, atol=1e-13)
    h = -np.sum(pi[:, None] * p * lang64.true_log_probs)
    assert lang64.entropy_rate == pytest.approx(h, rel=1e-12)
    assert lang64.optimal_perplexity == pytest.approx(np.exp(h), rel=1e-12)


def test_sample_frequencies_match_transition_probabilities():
    lang = markov_language(8, temperature=1.0, seed=3)
    ids = lang.sample(200_000, seed=1)
    assert ids.dtype == np.int32 and ids.shape == (200_000,)
    assert ids.min() >= 0 and ids.max() < 8
    counts = np.zeros((8, 8))
    np.add.at(counts, (ids[:-1], ids[1:]), 1)
    p = np.exp(lang.true_log_probs)
    for i in range(8):  # chi-square goodness of fit of each row
        n = counts[i].sum()
        chi2 = ((counts[i] - n * p[i]) ** 2 / (n * p[i])).sum()
        assert stats.chi2.sf(chi2, df=7) > 1e-4, (i, chi2)
    marginal = np.bincount(ids, minlength=8) / len(ids)
    np.testing.assert_allclose(marginal, lang.stationary, atol=0.01)
    # A wrong transition matrix must fail the same check.
    q = np.roll(p, 1, axis=1)
    n = counts[0].sum()
    assert stats.chi2.sf(((counts[0] - n * q[0]) ** 2 / (n * q[0])).sum(), df=7) < 1e-4


def test_empirical_perplexity_approaches_the_optimum(lang64):
    ids = lang64.sample(400_000, seed=2)
    assert lang64.empirical_perplexity(ids) == pytest.approx(lang64.optimal_perplexity, rel=0.02)
    uniform = np.random.default_rng(0).integers(0, 64, size=100_000)
    assert lang64.empirical_perplexity(uniform) > 1.5 * lang64.optimal_perplexity
    with pytest.raises(ValueError, match="at least 2 tokens"):
        lang64.empirical_perplexity([3])


def test_determinism_per_seed():
    a, b, c = markov_language(32, seed=5), markov_language(32, seed=5), markov_language(32, seed=6)
    np.testing.assert_array_equal(a.true_log_probs, b.true_log_probs)
    assert not np.allclose(a.true_log_probs, c.true_log_probs)
    np.testing.assert_array_equal(a.sample(1_000, seed=9), b.sample(1_000, seed=9))
    assert not np.array_equal(a.sample(1_000, seed=9), a.sample(1_000, seed=10))


def test_default_language_is_high_rank_with_a_low_optimum():
    lang = markov_language(128, seed=0)
    assert lang.true_rank == 128
    assert lang.optimal_perplexity < 128 / 4
    # What a rank-16 softmax could reach by truncating the true matrix is far from the optimum.
    assert lang.low_rank_perplexity(16) > 2.5 * lang.optimal_perplexity
    assert lang.low_rank_perplexity(128) == pytest.approx(lang.optimal_perplexity, rel=1e-9)
    assert lang.low_rank_perplexity(8) > lang.low_rank_perplexity(16)


def test_sampling_a_million_tokens_is_fast():
    lang = markov_language(1000, seed=0)
    start = time.process_time()
    ids = lang.sample(1_000_000, seed=0)
    seconds = time.process_time() - start
    assert len(ids) == 1_000_000
    assert seconds < 2.0, f"sampling took {seconds:.2f} s of CPU"


def test_to_corpus(lang64):
    corpus = lang64.to_corpus(train_tokens=5_000, valid_tokens=700, test_tokens=300, seed=4)
    assert corpus.name == "synthetic-markov-V64-T0.5"
    assert [len(corpus.split(s)) for s in ("train", "valid", "test")] == [5_000, 700, 300]
    assert all(corpus.split(s).dtype == np.int32 for s in ("train", "valid", "test"))
    assert corpus.vocabulary.tokens == [f"w{i}" for i in range(64)]
    assert corpus.optimal_perplexity == lang64.optimal_perplexity and corpus.language is lang64
    joined = np.concatenate([corpus.train, corpus.valid, corpus.test])
    np.testing.assert_array_equal(joined, lang64.sample(6_000, seed=4))


def test_write_round_trips_through_load_corpus(lang64, tmp_path):
    directory = lang64.write(tmp_path / "synth", train_tokens=2_005, valid_tokens=300,
                             test_tokens=300, seed=1)
    first = (directory / "train.txt").read_text(encoding="utf-8").split("\n")[0].split()
    assert len(first) == 20 and first[0].startswith("w")
    loaded = load_corpus(directory)
    expected = lang64.to_corpus(2_005, 300, 300, seed=1)
    assert loaded.vocabulary == expected.vocabulary and "<eos>" not in loaded.vocabulary
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(loaded.split(split), expected.split(split))
    meta = json.loads((directory / "language.json").read_text())
    assert meta["optimal_perplexity"] == pytest.approx(lang64.optimal_perplexity)


def test_bad_arguments():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        markov_language(10, temperature=0.0)
    with pytest.raises(ValueError, match="vocab_size"):
        markov_language(1)
    with pytest.raises(ValueError, match="logsumexp to 0"):
        MarkovLanguage(np.zeros((3, 3)))
    assert synthetic.markov_language is markov_language


def test_mixture_language_is_full_rank_and_matches_its_formula():
    from scipy.special import log_softmax, logsumexp

    from tflm.data.synthetic import mixture_markov_language
    lang = mixture_markov_language(60, num_components=3, component_rank=4, temperature=0.5,
                                   seed=7)
    assert lang.true_rank == 60
    np.testing.assert_allclose(logsumexp(lang.true_log_probs, axis=1), 0.0, atol=1e-10)
    rng = np.random.default_rng(7)
    words = rng.standard_normal((60, 4))
    contexts = rng.standard_normal((60, 3, 4))
    prior = log_softmax(rng.standard_normal((60, 3)), axis=1)
    comps = log_softmax(np.einsum("ikr,jr->ikj", contexts, words) / (2.0 * 0.5), axis=2)
    expected = logsumexp(prior[:, :, None] + comps, axis=1)
    np.testing.assert_allclose(lang.true_log_probs, expected, atol=1e-10)
    assert lang.name == "synthetic-mixture-K3-r4-V60-T0.5"
    with pytest.raises(ValueError, match="num_components"):
        mixture_markov_language(10, num_components=0)
