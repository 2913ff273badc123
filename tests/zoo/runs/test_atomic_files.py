"""zoo.runs.atomic_files: a failure at any byte (a file-size limit, a full disk, a Ctrl-C,
a kill) leaves the previous file whole, and no temporary but a killed writer's."""

import errno
import json
import os
import resource
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from zoo.runs import atomic_files

OLD = {"test_perplexity": 81.25, "history": [{"epoch": 1}]}
NEW = {"test_perplexity": 79.5, "history": [{"epoch": e} for e in range(1, 40)]}


def _limited(limit):
    """preexec_fn: files of at most `limit` bytes; a longer write raises EFBIG (SIGXFSZ
    ignored, as CPython does at start-up), it does not kill the process."""
    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_files


def _write_in_process(path, value, limit):
    code = ("import json, sys\nfrom zoo.runs import atomic_files\n"
            "try:\n"
            "    atomic_files.write_json(sys.argv[1], json.loads(sys.argv[2]))\n"
            "except OSError as err:\n"
            "    print(err.errno, end='')\n"
            "    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, str(path), json.dumps(value)],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          preexec_fn=_limited(limit))


def test_a_file_size_limit_at_any_byte_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_files.write_json(path, OLD)
    before = path.read_bytes()
    size = len(json.dumps(NEW, indent=2))
    for limit in (0, 1, size // 3, size - 1):
        proc = _write_in_process(path, NEW, limit)
        assert proc.returncode == 3 and proc.stdout == str(errno.EFBIG), proc.stderr
        assert path.read_bytes() == before, f"limit {limit}: the old file was touched"
        assert sorted(os.listdir(tmp_path)) == ["metrics.json"], f"limit {limit}"
    proc = _write_in_process(path, NEW, size)  # room enough: replaced
    assert proc.returncode == 0, proc.stderr
    assert json.loads(path.read_text()) == NEW
    assert sorted(os.listdir(tmp_path)) == ["metrics.json"]


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     KeyboardInterrupt()])
def test_a_writer_failing_at_every_byte_leaves_the_previous_file(tmp_path, failure):
    path = tmp_path / "vocab.txt"
    atomic_files.write_text(path, "old\n")
    data = ("a b c\n" * 20).encode()
    for cut in range(len(data)):
        with pytest.raises(type(failure)):
            with atomic_files.replacing(path) as tmp:
                with open(tmp, "wb") as f:
                    f.write(data[:cut])
                raise failure
        assert path.read_text() == "old\n"
        assert os.listdir(tmp_path) == ["vocab.txt"], cut


def test_a_kill_mid_write_leaves_the_old_file_and_an_orphan_that_is_removed(tmp_path):
    path = tmp_path / "best.keras"
    path.write_bytes(b"old model")
    (tmp_path / "notes.best.tmp.txt").write_text("not a temporary of ours")
    code = ("import os, sys\nfrom zoo.runs import atomic_files\n"
            "with atomic_files.replacing(sys.argv[1]) as tmp:\n"
            "    tmp.write_bytes(b'half a mod')\n"
            "    os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == b"old model"
    orphans = [p.name for p in tmp_path.iterdir() if p.name.startswith(".best.tmp-")]
    assert len(orphans) == 1 and orphans[0].endswith(".keras")
    assert atomic_files.remove_orphans(tmp_path, ["best.keras", "final.keras"]) == orphans
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "notes.best.tmp.txt"]


def test_a_model_save_that_fails_keeps_the_previous_model_loadable(tmp_path):
    import keras
    import numpy as np
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "best.keras"
    atomic_files.save_model(model, path)
    saved = [w.copy() for w in model.get_weights()]
    model.set_weights([w + 1 for w in saved])

    class FullDisk:
        def save(self, tmp):  # Keras writes half the zip, then the disk is full
            model.save(tmp)
            with open(tmp, "r+b") as f:
                f.truncate(os.path.getsize(tmp) // 2)
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_files.save_model(FullDisk(), path)
    assert os.listdir(tmp_path) == ["best.keras"]
    for kept, weights in zip(keras.saving.load_model(path).get_weights(), saved):
        np.testing.assert_array_equal(kept, weights)
    atomic_files.save_model(model, path)  # and a whole save replaces it
    np.testing.assert_array_equal(keras.saving.load_model(path).get_weights()[1], saved[1] + 1)


def test_new_files_follow_the_umask_and_a_value_that_is_not_json_leaves_no_trace(tmp_path):
    umask = os.umask(0o022)
    try:
        atomic_files.write_text(tmp_path / "config.json", "{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o644
    with pytest.raises(TypeError):
        atomic_files.write_json(tmp_path / "config.json", {"x": object()})
    assert os.listdir(tmp_path) == ["config.json"]
    assert (tmp_path / "config.json").read_text() == "{}"


def test_a_failed_write_is_one_line_naming_the_file_the_cause_and_what_was_kept(tmp_path):
    err = atomic_files.write_failed(tmp_path / "metrics.json",
                                    OSError(errno.EFBIG, "File too large"),
                                    "the previous metrics.json is intact", "free space")
    assert str(err) == (f"cannot write {tmp_path / 'metrics.json'} (File too large); the "
                        "previous metrics.json is intact; free space")
    assert isinstance(err, atomic_files.WriteError)
