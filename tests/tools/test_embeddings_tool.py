"""tools.embeddings: PCA component counts against NumPy on a matrix with a known spectrum, and
the command line on a tiny zoo run."""

import json

import numpy as np
import pytest

from tools import embeddings as emb
from zoo.errors import UserError


def known_spectrum_matrix(sigma, rows=200, seed=0):
    """A rows x len(sigma) matrix with column means 0 and centred singular values `sigma`
    (plus a constant row offset that centring removes)."""
    rng = np.random.default_rng(seed)
    d = len(sigma)
    u, _ = np.linalg.qr(rng.normal(size=(rows, d)))
    u -= u.mean(axis=0)                      # columns orthogonal to the ones vector ...
    u, _ = np.linalg.qr(u)                   # ... and orthonormal again
    v, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return u @ np.diag(sigma) @ v.T + rng.normal(size=d)


def reference_counts(matrix, thresholds):
    x = matrix - matrix.mean(axis=0)
    var = np.linalg.eigvalsh(x.T @ x / (len(x) - 1))[::-1]  # covariance eigenvalues
    cumulative = np.cumsum(var) / var.sum()
    return {t: 1 + min(k for k in range(len(var)) if cumulative[k] >= t - 1e-12)
            for t in thresholds}


def test_components_of_a_known_spectrum():
    sigma = np.array([10.0, 6.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.25])
    e = known_spectrum_matrix(sigma)
    pca = emb.principal_components(e)
    np.testing.assert_allclose(pca["singular_values"], sigma, rtol=1e-10)
    share = np.cumsum(sigma ** 2) / (sigma ** 2).sum()
    # sigma^2 summed: 100, 136, 152, 161, 165, ... of 166.3125 (0.60, 0.82, 0.91, 0.97, ...)
    assert share[0] < 0.75 <= share[1] and share[2] < 0.95 <= share[3]
    assert (pca["components_75"], pca["components_95"]) == (2, 4)
    assert pca["components"] == reference_counts(e, (0.75, 0.95))
    np.testing.assert_allclose(pca["explained_variance_ratio"].sum(), 1.0)
    # the projection is the centred rows on the first two principal axes
    x = e - e.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    np.testing.assert_allclose(np.abs(pca["projection"]), np.abs(x @ vt[:2].T), atol=1e-10)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_components_on_random_matrices_match_numpy(seed):
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(60, 10)) * rng.uniform(0.1, 3.0, size=10) + 5.0
    thresholds = (0.5, 0.75, 0.9, 0.95, 0.99)
    assert emb.principal_components(e, thresholds)["components"] == reference_counts(
        e, thresholds)


def test_components_from_given_singular_values():
    # an SVD-parameterized layer's S, unsorted, one negative value clipped to 0
    ratios, counts = emb.components_for_variance([1.0, 3.0, -2.0, 2.0], num_rows=50)
    np.testing.assert_allclose(ratios, [9 / 14, 4 / 14, 1 / 14, 0.0])
    assert counts == {0.75: 2, 0.95: 3}
    assert emb.components_for_variance([0.0, 0.0], num_rows=5)[1] == {0.75: 0, 0.95: 0}


def test_frequent_ids_and_unknown_words():
    assert emb.frequent_ids([3, 1, 3, 2, 1, 3, 0], 5, count=3) == [3, 1, 0]
    assert emb.word_ids(["b", "a"], ["a", "b", "c"]) == [1, 0]
    with pytest.raises(UserError, match="'x', 'y'"):
        emb.word_ids(["a", "x", "y"], ["a", "b"])


def test_command_line_on_a_run(tiny_run, tmp_path, capsys):
    out = tmp_path / "emb"
    assert emb.main([str(tiny_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("spectrum.png", "projection.png", "embeddings.json"):
        assert (out / name).stat().st_size > 0
        assert (out / name).read_bytes()[:4] == (b"\x89PNG" if name.endswith("png") else b"{\n  ")
    report = json.loads((out / "embeddings.json").read_text(encoding="utf-8"))
    assert report["shape"] == [40, 8] and len(report["singular_values"]) == 8
    assert 1 <= report["components_75"] <= report["components_95"] <= 8
    assert f"75 % of the variance: {report['components_75']} of 8" in printed
    assert "most frequent in training" in printed and len(report["labelled_words"]) == 10


def test_words_option(tiny_run, tmp_path, capsys):
    vocab = (tiny_run / "vocab.txt").read_text(encoding="utf-8").splitlines()
    out = tmp_path / "emb"
    assert emb.main([str(tiny_run), "--out", str(out), "--words", f"{vocab[3]},{vocab[7]}"]) == 0
    report = json.loads((out / "embeddings.json").read_text(encoding="utf-8"))
    assert report["labelled_words"] == [vocab[3], vocab[7]]
    capsys.readouterr()
    assert emb.main([str(tiny_run), "--out", str(tmp_path / "bad"), "--words",
                     f"{vocab[3]},no-such-word"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tools.embeddings: error: ")
    assert "'no-such-word'" in err[0]
    assert not (tmp_path / "bad").exists()
