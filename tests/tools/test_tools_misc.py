"""Pairwise KL, top-k tables, Wilcoxon test, plots helpers and the noise-robustness tool."""

import json
import math

import numpy as np
import pytest
import scipy.stats

from tools.divergence import (expected_pairwise_kl, format_top_k_table, kl_rows,
                              top_k_predictions)
from tools.noise_robustness import (critical_c, gaussian_noise_robustness, main, noise_std,
                                    rank_k_matrix, ranks_under_noise,
                                    reconstruction_robustness, synthetic_q)
from tools.plots import cumulative_normalized
from tools.stats import wilcoxon_rank_sum


def _log_probs(m, n, seed=0, alpha=0.5):
    p = np.random.default_rng(seed).dirichlet(np.full(n, alpha), size=m)
    return np.log(p)


# -------------------------------------------------------------- pairwise KL


def test_pairwise_kl_matches_direct_numpy():
    q = _log_probs(30, 12, seed=1).astype(np.float32)
    res = expected_pairwise_kl(q, num_pairs=500, seed=3, chunk_pairs=37)
    i, j = res.pairs[:, 0], res.pairs[:, 1]
    assert res.pairs.shape == (500, 2) and np.all(i != j)
    assert i.min() >= 0 and max(i.max(), j.max()) < 30
    q64 = q.astype(np.float64)
    direct = np.array([np.sum(np.exp(q64[a]) * (q64[a] - q64[b])) for a, b in zip(i, j)])
    assert res.mean == pytest.approx(direct.mean(), rel=1e-12)
    assert res.std == pytest.approx(direct.std(ddof=1), rel=1e-10)
    assert res.stderr == pytest.approx(direct.std(ddof=1) / math.sqrt(500), rel=1e-10)
    again = expected_pairwise_kl(q, num_pairs=500, seed=3)
    np.testing.assert_array_equal(again.pairs, res.pairs)  # seeded
    assert expected_pairwise_kl(q, num_pairs=500, seed=4).mean != res.mean


def test_pairwise_kl_estimates_the_all_pairs_mean(tmp_path):
    q = _log_probs(25, 8, seed=2)
    p = np.exp(q)
    full = np.array([[np.sum(p[a] * (q[a] - q[b])) for b in range(25)] for a in range(25)])
    exact = full[~np.eye(25, dtype=bool)].mean()
    path = tmp_path / "q.npy"
    np.save(path, q)
    res = expected_pairwise_kl(path, num_pairs=20000, seed=0)
    assert abs(res.mean - exact) < 4 * res.stderr
    assert "pairs" in str(res)


def test_pairwise_kl_rejects_unnormalized_rows():
    logits = np.random.default_rng(0).standard_normal((10, 6))
    with pytest.raises(ValueError, match="not a log-probability vector"):
        expected_pairwise_kl(logits, num_pairs=50)
    with pytest.raises(ValueError, match="at least 2 rows"):
        expected_pairwise_kl(np.log(np.full((1, 4), 0.25)), num_pairs=10)


def test_kl_handles_zero_probabilities():
    with np.errstate(divide="ignore"):
        qi = np.log(np.array([[0.5, 0.5, 0.0]]))
        qj = np.log(np.array([[0.25, 0.25, 0.5]]))
        assert kl_rows(qi, qj)[0] == pytest.approx(math.log(2))
        assert kl_rows(qj, qi)[0] == math.inf


# ------------------------------------------------------------------- top-k


class _Vocab:
    def __init__(self, words):
        self.words = words

    def id_to_token(self, i):
        return self.words[i]


def test_top_k_predictions_and_table():
    words = ["the", "cat", "sat", "on", "mat"]
    q = np.log(np.array([[0.1, 0.4, 0.3, 0.15, 0.05], [0.6, 0.1, 0.1, 0.1, 0.1]]))
    preds = top_k_predictions(q, _Vocab(words), k=3)
    assert [w for w, _ in preds[0]] == ["cat", "sat", "on"]
    assert preds[0][0][1] == pytest.approx(0.4)
    assert [w for w, _ in preds[1]] == ["the", "cat", "sat"]  # ties broken by word id
    assert top_k_predictions(q[0], words, k=1) == [[("cat", pytest.approx(0.4))]]
    table = format_top_k_table(["the big", ["a", "small"]],
                               {"Softmax": preds, "MoS": preds},
                               references=["cat sat", "the end"])
    lines = table.splitlines()
    assert lines[0] == "Context #1  the big _____"
    assert lines[1].split() == ["Softmax", "cat", "0.40", "sat", "0.30", "on", "0.15"]
    assert lines[2].split()[0] == "MoS"
    assert lines[3] == "Reference #1  cat sat"
    assert "Context #2  a small _____" in lines


def test_top_k_errors():
    q = np.log(np.full((1, 4), 0.25))
    with pytest.raises(ValueError, match="vocabulary has 3 words"):
        top_k_predictions(q, ["a", "b", "c"], k=2)
    with pytest.raises(ValueError, match="k must be in"):
        top_k_predictions(q, ["a", "b", "c", "d"], k=5)
    with pytest.raises(ValueError, match="cover 1 contexts"):
        format_top_k_table(["x", "y"], {"m": [[("a", 0.5)]]})


# ---------------------------------------------------------------- Wilcoxon


def test_wilcoxon_matches_scipy():
    a = [57.22, 57.31, 57.05, 57.41, 57.18]
    b = [56.10, 56.35, 55.98, 56.22, 56.40, 56.02]
    res = wilcoxon_rank_sum(a, b, label_a="Softmax", label_b="GSS")
    ref = scipy.stats.ranksums(a, b)
    assert res.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert res.pvalue == pytest.approx(ref.pvalue, rel=1e-12)
    assert res.significant and "statistically significant" in res.sentence
    assert "GSS has the lower median" in res.sentence
    stat, p, sentence = res
    assert (stat, p, sentence) == (res.statistic, res.pvalue, res.sentence)


def test_wilcoxon_not_significant_and_errors():
    res = wilcoxon_rank_sum([1.0, 3.0, 5.0], [2.0, 4.0, 6.0])
    assert not res.significant and "not statistically significant" in res.sentence
    assert res.pvalue == pytest.approx(scipy.stats.ranksums([1, 3, 5], [2, 4, 6]).pvalue)
    with pytest.raises(ValueError, match="at least 2 values"):
        wilcoxon_rank_sum([1.0], [2.0, 3.0])
    with pytest.raises(ValueError, match="non-finite"):
        wilcoxon_rank_sum([1.0, np.nan], [2.0, 3.0])


# ------------------------------------------------------------------- plots


def test_cumulative_normalized_percentages():
    grid, pct = cumulative_normalized(np.array([4.0, 2.0, 1.0, 0.0]), grid=[0.0, 0.3, 0.5, 1.0])
    # normalized: 1, 0.5, 0.25, 0 -> share <= x
    np.testing.assert_allclose(pct, [25.0, 50.0, 75.0, 100.0])


# --------------------------------------------------------- noise robustness


def test_reconstruction_keeps_press_rank():
    q = synthetic_q(150, 100, rank=20, seed=1)
    rows = reconstruction_robustness(q, keep=6, iterations=4)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert all(r["press_rank"] == 6 and r["numpy_rank"] == 6 for r in rows)
    assert all(0 <= r["mse"] < 1e-20 and r["rel_error"] < 1e-12 for r in rows)


def test_noise_conventions_and_critical_level():
    assert noise_std(1e-24, 10_000) == pytest.approx(1e-16)       # sqrt(c) / n
    assert noise_std(1e-24, 10_000, "std") == pytest.approx(1e-32)  # c / n^2
    with pytest.raises(ValueError, match="convention"):
        noise_std(1.0, 10, "sigma")
    q = synthetic_q(160, 120, rank=30, seed=2)
    a0, _ = rank_k_matrix(q, keep=8)
    smax = np.linalg.norm(a0, 2)
    c_star = critical_c(smax, a0.shape, "float64")
    rows = gaussian_noise_robustness(None, [c_star / 1e4, c_star * 1e4], keep=8, a0=a0)
    assert rows[0]["press_rank"] == 8 and rows[0]["noise_to_threshold"] < 0.05
    assert rows[1]["press_rank"] == 120 and rows[1]["noise_to_threshold"] > 50
    assert rows[1]["effective_rank"]["1e-03"] <= 8  # the effective rank ignores the noise
    same = ranks_under_noise(a0, [rows[1]["std"]], levels=[c_star * 1e4])
    assert same[0]["press_rank"] == rows[1]["press_rank"]  # noise seeded per level


def test_noise_robustness_cli_synthetic(tmp_path, capsys):
    out = tmp_path / "nr"
    assert main(["--synthetic", "--rows", "120", "--cols", "80", "--rank", "12", "--keep", "5",
                 "--iterations", "3", "--out", str(out)]) == 0
    md = (out / "noise_robustness.md").read_text()
    for title in ("Table 5.11", "Table 5.12", "Table 5.13", "Scan around"):
        assert title in md
    assert md in capsys.readouterr().out
    res = json.loads((out / "noise_robustness.json").read_text())
    assert [r["press_rank"] for r in res["reconstruction"]] == [5, 5, 5]
    by_c = {r["c"]: r for r in res["noise"]}
    assert by_c[1e-2]["press_rank"] == 80   # huge noise: full rank
    assert by_c[1e-32]["press_rank"] == 5   # tiny noise: the true rank
    assert res["shape"] == [120, 80] and res["keep"] == 5


def test_noise_robustness_cli_file_and_errors(tmp_path, capsys):
    path = tmp_path / "q.npy"
    np.save(path, synthetic_q(90, 60, rank=10, seed=3))
    assert main([str(path), "--max-rows", "70", "--keep", "4", "--iterations", "1",
                 "--no-scan", "--out", str(tmp_path / "o")]) == 0
    res = json.loads((tmp_path / "o" / "noise_robustness.json").read_text())
    assert res["shape"] == [70, 60] and "first 70 of 90 rows" in res["source"]
    assert main(["--out", str(tmp_path / "o")]) == 2
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros(3))
    assert main([str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a 2-D float matrix" in capsys.readouterr().err
