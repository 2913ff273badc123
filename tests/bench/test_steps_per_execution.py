"""bench.training.steps_per_execution: its table from the figures, and its refusals (the run
itself is `bench.gpu_session`'s `spe` stage, checked with `--small`)."""

import pytest

from bench.training import steps_per_execution as bench


def test_the_table_gives_each_size_its_ratio_first_epochs_and_traces():
    results = {"tiny": {"one": 0.0049, "k": 0.0035, "first_one": 3.4, "first_k": 3.2,
                        "diff": 0.0, "traces": [1, 1], "batch": 20, "bptt": 35,
                        "preset": "awd_lstm_ptb", "overrides": ["model.hidden_dim=16"]}}
    rows = [line for line in bench.table(results, 8, 80, 5, "cpu").splitlines()
            if line.startswith("| tiny")]
    assert rows == ["| tiny (awd_lstm_ptb, model.hidden_dim=16; 20 x 35) | 4.90 | 3.50 | "
                    "1.40x | 3.4 / 3.2 | 0.0e+00 | 1 / 1 |"]


def test_k_below_two_and_unknown_sizes_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--k", "1"])
    assert "--k must be 2 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err
