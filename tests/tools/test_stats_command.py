"""`python -m tools.stats`: the Wilcoxon rank-sum test between two sets of run folders, with
each set's mean, standard deviation (n - 1) and median, against hand-computed figures; and
its one-line errors."""

import json
import math

import numpy as np
import pytest

from tools import stats


def _runs(tmp_path, name, values, metric="test_perplexity"):
    folders = []
    for i, value in enumerate(values):
        folder = tmp_path / f"{name}{i}"
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps({metric: value, "best_epoch": 3,
                                                         "preset": "x"}))
        folders.append(str(folder))
    return folders


def test_the_command_prints_each_arm_and_the_test(tmp_path, capsys):
    a, b = [57.2, 57.4, 57.1, 57.5, 57.3], [56.1, 56.0, 56.3, 55.9, 56.2]
    out = tmp_path / "out" / "test.json"
    assert stats.main([*_runs(tmp_path, "soft", a), "--vs", *_runs(tmp_path, "gss", b),
                       "--labels", "Softmax", "GSS", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    # by hand: every value of a ranks above every value of b, W_a = 6 + ... + 10 = 40,
    # z = (40 - 5 * 11 / 2) / sqrt(5 * 5 * 11 / 12)
    z = (40 - 27.5) / math.sqrt(25 * 11 / 12)
    p = math.erfc(abs(z) / math.sqrt(2))
    assert f"| Softmax | 5 | {np.mean(a):.2f} +- {np.std(a, ddof=1):.2f} | 57.30 |" in printed
    assert f"| GSS | 5 | {np.mean(b):.2f} +- {np.std(b, ddof=1):.2f} | 56.10 |" in printed
    saved = json.loads(out.read_text())
    assert saved["test"]["statistic"] == pytest.approx(z)
    assert saved["test"]["pvalue"] == pytest.approx(p)
    assert saved["test"]["significant"] and "GSS has the lower median" in printed
    assert saved["arms"][0]["values"] == a and saved["arms"][0]["sd"] == pytest.approx(
        np.std(a, ddof=1))


def test_any_number_of_metrics_json_can_be_compared(tmp_path, capsys):
    a = _runs(tmp_path, "a", [120.0, 121.0], metric="valid_perplexity")
    b = _runs(tmp_path, "b", [119.0, 122.0], metric="valid_perplexity")
    assert stats.main([*a, "--vs", *b, "--metric", "valid_perplexity"]) == 0
    assert "not statistically significant" in capsys.readouterr().out


@pytest.mark.parametrize("case, message", [
    ("no_metrics", "no metrics.json; give folders of finished zoo.train runs"),
    ("unknown_metric", "has no number 'bpc'; --metric takes one of best_epoch, "
                       "test_perplexity"),
    ("one_run", "sample B needs at least 2 values"),
])
def test_bad_input_is_one_line_saying_what_to_do(tmp_path, capsys, case, message):
    a = _runs(tmp_path, "a", [1.0, 2.0])
    b = _runs(tmp_path, "b", [3.0, 4.0])
    argv = {"no_metrics": [*a, "--vs", b[0], str(tmp_path)],
            "unknown_metric": [*a, "--vs", *b, "--metric", "bpc"],
            "one_run": [*a, "--vs", b[0]]}[case]
    assert stats.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
