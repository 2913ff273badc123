"""One writer per run folder: an OS file lock on `RUN_DIR/.lock`.

`python -m zoo.train` holds it for the whole run (a new run, `--resume`, `--finetune`'s
`--out`), so a second process on the same folder is refused at once, with one line naming
the first one: its pid, host and command, which the lock file holds. The lock is the
kernel's (`fcntl.flock`), not the file: the kernel drops it when its holder exits in any
way (a kill -9 too), so a lock file that a dead process left blocks nothing. On Linux, NFS
maps `flock` to the server's byte-range locks, so the lock holds across hosts too.

Example:

>>> with RunLock(run_dir) as lock:                     # doctest: +SKIP
...     lock.acquire(create=True)     # RunInUse when another process holds it
...     train_into(run_dir)
"""

import fcntl
import os
import pathlib
import shlex
import socket
import sys

from zoo.errors import UserError

LOCK_FILE = ".lock"


class RunInUse(UserError):
    """Another live process holds the run folder's lock."""


class RunLock:
    """Context manager around the lock of `run_dir`: `acquire()` takes it (at most once);
    leaving the `with` releases it and removes the lock file."""

    def __init__(self, run_dir):
        self.run_dir = pathlib.Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd = None

    @property
    def held(self):
        return self._fd is not None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        self.release()
        return False

    def acquire(self, create=False):
        """Take the lock; `create` makes the folder first (a new run's), else a missing
        folder is left to the caller's own message. Raises `RunInUse` naming the holder,
        or `UserError` when the folder cannot hold a lock file (read-only, no permission)."""
        if self.held:
            return
        if create:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise UserError(f"cannot create the run folder {self.run_dir} "
                                f"({os.strerror(err.errno) if err.errno else err}); choose "
                                "another --out.") from err
        elif not self.run_dir.is_dir():
            return
        for _ in range(10):  # another process may replace the file between open and lock
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                raise UserError(f"cannot lock the run folder {self.run_dir}: cannot create "
                                f"{self.path} ({os.strerror(err.errno) if err.errno else err})"
                                "; a run writes into its folder, so it must be writable."
                                ) from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise RunInUse(f"{self.run_dir} is in use: {holder} writes into it; a run "
                               "folder takes one process at a time: wait for that one to "
                               "end (or stop it), or write into another folder.") from None
            if _same_file(fd, self.path):  # not a file its last holder removed meanwhile
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n{socket.gethostname()}\n{_command()}\n"
                         .encode("utf-8", "replace"))
                self._fd = fd
                return
            os.close(fd)
        raise RunInUse(f"cannot lock {self.run_dir}: its lock file keeps being replaced by "
                       "other processes; wait for them to end.")

    def release(self):
        """Release the lock and remove the lock file (only if it is still this lock's)."""
        if self._fd is None:
            return
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self._fd)  # the kernel drops the lock here
            self._fd = None


def _same_file(fd, path):
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _command():
    """This process's command line, on one line."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return " ".join(shlex.join(argv).split())


def _read(fd):
    """Who holds the lock, in words, from the lock file's pid, host and command."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        lines = os.read(fd, 4096).decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    if not lines or not lines[0].strip().isdigit():
        return "another process"
    host = f" on {lines[1].strip()}" if len(lines) > 1 and lines[1].strip() else ""
    command = lines[2].strip() if len(lines) > 2 else ""
    command = f" ({command[:197]}...)" if len(command) > 200 else f" ({command})" if command else ""
    return f"process {lines[0].strip()}{host}{command}"
