"""Helpers a test's subprocess snippet starts with to measure its own peak memory (Linux)."""

# `status("VmHWM")` is the peak resident set in MiB since the last `reset_peak()`, which
# returns the resident set at the reset (/proc/self/clear_refs "5" resets the high-water mark).
HELPERS = """
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0

def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return status("VmRSS")
"""
