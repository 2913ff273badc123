"""What machine a measurement ran on (CPU model, memory), and publishing a results table."""

import os
import platform


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


def publish(table, results_path):
    """Print a results table and append it to the results file."""
    print(table)
    with open(results_path, "a") as f:
        f.write("\n" + table)


def peak_rss_mib():
    """This process's peak resident memory so far, MiB (Linux ru_maxrss)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    """This process's resident memory now, MiB (/proc/self/status VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")
