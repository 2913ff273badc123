"""A process that holds a run folder's lock: the other process of the one-writer tests."""

import subprocess
import sys

from tests.conftest import REPO

HOLD = ("import sys\nfrom zoo.runs.run_lock import RunLock\n"
        "with RunLock(sys.argv[1]) as lock:\n"
        "    lock.acquire(create=True)\n"
        "    print('locked', flush=True)\n"
        "    sys.stdin.read()\n")


def hold_lock(run_dir):
    """A process (no framework: it starts in a fraction of a second) that holds the lock of
    `run_dir` until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc
