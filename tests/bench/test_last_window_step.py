"""bench.reproductions.last_window_step: the last window's rows and the published table."""

import pytest

from bench.reproductions.last_window_step import last_window, summary


def test_the_last_window_is_the_r_positions_before_the_last_target():
    assert last_window(100, 3) == (96, 99)  # inputs 96..98, targets 97..99
    with pytest.raises(ValueError, match="remainder must be in"):
        last_window(100, 99)


def test_the_table_gives_each_rule_its_rate_mean_range_and_change():
    text = summary(100.0, {(3, "main.py"): [120.0, 140.0], (3, "tflm"): [99.0, 99.0]}, 70)
    assert "before the step: 100.0" in text
    assert "| 3 | main.py: lr x 70 / 70 (drawn) | 130.0 | 120.0 | 140.0 | +30.0 % |" in text
    assert "| 3 | tflm: lr x 3 / 70 (real) | 99.0 | 99.0 | 99.0 | -1.0 % |" in text
