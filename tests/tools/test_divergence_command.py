"""`python -m tools.divergence`: Yang et al.'s Table 11 (expected pairwise KL) for the Q
matrices given, against a NumPy computation over the same sampled pairs; one-line errors."""

import json

import numpy as np
import pytest

from tools import divergence


def _q(path, rows, words, seed):
    q = np.log(np.random.default_rng(seed).dirichlet(np.ones(words) * 0.3, size=rows))
    np.save(path, q.astype(np.float32))
    return q.astype(np.float32).astype(np.float64)


def test_the_table_gives_each_matrix_its_mean_kl_over_the_same_pairs(tmp_path, capsys):
    qa, qb = _q(tmp_path / "a.npy", 30, 7, 0), _q(tmp_path / "b.npy", 30, 7, 1)
    out = tmp_path / "kl.json"
    assert divergence.main([str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--labels",
                            "Softmax", "MoS", "--pairs", "200", "--seed", "3",
                            "--json", str(out)]) == 0
    rng = np.random.default_rng(3)  # the pairs as the docstring draws them
    i, j = rng.integers(0, 30, 200), rng.integers(0, 29, 200)
    j = j + (j >= i)
    expected = [float(np.mean(np.sum(np.exp(q[i]) * (q[i] - q[j]), axis=1))) for q in (qa, qb)]
    saved = json.loads(out.read_text())["models"]
    assert [m["label"] for m in saved] == ["Softmax", "MoS"]
    assert [m["mean"] for m in saved] == pytest.approx(expected, rel=1e-6)
    printed = capsys.readouterr().out
    assert f"| Softmax | 30 | {expected[0]:.4f} |" in printed
    assert f"| MoS | 30 | {expected[1]:.4f} |" in printed


def test_logits_instead_of_log_probabilities_are_refused_in_one_line(tmp_path, capsys):
    np.save(tmp_path / "logits.npy", np.random.default_rng(0).normal(size=(10, 5)))
    assert divergence.main([str(tmp_path / "logits.npy"), "--pairs", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a log-probability vector" in err[0]
