"""Machine description shared by the benchmark scripts."""

import os
import platform


def cpu_model():
    """The CPU model name from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_line():
    return f"{cpu_model()}, {os.cpu_count()} cores"


def publish(table, results_path):
    """Print a results table and append it to the results file."""
    print(table)
    with open(results_path, "a") as f:
        f.write("\n" + table)
