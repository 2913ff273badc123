"""`zoo.runtime.python_gc`: a command line holds collections while it imports, then freezes what its
start-up made, so full collections skip it; a library user's or a test session's process is
left alone."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO

CODE = """
import gc, json, sys, time
from zoo.runtime import python_gc
if "--command-line" in sys.argv:
    python_gc.command_line_process()
python_gc.hold_during_start()
held = not gc.isenabled()
keep = [[i, {"n": i}] for i in range(200_000)]  # long-lived objects, as imports make
tracked = len(gc.get_objects())
first = python_gc.freeze_long_lived()
enabled_after = gc.isenabled()
later = [[i] for i in range(1000)]
second = python_gc.freeze_long_lived()
walked = []
gc.callbacks.append(lambda phase, info: walked.append(len(gc.get_objects()))
                    if phase == "start" and info["generation"] == 2 else None)
garbage = []
garbage.append(garbage)  # a cycle made after the freezes: still collected
del garbage
collected = gc.collect()
print(json.dumps({"held": held, "enabled_after": enabled_after, "first": first, "second": second, "tracked": tracked,
                  "frozen": gc.get_freeze_count(), "counts": python_gc.frozen_counts(),
                  "walked": walked[-1], "collected": collected}))
"""


def _run(*args, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TFLM_GC"}
    environ.update(env, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", CODE, *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_command_line_freezes_its_objects_and_still_collects_new_garbage():
    out = _run("--command-line")
    assert out["held"] and out["enabled_after"]  # no collections until the freeze
    assert out["first"] >= 200_000 and out["first"] >= out["tracked"] - 1000
    assert 1000 <= out["second"] < 10_000  # only what was made after the first call
    assert out["counts"] == [out["first"], out["second"]]
    assert out["frozen"] == out["first"] + out["second"]
    # a full collection walks the objects made since, not the frozen ones
    assert out["walked"] < 20_000
    assert out["collected"] >= 1  # the cycle made after the freezes


def test_other_processes_and_the_opt_out_freeze_nothing():
    for out in (_run(), _run("--command-line", TFLM_GC="default")):
        assert out["first"] == out["second"] == out["frozen"] == 0
        assert not out["held"] and out["enabled_after"]
        assert out["counts"] == []
        assert out["walked"] > 200_000  # a full collection walks everything, as by default
