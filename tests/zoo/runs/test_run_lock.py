"""zoo.runs.run_lock: one process per run folder; the kernel's lock, so a dead holder's
file blocks nothing."""

import os
import signal

import pytest

from tests.zoo.runs.lock_holder import hold_lock
from zoo.errors import UserError
from zoo.runs.run_lock import LOCK_FILE, RunInUse, RunLock


def test_a_second_process_is_refused_in_one_line_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_lock(run_dir)
    try:
        with RunLock(run_dir) as lock, pytest.raises(RunInUse) as refused:
            lock.acquire()
        message = str(refused.value)
        assert len(message.splitlines()) == 1
        assert f"{run_dir} is in use: process {holder.pid} on " in message, message
        assert " -c " in message, message  # the holder's command line
        assert not lock.held
    finally:
        holder.communicate("")
    assert not (run_dir / LOCK_FILE).exists(), "the holder removes its lock file"


def test_a_lock_file_left_by_a_killed_process_is_no_lock(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_lock(run_dir)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    stale = (run_dir / LOCK_FILE).read_text()
    assert stale.startswith(f"{holder.pid}\n")  # a kill -9 removes nothing
    with RunLock(run_dir) as lock:
        lock.acquire()
        assert lock.held
        assert (run_dir / LOCK_FILE).read_text().startswith(f"{os.getpid()}\n")
    assert not (run_dir / LOCK_FILE).exists()


def test_one_process_holds_one_lock_at_a_time_and_releases_only_its_own_file(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    with pytest.raises(RunInUse, match=f"process {os.getpid()}"):
        second.acquire()  # flock: another open file description conflicts, same process too
    first.release()
    second.acquire()
    (tmp_path / LOCK_FILE).unlink()  # someone removed it and another process made a new one
    (tmp_path / LOCK_FILE).write_text("12345\nhost\ncommand\n")
    second.release()
    assert (tmp_path / LOCK_FILE).read_text() == "12345\nhost\ncommand\n"


def test_a_missing_folder_is_created_only_for_a_new_run(tmp_path):
    with RunLock(tmp_path / "absent") as lock:
        lock.acquire()  # --resume of a folder that is not there: its own message follows
        assert not lock.held and not (tmp_path / "absent").exists()
        lock.acquire(create=True)
        assert lock.held and (tmp_path / "absent" / LOCK_FILE).is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with RunLock(tmp_path / "run") as lock, pytest.raises(UserError) as err:
            lock.acquire(create=True)
    finally:
        tmp_path.chmod(0o700)
    assert len(str(err.value).splitlines()) == 1 and "choose another --out" in str(err.value)
