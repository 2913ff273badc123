"""bench/analysis/results/gpu_rank_tools.md's tables are what `python -m
bench.analysis.gpu_rank_tools --report` makes of the results file the GPU machine wrote
(bench/analysis/results/gpu_rank_tools.json): no figure typed by hand."""

import subprocess
import sys

from tests.conftest import REPO


def test_results_gpu_tables_come_from_the_results_file():
    results = REPO / "bench" / "analysis" / "results"
    out = subprocess.run([sys.executable, "-m", "bench.analysis.gpu_rank_tools", "--report",
                          str(results / "gpu_rank_tools.json")], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    published = (results / "gpu_rank_tools.md").read_text()
    tables = [line for line in out.splitlines() if line.startswith("|")]
    assert len(tables) > 20
    for line in tables:
        assert line in published, line
    assert "| torch | 28.0 (5,253 rows/s) | 7.6 (gram, 6.2) | 2 | 35.6 |" in tables
