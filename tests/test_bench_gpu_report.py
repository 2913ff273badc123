"""bench/RESULTS_gpu.md's tables are what `bench/bench_gpu.py --report` makes of the results
file the GPU machine wrote (bench/RESULTS_gpu.json): no figure typed by hand."""

import subprocess
import sys

from tests.conftest import REPO


def test_results_gpu_tables_come_from_the_results_file():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--report",
                          str(REPO / "bench" / "RESULTS_gpu.json")], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    published = (REPO / "bench" / "RESULTS_gpu.md").read_text()
    tables = [line for line in out.splitlines() if line.startswith("|")]
    assert len(tables) > 20
    for line in tables:
        assert line in published, line
    assert "| torch | 28.0 (5,253 rows/s) | 7.6 (gram, 6.2) | 2 | 35.6 |" in tables
