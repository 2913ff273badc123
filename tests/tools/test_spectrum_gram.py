"""method="gram": Press rank equal to LAPACK's around the threshold, the error bound, the floor
it refuses below (and auto's TSQR fallback), streaming, and errors on bad input."""

import json
import math

import numpy as np
import pytest
import scipy.linalg

from tools.qmatrix_io import QMatrixError
from tools.rank import main as rank_main
from tools.rank import numpy_rank, press_rank, press_threshold, rank_report
from tools.spectrum import (GRAM_SAFETY, GramFloorError, SpectrumResult, gram_depth,
                            gram_floor, singular_values)

U = 2.0 ** -53


def _prescribed(m, n, s, seed, dtype=np.float32):
    """U diag(s) V^T with random orthonormal U (m x k), V (n x k), stored in `dtype`."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, len(s))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    return ((u * np.asarray(s)) @ v.T).astype(dtype)


def _around_press(m, n, seed, above=5, below=5):
    """Singular values 1 ... 1e-3 (20), `above` at 2 t and `below` at t / 2, t = Press."""
    t = press_threshold(1.0, (m, n), "float32")
    s = np.r_[np.geomspace(1.0, 1e-3, 20), np.full(above, 2 * t), np.full(below, 0.5 * t)]
    return _prescribed(m, n, s, seed), 20 + above


def _bound(res):
    """E of the module docstring, recovered from the floor: s_floor = sqrt(K E)."""
    return res.floor ** 2 / GRAM_SAFETY


def _allowed(res, sigma):
    """The stated bound on |s_i - sigma_i|: min(sqrt(E), E / sigma_i)."""
    e = _bound(res)
    return np.minimum(np.sqrt(e), e / np.maximum(sigma, 1e-300))


# ------------------------------------------------------------- the Press rank


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("m,n,block", [(4000, 200, 300), (150, 3000, 64)])
def test_press_rank_equals_lapack_just_above_and_below_the_threshold(seed, m, n, block):
    """Values at 2x and 0.5x the float32 Press threshold: gram counts what LAPACK counts."""
    a, expected = _around_press(m, n, seed)
    res = singular_values(a, method="gram", block_rows=block)
    assert res.method == "gram" and res.exact and res.compute_dtype == "float64"
    assert res.shape == (m, n) and res.values.shape == (min(m, n),)
    assert np.all(np.diff(res.values) <= 0)
    lapack32 = singular_values(a, method="lapack").values
    lapack64 = singular_values(a, method="lapack", dtype="float64").values
    ranks = [press_rank(v, a.shape, "float32") for v in (res.values, lapack32, lapack64)]
    assert ranks == [expected] * 3
    assert numpy_rank(res.values, a.shape, "float32") == numpy_rank(lapack64, a.shape,
                                                                    "float32")
    threshold = press_threshold(res.s_max, a.shape, "float32")
    assert res.floor < threshold  # resolved, so no refusal
    # The counted values are on the right side of t by more than the bound allows to move.
    assert res.values[expected - 1] > 1.9 * threshold
    assert res.values[expected] < 0.51 * threshold


def test_singular_values_agree_with_lapack_to_the_stated_bound():
    """|s_i - sigma_i| <= min(sqrt(E), E / sigma_i), sigma_i from float64 LAPACK."""
    a, _ = _around_press(3000, 300, seed=4)
    res = singular_values(a, method="gram", block_rows=250)
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    e = _bound(res)
    err = np.abs(res.values - ref)
    allowed = _allowed(res, ref)
    assert np.all(err <= allowed), np.max(err / allowed)
    # E itself: gamma_d ||Q||_F^2 + N u s_max^2, from the formula.
    d = gram_depth(3000, 250)
    gamma = d * U / (1 - d * U)
    expected = gamma * np.sum(ref ** 2) + 300 * U * ref[0] ** 2
    assert e == pytest.approx(expected, rel=1e-6, abs=0)


def test_values_below_the_floor_are_not_resolved():
    """Why gram refuses: values under s_floor come out wrong, those above are accurate."""
    tail = 1e-10
    s = np.r_[np.geomspace(1.0, 1e-3, 30), np.full(5, tail)]
    a = _prescribed(3000, 100, s, seed=5, dtype=np.float64)
    ref = scipy.linalg.svdvals(a)
    res = singular_values(a, method="gram", min_resolved=1e-4)
    assert res.floor > 100 * tail
    np.testing.assert_allclose(res.values[:30], ref[:30], rtol=1e-10)
    assert np.max(np.abs(res.values[30:35] - ref[30:35]) / ref[30:35]) > 0.5
    with pytest.raises(GramFloorError):
        singular_values(a, method="gram", min_resolved=tail)


# --------------------------------------------------------- refusal and fallback


def test_refuses_a_threshold_below_its_floor_naming_both():
    a, _ = _around_press(2000, 100, seed=6)
    with pytest.raises(GramFloorError) as info:
        singular_values(a, method="gram", min_resolved=1e-8)
    msg = str(info.value)
    assert isinstance(info.value, ValueError) and info.value.requested == 1e-8
    assert info.value.floor > 1e-8
    assert "1e-08 s_max" in msg and "min_resolved=1e-08" in msg
    floor = float(msg.split("floor at ")[1].split(" s_max")[0])
    assert floor == pytest.approx(gram_floor((2000, 100), 512), rel=1e-2, abs=0)
    assert "method='tsqr'" in msg and "method='lapack'" in msg


def test_float64_press_threshold_is_refused_before_reading():
    a = _prescribed(500, 60, np.geomspace(1, 1e-3, 10), seed=7, dtype=np.float64)
    with pytest.raises(GramFloorError, match="float64 Press threshold.*before reading"):
        singular_values(a, method="gram")


def test_flat_spectrum_is_refused_and_auto_falls_back(tmp_path):
    """A Gaussian matrix has ||Q||_F^2 / s_max^2 ~ N: its floor lies above Press."""
    a = np.random.default_rng(8).standard_normal((3000, 400)).astype(np.float32)
    assert gram_floor(a.shape, 512) < press_threshold(1.0, a.shape, "float32")  # a priori ok
    with pytest.raises(GramFloorError, match="Press threshold"):
        singular_values(a, method="gram")
    path = tmp_path / "gauss.npy"
    np.save(path, a)
    res = singular_values(path)  # auto on a file: gram tried, refused, LAPACK (it fits)
    assert res.method == "lapack" and res.floor is None
    assert res.note.startswith("auto: used lapack, as gram's error floor")
    np.testing.assert_allclose(res.values, scipy.linalg.svdvals(a.astype(np.float64)),
                               rtol=1e-5)
    res = singular_values(path, memory_fraction=0.0)  # would not fit: TSQR
    assert res.method == "tsqr" and res.floor is None
    assert res.note.startswith("auto: used tsqr, as gram's error floor")
    assert "Press threshold" in res.note
    np.testing.assert_allclose(res.values, scipy.linalg.svdvals(a.astype(np.float64)),
                               rtol=1e-10)
    assert rank_report(res)["notes"] == [res.note]


def test_auto_picks_gram_for_files_it_resolves(tmp_path):
    a, expected = _around_press(4000, 200, seed=9)
    path = tmp_path / "q.npy"
    np.save(path, a)
    res = singular_values(path)
    assert res.method == "gram" and res.note == "" and res.floor is not None
    assert press_rank(res.values, a.shape, "float32") == expected
    assert singular_values(a).method == "lapack"  # small, in memory: the thesis' LAPACK
    assert singular_values(path, dtype="float32").method == "lapack"  # gram: float64 only
    assert singular_values(path, dtype="float32", memory_fraction=0.0).method == "tsqr"
    a64 = tmp_path / "q64.npy"
    np.save(a64, a.astype(np.float64))
    res64 = singular_values(a64)  # float64 Press threshold: never gram, not even tried
    assert res64.method == "lapack" and res64.note == ""
    assert singular_values(a64, memory_fraction=0.0).method == "tsqr"


# ------------------------------------------------------------------ streaming


def test_streamed_blocks_equal_one_block_and_the_file():
    a, _ = _around_press(2500, 150, seed=10)
    one = singular_values(a, method="gram", block_rows=2500)
    assert one.block_rows == 2500
    for block in (1, 97, 512):
        res = singular_values(a, method="gram", block_rows=block)
        assert res.block_rows == block
        # Both lie within min(sqrt(E), E / sigma_i) of sigma_i (E of the larger depth).
        e = max(_bound(res), _bound(one))
        allowed = 2 * np.minimum(np.sqrt(e), e / np.maximum(one.values, 1e-300))
        assert np.all(np.abs(res.values - one.values) <= allowed)
    assert np.any(res.values != one.values)  # other blocks really sum in another order


def test_file_memmap_wide_and_float16_inputs(tmp_path):
    a, _ = _around_press(300, 1200, seed=11)  # wide: streamed by columns
    path = tmp_path / "wide.npy"
    np.save(path, a)
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    for q in (a, path, np.load(path, mmap_mode="r")):
        res = singular_values(q, method="gram", block_rows=100)
        assert res.shape == (300, 1200) and res.values.shape == (300,)
        assert np.all(np.abs(res.values - ref) <= _allowed(res, ref))
    h = a.astype(np.float16)
    res = singular_values(h, method="gram")
    ref = scipy.linalg.svdvals(h.astype(np.float64))
    assert res.dtype == "float16" and np.all(np.abs(res.values - ref) <= _allowed(res, ref))


def test_zero_matrix_has_zero_floor():
    res = singular_values(np.zeros((50, 10), np.float32), method="gram")
    assert res.floor == 0.0 and np.all(res.values == 0.0)


# ------------------------------------------------------------ formulas, tools.rank


def test_gram_floor_formula():
    assert gram_depth(82430, 512) == 512 + 161 and gram_depth(100, 512) == 101
    d = gram_depth(82430, 512)
    for r in (1.0, 26.0):
        expected = math.sqrt(GRAM_SAFETY * (d * U / (1 - d * U) * r + 10000 * U))
        assert gram_floor((82430, 10000), 512, r) == pytest.approx(expected, rel=1e-14, abs=0)
        assert gram_floor((10000, 82430), 512, r) == gram_floor((82430, 10000), 512, r)
    # PTB test as float32: resolved at r = 1 and at the benchmark's r = 26.
    assert gram_floor((82430, 10000), 512, 26.0) < press_threshold(1.0, (82430, 10000),
                                                                   "float32")


def test_rank_report_marks_thresholds_below_the_floor(tmp_path):
    """A float64 Q computed with a coarser min_resolved: its float64 ranks are not counted."""
    a, expected = _around_press(4000, 200, seed=12)
    res = singular_values(a.astype(np.float64), method="gram", min_resolved=1e-4)
    rep = rank_report(res)
    assert press_threshold(res.s_max, a.shape, "float64") < res.floor
    assert rep["press_rank"] is None and rep["numpy_rank"] is None
    assert rep["floor"] == res.floor
    assert any("Press rank not resolved" in n and "tsqr" in n for n in rep["notes"])
    back = SpectrumResult.load(res.save(tmp_path / "g.npz"))
    assert back.floor == res.floor and back.method == "gram"
    assert rank_report(back)["press_rank"] is None
    ok = rank_report(singular_values(a, method="gram"))
    assert ok["press_rank"] == expected and ok["notes"] == []


def test_cli_method_gram(tmp_path, capsys):
    a, expected = _around_press(4000, 200, seed=13)
    path = tmp_path / "q.npy"
    np.save(path, a)
    out = tmp_path / "r.json"
    assert rank_main([str(path), "--method", "gram", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())["reports"][0]
    assert rep["method"] == "gram" and rep["press_rank"] == expected
    np.save(tmp_path / "q64.npy", a.astype(np.float64))
    capsys.readouterr()
    assert rank_main([str(tmp_path / "q64.npy"), "--method", "gram"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tools.rank: error: method='gram' cannot resolve") and "\n" not in err
    assert "method='tsqr'" in err


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype="float32"), "accumulates in float64"),
    (dict(block_rows=0), "block_rows must be >= 1"),
    (dict(min_resolved=-1e-3), "min_resolved must be a finite number >= 0"),
    (dict(min_resolved=float("nan")), "min_resolved must be a finite number >= 0"),
    (dict(min_resolved="press"), "min_resolved must be a finite number >= 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        singular_values(np.ones((20, 5), np.float32), method="gram", **kwargs)


# ------------------------------------------------------------------ on a GPU


@pytest.fixture
def torch_cpu_as_gpu(monkeypatch):
    """device="gpu" runs `tools.gram_gpu`'s torch code on torch's CPU device."""
    pytest.importorskip("torch")
    import tools.spectrum as spectrum
    monkeypatch.setattr(spectrum, "_gpu_backend", lambda: ("torch", "cpu"))


@pytest.mark.parametrize("m,n,block", [(4000, 200, 300), (150, 3000, 64)])
def test_gpu_code_path_counts_what_lapack_counts_within_the_bound(torch_cpu_as_gpu, m, n,
                                                                  block):
    a, expected = _around_press(m, n, seed=3)
    res = singular_values(a, method="gram", device="gpu", block_rows=block)
    assert res.method == "gram" and res.device == "gpu" and res.compute_dtype == "float64"
    assert press_rank(res.values, a.shape, "float32") == expected
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    assert np.all(np.abs(res.values - ref) <= _allowed(res, ref))
    cpu = singular_values(a, method="gram", block_rows=block)
    assert res.floor == pytest.approx(cpu.floor, rel=1e-6)
    assert np.all(np.abs(res.values - cpu.values) <= 2 * _allowed(res, ref))


def test_gpu_auto_picks_gram_for_files_and_tsqr_where_it_is_refused(torch_cpu_as_gpu,
                                                                    tmp_path):
    a, expected = _around_press(4000, 200, seed=9)
    path = tmp_path / "q.npy"
    np.save(path, a)
    res = singular_values(path, device="gpu")
    assert res.method == "gram" and res.device == "gpu" and res.floor is not None
    assert press_rank(res.values, a.shape, "float32") == expected
    gauss = tmp_path / "gauss.npy"  # a flat spectrum: gram's floor lies above Press
    np.save(gauss, np.random.default_rng(8).standard_normal((3000, 400)).astype(np.float32))
    res = singular_values(gauss, device="gpu")
    assert res.method == "tsqr" and res.note.startswith("auto: used tsqr, as gram's error")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "cupy"])
def test_gpu_gram_equals_the_cpu_gram(backend, monkeypatch):
    import tools.spectrum as spectrum
    if backend == "cupy":
        pytest.importorskip("cupy")
        monkeypatch.setattr(spectrum, "_gpu_backend", lambda: ("cupy", None))
    a, expected = _around_press(20000, 1000, seed=5)
    res = singular_values(a, method="gram", device="gpu")
    cpu = singular_values(a, method="gram")
    assert press_rank(res.values, a.shape, "float32") == expected
    assert res.floor == pytest.approx(cpu.floor, rel=1e-6)
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    assert np.all(np.abs(res.values - ref) <= _allowed(res, ref))
    assert np.all(np.abs(res.values - cpu.values) <= 2 * _allowed(res, ref))


def test_non_finite_row_is_named(tmp_path):
    a, _ = _around_press(2000, 50, seed=14)
    a[1234, 7] = np.nan
    path = tmp_path / "q.npy"
    np.save(path, a)
    with pytest.raises(QMatrixError, match="row 1234 "):
        singular_values(path, method="gram", block_rows=300)
