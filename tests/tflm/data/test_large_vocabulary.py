"""Large vocabularies (issue 16): the Zipfian 100K-word stand-in corpus, and sampled-softmax
training at V = 100,000 across two local worker processes (MultiWorkerMirroredStrategy)
equal to one process on the same global batch."""

import json

import numpy as np
import pytest
from scipy import stats

from tests.tflm.test_distribute import _result, _run
from tflm.distribute import free_local_ports
from tflm.data import ZipfLanguage


def test_zipf_language_probabilities_sample_and_optimal_perplexity():
    lang = ZipfLanguage(1000, exponent=1.1, seed=3)
    p = lang.probabilities
    np.testing.assert_allclose(p[:-1] / p[1:], (np.arange(2, 1001) / np.arange(1, 1000)) ** 1.1)
    assert p.sum() == pytest.approx(1.0)
    assert lang.optimal_perplexity == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    corpus = lang.to_corpus(60_000, 5_000, 5_000)
    assert corpus.optimal_perplexity == lang.optimal_perplexity
    assert len(corpus.vocabulary) == 1000 and corpus.name == "zipf-1000-s1.1"
    counts = np.bincount(corpus.train, minlength=1000)
    # the 30 most frequent ranks and the tail pooled: a chi-square test of the sample
    observed = np.append(counts[:30], counts[30:].sum())
    expected = np.append(p[:30], p[30:].sum()) * counts.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    for bad in ({"vocab_size": 1}, {"exponent": 0.0}):
        with pytest.raises(ValueError, match="ZipfLanguage"):
            ZipfLanguage(**bad)


def test_zoo_makes_the_zipf_corpus_by_name():
    from zoo.runs.corpora import load_data
    corpus, optimal = load_data({"name": "synthetic", "kind": "zipf", "vocab_size": 100_000,
                                 "train_tokens": 3000, "valid_tokens": 100,
                                 "test_tokens": 100})
    assert len(corpus.vocabulary) == 100_000 and optimal == pytest.approx(
        ZipfLanguage(100_000).optimal_perplexity)


SAMPLED_WORKERS = """
import json, os, numpy as np
from tflm import distribute
strategy = None if os.environ["ROLE"] == "single" else distribute.get_strategy("multi-worker")
import keras
from tflm import data
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
V = 100_000
ids = data.zipf_language(V, seed=0).sample(4 * 31, seed=1)
kw = dict(embed_dim=8, hidden_dim=8, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1,
          head={"type": "softmax", "num_samples": 20, "sampling_seed": 7})
ds = distribute.lm_dataset_for(strategy, ids, 4, 10, train=False)
scope = strategy.scope() if strategy else keras.name_scope("single")
with scope:
    m = AWDLSTM(V, **kw); m.build()
    for i, v in enumerate(m.trainable_weights):
        v.assign(np.random.default_rng(i).normal(size=v.shape).astype("float32") * 0.1)
    m.head.sampler.set_proposal(np.bincount(ids, minlength=V))
    m.compile(optimizer=keras.optimizers.SGD(2.0))
e = m.evaluate(ds, verbose=0, return_dict=True)["perplexity"]
h = m.fit(ds, epochs=2, verbose=0).history
e2 = m.evaluate(ds, verbose=0, return_dict=True)["perplexity"]
print("RESULT " + json.dumps({"eval": [e, e2], "train": h["perplexity"],
      "wsum": float(sum(np.abs(w).sum() for w in m.get_weights()))}))
"""


@pytest.mark.slow  # CI time (about a minute under load); runs with -m slow
def test_sampled_training_at_100k_words_on_two_workers_equals_one_process():
    """Each worker draws the candidates of its own streams (the global batch's draw), so two
    workers train exactly as one process does on the same global batch of 4 streams; the
    full-softmax evaluation over 100,000 words agrees to the rounding of float32 sums of
    100,000 terms split differently between the workers (mean NLL within 3e-5 relative;
    1.0e-5 seen)."""
    workers = [f"127.0.0.1:{p}" for p in free_local_ports(2)]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(_run(SAMPLED_WORKERS, {"TF_CONFIG": json.dumps(config),
                                            "ROLE": "worker"}))
    single = _result(_run(SAMPLED_WORKERS, {"ROLE": "single"}))
    results = [_result(p) for p in procs]
    assert results[0] == results[1], "workers must agree"
    for a, b in zip(results[0]["train"], single["train"]):
        assert a == pytest.approx(b, rel=1e-5)
    assert results[0]["wsum"] == pytest.approx(single["wsum"], rel=1e-6)
    for a, b in zip(results[0]["eval"], single["eval"]):  # perplexities near 10^5
        assert np.log(a) == pytest.approx(np.log(b), rel=3e-5)
    assert single["train"][-1] < single["train"][0] and single["eval"][1] < single["eval"][0]
