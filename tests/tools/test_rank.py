"""Rank measures (Press, numpy, eps-effective) and the `python -m tools.rank` command line."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO
from tools.rank import (effective_rank, main, numpy_rank, numpy_threshold, press_rank,
                        press_threshold, rank_report)
from tools.spectrum import SpectrumResult, singular_values

F32_EPS = 1.1920928955078125e-07


def _low_rank(m, n, r, seed, dtype):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, r)) @ rng.standard_normal((r, n))).astype(dtype)


def _log_softmax32(logits):
    x = logits.astype(np.float32)
    x = x - x.max(axis=1, keepdims=True)
    return (x - np.log(np.exp(x).sum(axis=1, keepdims=True))).astype(np.float32)


# ------------------------------------------------------------------ thresholds


def test_thresholds_follow_the_formulas():
    assert press_threshold(2.0, (100, 50), "float32") == pytest.approx(
        0.5 * math.sqrt(151) * 2.0 * F32_EPS, rel=1e-15)
    assert numpy_threshold(2.0, (100, 50), "float64") == pytest.approx(
        2.0 * 100 * np.finfo(np.float64).eps, rel=1e-15)


def test_press_and_numpy_rank_count_values_above_their_thresholds():
    shape, smax = (100, 50), 1.0
    tp = press_threshold(smax, shape, "float32")
    tn = numpy_threshold(smax, shape, "float32")
    assert tp < tn
    s = np.array([smax, 0.5, tn * 1.01, tn * 0.99, tp * 1.01, tp * 0.99, 0.0])
    assert press_rank(s, shape, "float32") == 5
    assert numpy_rank(s, shape, "float32") == 3
    assert press_rank(s[::-1], shape, "float32") == 5  # order does not matter
    assert press_rank(s, shape, "float64") == 6  # eps of float64 is far smaller
    assert press_rank([], shape, "float32") == 0


def test_rank_rejects_bad_arguments():
    with pytest.raises(ValueError, match="floating dtype"):
        press_rank([1.0], (2, 2), "int32")
    with pytest.raises(ValueError, match="non-negative"):
        press_rank([1.0, -1.0], (2, 2), "float32")


# ------------------------------------------------------------ known-rank matrices


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", ["lapack", "tsqr"])
def test_known_rank_products(dtype, method):
    m, n, r = 400, 160, 17
    a = _low_rank(m, n, r, seed=1, dtype=dtype)
    res = singular_values(a, method=method, block_rows=128)
    assert press_rank(res.values, a.shape, dtype) == r
    assert numpy_rank(res.values, a.shape, dtype) == r


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_noise_below_threshold_keeps_rank_above_makes_it_full(dtype):
    m, n, r = 400, 160, 12
    a = _low_rank(m, n, r, seed=2, dtype=np.float64)
    s = singular_values(a, method="lapack").values
    thr = press_threshold(s[0], a.shape, dtype)
    rng = np.random.default_rng(3)
    z = rng.standard_normal(a.shape)
    # Largest noise singular value ~ std (sqrt(m) + sqrt(n)); smallest ~ std (sqrt(m) - sqrt(n)).
    small = a + z * (thr / 100 / (math.sqrt(m) + math.sqrt(n)))
    large = a + z * (thr * 100 / (math.sqrt(m) - math.sqrt(n)))
    for mat, expected in ((small, r), (large, n)):
        mat = mat.astype(dtype)
        got = press_rank(singular_values(mat, method="lapack").values, mat.shape, dtype)
        assert got == expected


@pytest.mark.parametrize("method", ["lapack", "tsqr"])
def test_press_rank_of_float32_log_softmax_is_d_plus_2(method):
    """log_softmax(H E^T + 1 b^T): rows lie in span{E's d columns, b, 1}, so rank d + 2.

    Without the bias the rank is d + 1 (the row-wise log-normalizer adds only 1).
    """
    m, n, d = 1200, 300, 16
    rng = np.random.default_rng(4)
    h, e, b = rng.standard_normal((m, d)), rng.standard_normal((n, d)), rng.standard_normal(n)
    logits = 2.0 * (h @ e.T) / math.sqrt(d)
    q = _log_softmax32(logits + b)
    assert q.dtype == np.float32 and np.allclose(np.log(np.exp(q).sum(1)), 0, atol=1e-5)
    res = singular_values(q, method=method)
    assert press_rank(res.values, q.shape, "float32") == d + 2
    q0 = _log_softmax32(logits)
    res0 = singular_values(q0, method=method)
    assert press_rank(res0.values, q0.shape, "float32") == d + 1


# ---------------------------------------------------------------- effective rank


def test_effective_rank_on_hand_made_spectra():
    s = [5.0, 4.0, 3.0, 2.0, 1.0]  # s^2 = 25, 16, 9, 4, 1 (cumulative 25, 41, 50, 54, 55)
    assert effective_rank(s, 0.5) == 2      # need >= 27.5
    assert effective_rank(s, 0.25) == 3     # need >= 41.25
    assert effective_rank(s, 0.1) == 3      # need >= 49.5
    assert effective_rank(s, 0.05) == 4     # need >= 52.25
    assert effective_rank(s, 1e-3) == 5     # need >= 54.945
    assert effective_rank(s, 0.0) == 5
    assert effective_rank(s, 1.0) == 1
    assert effective_rank([1.0, 1.0], 0.5) == 1  # equality counts (>=)
    assert effective_rank([1.0, 2.0, 0.0, 0.0], 0.0) == 2  # sorted first; zeros add nothing
    assert effective_rank(np.zeros(4), 1e-3) == 0


def test_effective_rank_list_and_default():
    # Rank-10 signal plus a floor of 990 values u = 2**-13 (u^2 = 2**-26): all partial sums
    # are exact in float64. Floor energy 990 u^2 ~ 1.48e-5 of a total ~ 10.
    u = 2.0 ** -13
    s = np.r_[np.full(10, 1.0), np.full(990, u)]
    assert effective_rank(s) == {1e-3: 10, 1e-4: 10, 1e-5: 10}
    # eps = 1e-6: need 990 u^2 - 1e-6 (10 + 990 u^2) of floor energy,
    # i.e. ceil(990 - 1e-6 (10 / u^2 + 990)) = ceil(318.91) = 319 floor values.
    assert effective_rank(s, [1e-6]) == {1e-6: 10 + 319}
    assert effective_rank(s, 1e-6) == 329
    with pytest.raises(ValueError, match=r"eps must be in \[0, 1\]"):
        effective_rank(s, 1.5)


def test_rank_report_fields():
    a = _low_rank(300, 100, 7, seed=5, dtype=np.float32)
    rep = rank_report(singular_values(a, method="tsqr"), label="toy")
    assert rep["label"] == "toy" and rep["shape"] == [300, 100] and rep["dtype"] == "float32"
    assert rep["method"] == "tsqr" and rep["exact"] and not rep["approximate"]
    assert rep["press_rank"] == 7 and rep["numpy_rank"] == 7
    assert set(rep["effective_rank"]) == {"1e-03", "1e-04", "1e-05"}
    assert all(1 <= v <= 7 for v in rep["effective_rank"].values())
    assert rep["s_max"] > 0 and json.dumps(rep)
    approx = rank_report(singular_values(a, method="randomized", k=10))
    assert approx["approximate"] and approx["method"] == "randomized"


# --------------------------------------------------------------------- CLI


@pytest.fixture
def two_q(tmp_path):
    a = _low_rank(400, 120, 9, seed=6, dtype=np.float32)
    b = _log_softmax32(np.random.default_rng(7).standard_normal((400, 120)) * 2)
    pa, pb = tmp_path / "softmax.npy", tmp_path / "full.npy"
    np.save(pa, a)
    np.save(pb, b)
    return pa, pb


def test_cli_end_to_end_json_and_plots(tmp_path, two_q):
    pa, pb = two_q
    out_json, prefix = tmp_path / "r.json", tmp_path / "figs" / "ptb"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "tools.rank", str(pa), str(pb), "--labels",
                           "Low", "Full", "--json", str(out_json), "--plot", str(prefix),
                           "--save-spectrum", str(tmp_path / "spectra")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Press rank" in proc.stdout and "Low" in proc.stdout and "Full" in proc.stdout
    reps = json.loads(out_json.read_text())["reports"]
    assert [r["label"] for r in reps] == ["Low", "Full"]
    assert reps[0]["press_rank"] == 9 and reps[1]["press_rank"] == 120
    assert reps[0]["shape"] == [400, 120] and reps[0]["method"] == "lapack"  # fits in RAM
    assert reps[0]["exact"] is True
    for name in ("singular_values", "normalized", "cumulative_normalized", "cumulative_sum"):
        png = tmp_path / "figs" / f"ptb_{name}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Re-threshold a saved spectrum later with other eps values, without Q.
    out2 = tmp_path / "r2.json"
    assert main([ "--spectrum", str(tmp_path / "spectra" / "Low.npz"), "--eps", "0.5",
                 "--json", str(out2)]) == 0
    rep2 = json.loads(out2.read_text())["reports"][0]
    assert rep2["press_rank"] == 9 and set(rep2["effective_rank"]) == {"5e-01"}


def test_cli_randomized_is_labelled_approximate(two_q, capsys):
    assert main([str(two_q[0]), "--method", "randomized", "--k", "20"]) == 0
    out = capsys.readouterr().out
    assert "randomized (APPROXIMATE)" in out and "APPROXIMATE:" in out


@pytest.mark.parametrize("content", ["1d", "int", "nan", "missing", "text"])
def test_cli_bad_file_one_line_error_exit_2(tmp_path, capsys, content):
    path = tmp_path / "bad.npy"
    if content == "1d":
        np.save(path, np.zeros(5, np.float32))
    elif content == "int":
        np.save(path, np.zeros((5, 3), np.int32))
    elif content == "nan":
        a = np.zeros((50, 3), np.float32)
        a[42, 0] = np.nan
        np.save(path, a)
    elif content == "text":
        path.write_text("not numpy")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tools.rank: error:") and "\n" not in err
    if content == "nan":
        assert "row 42" in err
    if content in ("1d", "int"):
        assert "not a 2-D float matrix" in err


def test_cli_label_count_must_match(two_q, capsys):
    assert main([str(two_q[0]), "--labels", "a", "b"]) == 2
    assert "labels" in capsys.readouterr().err


def test_saved_spectrum_loads_as_result(tmp_path):
    res = singular_values(_low_rank(50, 20, 3, 8, np.float64))
    back = SpectrumResult.load(res.save(tmp_path / "x.json"))
    assert press_rank(back.values, back.shape, back.dtype) == 3


# ------------------------------------------------------------- float16 and plots


def test_float16_q_reports_numpy_rank_as_undefined_not_zero(tmp_path, capsys):
    """float16: max(M, N) * eps >= 1 puts numpy's threshold above s_max (rank 0 for every
    matrix); the report says so instead, and the Press rank, still defined, is given."""
    q = _log_softmax32(_low_rank(2000, 60, 8, seed=3, dtype=np.float64)).astype(np.float16)
    path = tmp_path / "q16.npy"
    np.save(path, q)
    spec = singular_values(path)
    report = rank_report(spec)
    assert spec.dtype == "float16" and numpy_rank(spec.values, spec.shape, "float16") == 0
    assert report["numpy_rank"] is None and report["press_rank"] >= 1
    assert any("numpy rank not defined" in note for note in report["notes"])
    assert main([str(path), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "n/a" in out and "export Q as float32" in out
    saved = json.loads((tmp_path / "r.json").read_text())["reports"][0]
    assert saved["numpy_rank"] is None and saved["press_rank"] == report["press_rank"]
    np.save(tmp_path / "q32.npy", q.astype(np.float32))
    as32 = rank_report(singular_values(tmp_path / "q32.npy"))
    assert as32["numpy_rank"] is not None and as32["notes"] == []


@pytest.fixture
def plot_axes(monkeypatch):
    """The axes every `tools.plots` figure draws on, in order."""
    import tools.plots as plots
    axes = []
    original = plots._figure

    def recording_figure():
        fig, ax = original()
        axes.append(ax)
        return fig, ax

    monkeypatch.setattr(plots, "_figure", recording_figure)
    return axes


def test_plots_use_log_axes_and_draw_the_press_threshold(tmp_path, plot_axes):
    import tools.plots as plots
    axes = plot_axes
    q = _log_softmax32(np.random.default_rng(2).standard_normal((300, 40)) @
                       np.random.default_rng(3).standard_normal((40, 90)))
    np.save(tmp_path / "q.npy", q)
    spec = singular_values(tmp_path / "q.npy")
    paths = plots.plot_all([spec], ["softmax"], tmp_path / "p")
    assert set(paths) == {"singular_values", "normalized", "normalized_linear",
                          "cumulative_normalized", "cumulative_sum"}
    by_name = dict(zip(paths, axes))
    rel = press_threshold(1.0, spec.shape, spec.dtype)
    normalized = by_name["normalized"]
    assert normalized.get_yscale() == "log"
    flat = [line.get_ydata() for line in normalized.lines if len(set(line.get_ydata())) == 1]
    assert any(np.isclose(y[0], rel) for y in flat)
    assert by_name["normalized_linear"].get_yscale() == "linear"
    cumulative = by_name["cumulative_normalized"]
    assert cumulative.get_xscale() == "log"
    assert cumulative.get_xlim()[0] <= (spec.values[spec.values > 0].min() / spec.values[0])
    vertical = [line.get_xdata() for line in cumulative.lines if len(set(line.get_xdata())) == 1]
    assert any(np.isclose(x[0], rel) for x in vertical)


def test_plots_of_a_gram_spectrum_draw_its_resolved_floor(tmp_path, plot_axes):
    import tools.plots as plots
    axes = plot_axes
    q = _log_softmax32(np.random.default_rng(4).standard_normal((400, 30)) @
                       np.random.default_rng(5).standard_normal((30, 60)))
    np.save(tmp_path / "q.npy", q)
    for method in ("gram", "tsqr"):
        axes.clear()
        spec = singular_values(tmp_path / "q.npy", method=method)
        plots.plot_normalized([spec], ["m"], tmp_path / f"{method}.png")
        plots.plot_singular_values([spec], ["m"], tmp_path / f"{method}_s.png")
        labels = [[line.get_label() for line in ax.lines] for ax in axes]
        if method == "tsqr":
            assert not any("floor" in label for ls in labels for label in ls)
            continue
        normalized, raw = axes
        floors = [line.get_ydata()[0] for ax, scale in ((normalized, spec.values[0]), (raw, 1.0))
                  for line in ax.lines if "resolved floor" in line.get_label()]
        np.testing.assert_allclose(floors, [spec.floor / spec.values[0], spec.floor])


def test_plots_of_a_gram_spectrum_draw_no_value_under_its_floor(tmp_path, plot_axes):
    # Under gram's floor the values are rounding (square roots of eigenvalues near zero),
    # not singular values of Q: the curves end at the floor.
    import tools.plots as plots
    q = _log_softmax32(np.random.default_rng(4).standard_normal((400, 30)) @
                       np.random.default_rng(5).standard_normal((30, 60)))
    spec = singular_values(q, method="gram")
    assert (spec.values < spec.floor).any()  # the case: values the floor leaves unresolved
    plots.plot_singular_values([spec], ["m"], tmp_path / "s.png")
    plots.plot_normalized([spec], ["m"], tmp_path / "n.png")
    plots.plot_cumulative_normalized([spec], ["m"], tmp_path / "c.png")
    raw, normalized, cumulative = plot_axes
    for ax, floor in ((raw, spec.floor), (normalized, spec.floor / spec.values[0])):
        curve = next(line for line in ax.lines if line.get_label() == "m")
        drawn = np.asarray(curve.get_ydata(), dtype=float)
        assert np.nanmin(drawn) >= floor * (1 - 1e-12)
        assert np.isfinite(drawn).sum() == (spec.values >= spec.floor).sum()
    curve = next(line for line in cumulative.lines if line.get_label() == "m")
    x, pct = np.asarray(curve.get_xdata()), np.asarray(curve.get_ydata(), dtype=float)
    assert np.isnan(pct[x < spec.floor / spec.values[0]]).all()
    assert np.isfinite(pct[x >= spec.floor / spec.values[0]]).all()


def test_a_value_within_the_methods_rounding_of_the_threshold_is_flagged():
    # A float32 Q: float32 LAPACK rounds at the Press threshold's own order, gram resolves
    # it to 1/16; a float64 TSQR counts exactly. (Where gram gives Press rank 4 and lapack 5,
    # the fifth value is such a one: see tools/rank.py, "Which method is right".)
    shape = (1000, 50)
    t = press_threshold(100.0, shape, "float32")
    values = [100.0, 10.0, 1.0, 1.02 * t, 0.5 * t]
    for method, compute, flagged in (("lapack", "float32", True), ("gram", "float64", True),
                                     ("tsqr", "float64", False)):
        spec = SpectrumResult(values=values, method=method, exact=True, dtype="float32",
                              shape=shape, seconds=0.0, compute_dtype=compute)
        report = rank_report(spec)
        assert report["press_rank"] == 4
        notes = [n for n in report["notes"] if n.startswith("Press rank uncertain")]
        assert bool(notes) == flagged, (method, report["notes"])
        if flagged:
            assert "1.0200 x the threshold" in notes[0] and "--method tsqr" in notes[0]
