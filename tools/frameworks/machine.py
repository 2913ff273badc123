"""The machine a measurement ran on, and the memory of the process measuring.

`machine_line()` is the one line every benchmark's results file and the framework
comparison's results give for the machine (CPU model, cores, memory); `peak_rss_mib` and
`current_rss_mib` are what the comparison's workers and the benchmarks read of their own
process's memory.
"""

import os
import platform
import resource


def _proc_field(path, prefix):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model():
    """The CPU model name from /proc/cpuinfo (platform's guess elsewhere)."""
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown CPU"


def memory_gib():
    """Total memory in GiB from /proc/meminfo, or None."""
    total = _proc_field("/proc/meminfo", "MemTotal:")
    return None if total is None else round(int(total.split()[0]) / 2**20, 1)


def machine_line():
    """One line: CPU model, cores, memory."""
    mem = memory_gib()
    return f"{cpu_model()}, {os.cpu_count()} cores" + (f", {mem} GiB" if mem else "")


def peak_rss_mib():
    """This process's peak resident memory so far, MiB (Linux ru_maxrss)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    """This process's resident memory now, MiB (/proc/self/status VmRSS; NaN where there is
    no /proc)."""
    rss = _proc_field("/proc/self/status", "VmRSS:")
    return float("nan") if rss is None else int(rss.split()[0]) / 1024.0
