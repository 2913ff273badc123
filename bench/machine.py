"""Helpers shared by the benchmark scripts."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from tools.machine import cpu_model, machine_line, memory_gib  # noqa: E402,F401


def publish(table, results_path):
    """Print a results table and append it to the results file."""
    print(table)
    with open(results_path, "a") as f:
        f.write("\n" + table)
