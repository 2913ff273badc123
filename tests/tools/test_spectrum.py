"""Singular values: TSQR == LAPACK, streaming with bounded memory, inputs and their errors."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.linalg

from tests import peak_rss
from tests.conftest import REPO
from tools.qmatrix_io import QMatrixError, load_q, open_q
from tools.spectrum import SpectrumResult, default_block_rows, singular_values


def _gaussian(m, n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((m, n)).astype(dtype)


@pytest.mark.parametrize("m,n,block", [(50, 40, 7), (5000, 40, 333),
                                       pytest.param(20000, 200, 1999, marks=pytest.mark.slow),
                                       (40, 50, 7), (300, 700, 64)])
def test_tsqr_matches_lapack_float64(m, n, block):
    a = _gaussian(m, n, seed=m + n)
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    res = singular_values(a, method="tsqr", block_rows=block)
    assert res.method == "tsqr" and res.exact and res.compute_dtype == "float64"
    assert res.dtype == "float32" and res.shape == (m, n)
    assert res.values.dtype == np.float64 and res.values.shape == (min(m, n),)
    assert np.all(np.diff(res.values) <= 0)
    np.testing.assert_allclose(res.values, ref, rtol=1e-5)


def test_tsqr_float32_accumulation_is_float32_accurate():
    a = _gaussian(3000, 60, seed=3)
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    res = singular_values(a, method="tsqr", block_rows=500, dtype="float32")
    assert res.compute_dtype == "float32"
    err = np.max(np.abs(res.values - ref)) / ref[0]
    assert 1e-10 < err < 1e-4  # float32 rounding, not float64


def test_lapack_runs_in_the_matrix_dtype():
    a = _gaussian(400, 120, seed=4)
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    res = singular_values(a, method="lapack")
    assert res.method == "lapack" and res.compute_dtype == "float32"
    err = np.max(np.abs(res.values - ref)) / ref[0]
    assert 1e-10 < err < 1e-5
    res64 = singular_values(a, method="lapack", dtype="float64")
    np.testing.assert_allclose(res64.values, ref, rtol=1e-12)
    np.testing.assert_array_equal(a, _gaussian(400, 120, seed=4))  # input untouched


def test_auto_uses_lapack_in_memory_and_for_files_that_fit_else_tsqr(tmp_path):
    a = _gaussian(300, 50, seed=5)
    assert singular_values(a).method == "lapack"
    path = tmp_path / "q.npy"
    np.save(path, a)
    res = singular_values(path)
    assert res.method == "lapack" and res.exact and res.source == str(path)
    assert "gram's error floor" in res.note  # Gaussian: auto tried gram, which refused
    np.testing.assert_allclose(res.values, scipy.linalg.svdvals(a.astype(np.float64)),
                               rtol=1e-6)
    res = singular_values(path, memory_fraction=0.0)  # does not fit: streamed TSQR
    assert res.method == "tsqr" and res.note.startswith("auto: used tsqr")
    np.testing.assert_allclose(res.values, scipy.linalg.svdvals(a.astype(np.float64)),
                               rtol=1e-6)
    assert singular_values(a, memory_fraction=0.0).method == "tsqr"  # in memory, too big


@pytest.mark.parametrize("kind", ["path", "memmap", "memmap-view", "fortran", "float16"])
def test_file_backed_inputs(tmp_path, kind):
    a = _gaussian(1000, 30, seed=6)
    path = tmp_path / "q.npy"
    if kind == "memmap-view":
        np.save(path, a)
        q = np.load(path, mmap_mode="r")[100:700]
        ref = scipy.linalg.svdvals(a[100:700].astype(np.float64))
        for method in ("tsqr", "lapack"):
            np.testing.assert_allclose(singular_values(q, method=method, block_rows=97).values,
                                       ref, rtol=1e-5)
        return
    if kind == "fortran":
        np.save(path, np.asfortranarray(a))
    elif kind == "float16":
        a = a.astype(np.float16)
        np.save(path, a)
    else:
        np.save(path, a)
    q = np.load(path, mmap_mode="r") if kind == "memmap" else path
    ref = scipy.linalg.svdvals(a.astype(np.float64))
    for method in ("tsqr", "lapack"):
        res = singular_values(q, method=method, block_rows=97)
        assert res.dtype == str(a.dtype)
        np.testing.assert_allclose(res.values, ref, rtol=1e-5 if a.dtype != np.float16
                                   else 1e-2)


def test_randomized_is_flagged_approximate():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((800, 20)) @ rng.standard_normal((20, 300))).astype(np.float64)
    res = singular_values(a, method="randomized", k=20, block_rows=128)
    assert res.exact is False and res.approximate and res.method == "randomized"
    assert "APPROXIMATE" in res.method_label and res.k == 20
    assert res.to_dict()["approximate"] is True
    ref = scipy.linalg.svdvals(a)[:20]
    np.testing.assert_allclose(res.values, ref, rtol=1e-8)
    assert singular_values(a).exact  # the default never approximates


def test_randomized_bad_k():
    with pytest.raises(ValueError, match="k must be in"):
        singular_values(_gaussian(30, 10), method="randomized", k=11)


def test_default_block_rows_bounds_memory():
    assert default_block_rows(100) * 100 * 8 <= 32 * 2**20
    assert default_block_rows(10_000) == 1250


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_spectrum_save_load_roundtrip(tmp_path, suffix):
    res = singular_values(_gaussian(200, 40, seed=8), method="tsqr", block_rows=64)
    path = res.save(tmp_path / f"s{suffix}")
    back = SpectrumResult.load(path)
    np.testing.assert_array_equal(back.values, res.values)
    for field in ("method", "exact", "dtype", "shape", "compute_dtype", "block_rows"):
        assert getattr(back, field) == getattr(res, field)
    assert json.loads(res.to_json())["shape"] == [200, 40]


def test_spectrum_save_rejects_unknown_suffix(tmp_path):
    res = singular_values(_gaussian(20, 5))
    with pytest.raises(ValueError, match=r"\.npz or \.json"):
        res.save(tmp_path / "s.txt")


# ----------------------------------------------------------------- bad inputs


def test_one_dimensional_file_is_rejected(tmp_path):
    path = tmp_path / "v.npy"
    np.save(path, np.zeros(10, np.float32))
    with pytest.raises(QMatrixError, match=r"not a 2-D float matrix: got shape \(10,\)"):
        load_q(path)
    with pytest.raises(QMatrixError, match="export_q"):
        singular_values(path)


def test_integer_file_is_rejected(tmp_path):
    path = tmp_path / "i.npy"
    np.save(path, np.zeros((4, 3), np.int64))
    with pytest.raises(QMatrixError, match="dtype int64"):
        load_q(path)


def test_not_a_npy_file(tmp_path):
    path = tmp_path / "q.npy"
    path.write_text("hello")
    with pytest.raises(QMatrixError, match="not a readable .npy"):
        load_q(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_q(tmp_path / "missing.npy")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_row_is_named(tmp_path, bad):
    a = _gaussian(5000, 20, seed=9)
    a[3217, 5] = bad
    a[4000, 1] = bad  # a later bad row must not be the one reported
    path = tmp_path / "q.npy"
    np.save(path, a)
    with pytest.raises(QMatrixError, match="row 3217 "):
        load_q(path, block_rows=1000)
    with pytest.raises(QMatrixError, match="row 3217 "):
        singular_values(path, method="tsqr", block_rows=1000)
    with pytest.raises(QMatrixError, match="row 3217 "):
        singular_values(a, method="lapack")


def test_load_q_returns_read_only_memmap(tmp_path):
    path = tmp_path / "q.npy"
    a = _gaussian(10, 4)
    np.save(path, a)
    q = load_q(path)
    assert isinstance(q, np.memmap) and not q.flags.writeable
    np.testing.assert_array_equal(np.asarray(q), a)
    assert open_q(path).shape == (10, 4)


# --------------------------------------------------------------- bounded memory

# Peak memory of the child itself: ru_maxrss is inherited across fork + exec from the parent
# (pytest with TensorFlow loaded is ~1 GB), so it cannot see a child's own peak. VmHWM in
# /proc/self/status is per process; writing "5" to /proc/self/clear_refs resets it.
_RSS_SNIPPET = """
import json, sys, numpy as np
from tools.spectrum import singular_values
""" + peak_rss.HELPERS + """
singular_values(np.ones((300, 100), np.float32), method="tsqr", block_rows=64)  # warm up
q = sys.argv[1] if sys.argv[2] == "path" else np.load(sys.argv[1], mmap_mode="r")
base = reset_peak()
res = singular_values(q, method="tsqr", block_rows=20000)
growth = status("VmHWM") - base
del q
base = reset_peak()
whole = np.load(sys.argv[1])  # control: the measurement does see a full load
control = status("VmHWM") - base
print(json.dumps({"growth_mib": growth, "control_mib": control, "values": res.values.tolist()}))
"""


@pytest.fixture(scope="module")
def big_npy(tmp_path_factory):
    """A 400,000 x 100 float32 .npy (160 MB) with known singular values.

    A = [c_1 B; c_2 B; ...; c_50 B] with B (8,000 x 100) and distinct c_i, so
    A^T A = (sum c_i^2) B^T B and s(A) = sqrt(sum c_i^2) s(B). A block read at a wrong
    offset or skipped changes the sum; 8,000-row chunks do not line up with 20,000-row blocks.
    """
    chunk, n, copies = 8_000, 100, 50
    # b has <= 14 significant bits and c_i <= 6, so every c_i * b is exact in float32.
    b = np.round(np.random.default_rng(10).standard_normal((chunk, n)) * 1024) / 1024
    b = b.astype(np.float32)
    c = (1.0 + np.arange(copies) / 8.0).astype(np.float32)
    path = tmp_path_factory.mktemp("big") / "big.npy"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(chunk * copies, n))
    for i in range(copies):
        mm[i * chunk:(i + 1) * chunk] = c[i] * b
    mm.flush()
    del mm
    ref = np.sqrt(np.sum(c.astype(np.float64) ** 2)) * scipy.linalg.svdvals(b.astype(np.float64))
    return path, ref


@pytest.mark.parametrize("kind", ["path", "memmap"])
def test_tsqr_streams_with_bounded_memory(big_npy, kind):
    """160 MB on disk, 24 MB per block: the peak RSS growth must stay under 64 MiB."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc to measure a process's own peak memory")
    path, ref = big_npy
    # One BLAS thread: the test measures memory, and a busy 2-core box thrashes with two.
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_RSS_SNIPPET), str(path),
                           kind], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["control_mib"] > 140, out  # loading all 160 MB (152.6 MiB) is visible
    assert out["growth_mib"] < 64, out
    np.testing.assert_allclose(out["values"], ref, rtol=1e-10)


# ------------------------------------------------------------------ devices


@pytest.mark.parametrize("method", ["tsqr", "gram"])
def test_gpu_request_without_gpu_is_a_clear_error(method):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="no GPU is usable"):
        singular_values(_gaussian(20, 5).astype(np.float32), method=method, device="gpu")


def test_torch_tsqr_code_path_on_cpu():
    """The GPU TSQR (torch.linalg.qr folds) checked on the CPU device."""
    pytest.importorskip("torch")
    from tools.spectrum import _tsqr_torch
    for shape in [(700, 30), (30, 90)]:
        a = _gaussian(*shape, seed=11)
        vals = _tsqr_torch(open_q(a), np.dtype(np.float64), 64, False, True, "cpu")
        np.testing.assert_allclose(np.sort(vals)[::-1],
                                   scipy.linalg.svdvals(a.astype(np.float64)), rtol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["tsqr", "lapack"])
def test_gpu_matches_cpu(method):
    a = _gaussian(5000, 300, seed=12)
    ref = singular_values(a, method="tsqr")
    res = singular_values(a, method=method, device="gpu", block_rows=1000)
    assert res.device == "gpu"
    np.testing.assert_allclose(res.values, ref.values, rtol=1e-5 if method == "tsqr"
                               else 1e-4)


def test_progress_bar(capsys):
    res = singular_values(_gaussian(500, 10), method="tsqr", block_rows=100, progress=True)
    assert res.values.shape == (10,)
    captured = capsys.readouterr()
    assert "500/500" in captured.out + captured.err
