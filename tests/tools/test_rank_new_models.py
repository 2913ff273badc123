"""The Q_theta and rank tools on the models added after AWD-LSTM-MoS: the Mogrifier LSTM
(softmax and MoS heads) and an AWD-LSTM trained with Past Decode Regularization.

Q = log softmax(H W^T + b) has rank at most d + 2 for a softmax head of input size d (the
logits' d, the bias and the row-wise log-normalizer); a mixture of softmaxes is not bound by
it (Yang et al. 2018 §2). The export (`tools.qmatrix`) and the rank report (`tools.rank`)
must see exactly that on these models: Press rank <= d + 2 with a softmax, above it with MoS.
"""

import json

import numpy as np
import pytest

from tflm import data
from tools.qmatrix import export_q, main as qmatrix_main
from tools.rank import main as rank_main, rank_report
from tools.spectrum import singular_values

V, D = 40, 4


@pytest.fixture(scope="module")
def corpus():
    lang = data.synthetic.markov_language(V, seed=11)
    return lang.to_corpus(train_tokens=400, valid_tokens=200, test_tokens=301, seed=12)


def _mogrifier(head):
    import zoo
    model = zoo.MogrifierLM(V, embed_dim=D, hidden_dim=D, num_layers=1, rounds=3, rank=2,
                            seed=0, head=head)
    model.build()
    return model


def _press_rank(path):
    report = rank_report(singular_values(path))
    return report["press_rank"], report


@pytest.mark.parametrize("head, bounded", [
    ("softmax", True), ({"type": "mos", "num_experts": 3}, False)])
def test_mogrifier_q_has_the_rank_its_head_allows(corpus, tmp_path, head, bounded):
    model = _mogrifier(head)
    meta = export_q(model, corpus, "test", tmp_path / "q.npy", bptt=25)
    q = np.load(tmp_path / "q.npy")
    assert q.shape == (300, V)
    np.testing.assert_allclose(np.exp(q.astype(np.float64)).sum(1), 1.0, atol=1e-5)
    targets = np.asarray(corpus.test)[1:]
    assert meta["perplexity"] == pytest.approx(
        float(np.exp(-q[np.arange(300), targets].astype(np.float64).mean())), rel=1e-6)
    rank, report = _press_rank(tmp_path / "q.npy")
    if bounded:
        assert rank <= D + 2, report
    else:
        assert rank > D + 2, report


def test_past_decode_model_exports_and_ranks_from_the_command_line(corpus, tmp_path, capsys):
    """A saved AWD-LSTM with PDR: `tools.qmatrix` then `tools.rank` from their command
    lines; PDR adds a training loss only, so the softmax bound holds."""
    import zoo
    model = zoo.AWDLSTM(V, embed_dim=D, hidden_dim=8, num_layers=2, seed=0, past_decode=0.1)
    model.build()
    path = tmp_path / "pdr.keras"
    model.save(path)
    corpus_dir = corpus.language.write(tmp_path / "corpus", train_tokens=300,
                                       valid_tokens=100, test_tokens=201, seed=1)
    assert qmatrix_main([str(path), "--corpus", str(corpus_dir), "--split", "test",
                         "--out", str(tmp_path / "q.npy")]) == 0
    assert rank_main([str(tmp_path / "q.npy"), "--json", str(tmp_path / "rank.json")]) == 0
    capsys.readouterr()
    (report,) = json.loads((tmp_path / "rank.json").read_text())["reports"]
    assert 1 <= report["press_rank"] <= D + 2, report
