"""`python -m zoo.evaluate` when its record cannot be written: one line, exit 2, the
earlier evaluations in evaluations.json whole, the result still printed."""

import errno
import json
import os
import shutil

from tests.conftest import without_native_log_lines
from zoo import evaluate as ev
from zoo.runs import atomic_files


def test_a_failed_record_keeps_the_earlier_evaluations(tiny_run, tmp_path, capsys,
                                                       monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert ev.main([str(run), "--quiet"]) == 0
    capsys.readouterr()
    before = (run / ev.EVALUATIONS_FILE).read_bytes()
    replace = os.replace

    def full_disk(src, dst):
        if os.path.basename(dst) == ev.EVALUATIONS_FILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", full_disk)
    assert ev.main([str(run), "--split", "valid", "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("valid perplexity "), "the result is printed, not lost"
    err = without_native_log_lines(captured.err).strip()
    assert err == (f"zoo.evaluate: error: cannot write {run / ev.EVALUATIONS_FILE} (No space "
                   "left on device); the 1 earlier evaluations in it are intact; the result "
                   "is the line above; free space (or make the folder writable) and evaluate "
                   "again to record it"), err
    assert (run / ev.EVALUATIONS_FILE).read_bytes() == before
    assert len(json.loads(before)) == 1
    assert not [p for p in run.iterdir() if atomic_files.TEMPORARY_MARK in p.name]
