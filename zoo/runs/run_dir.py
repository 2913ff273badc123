"""The run directory of a new run: refusing one in use, creating it, undoing a failed start.

The folder is created and locked (`zoo.runs.run_lock`: a second process on it is refused)
before it is looked at; one that holds a finished run (metrics.json) or an unfinished one
(a checkpoint, also one a crash left as `.checkpoint-previous`) is refused, and what a run
killed before its first whole checkpoint left (unfinished writes) is removed. config.json
and vocab.txt are written atomically (`zoo.runs.atomic_files`).

A run that fails before its first epoch checkpoint has nothing worth keeping, so
`NewRunDir` removes what this invocation created (the directory itself, and any parent it
had to create, or only the new entries of a directory that existed before) and lets the
error through. Once a checkpoint is written, `keep()` makes the directory permanent: a later
failure (divergence, a kill, a Ctrl-C) leaves the last good checkpoint for `--resume` or
`--init-from`. A directory that holds a checkpoint is kept even when `keep()` was not reached
(a Ctrl-C just after the first checkpoint was written).
"""

import pathlib
import shutil

from zoo.errors import UserError
from zoo.runs import atomic_files, checkpoint
from zoo.runs.run_lock import RunInUse
from zoo.runs.run_outputs import RESULT_FILES


def prepare_run_dir(out, config, vocabulary, lock):
    """Create and lock (`lock`, a `zoo.runs.run_lock.RunLock` on `out`) a new run
    directory with config.json and vocab.txt; refuse one that another process writes into
    or that holds a finished or an unfinished run."""
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; choose another --out.")
    lock.acquire(create=True)
    if (out / "metrics.json").exists():
        raise UserError(f"{out} already holds a finished run (metrics.json); choose another "
                        "--out so nothing of it is overwritten.")
    if checkpoint.holds_checkpoint(out):
        raise UserError(f"{out} holds an unfinished run; continue it with --resume {out} or "
                        "choose another --out.")
    checkpoint.remove_unusable(out)  # a run killed inside its first checkpoint write
    atomic_files.remove_orphans(out, RESULT_FILES)
    for name, write in (("config.json", lambda path: atomic_files.write_json(path, config)),
                        ("vocab.txt", lambda path: atomic_files.write_text(
                            path, "\n".join(vocabulary) + "\n"))):
        with atomic_files.failing_in_one_line(
                out / name, "the run did not start, so nothing of it is kept",
                "make the folder writable (or free space), then start it again"):
            write(out / name)


class NewRunDir:
    """Context manager: on an exception, remove what was created under `out` unless
    `keep()` was called; never anything that existed when it was entered.

    Example:

    >>> with RunLock(out) as lock, NewRunDir(out) as run_dir:   # doctest: +SKIP
    ...     prepare_run_dir(out, config, vocabulary, lock)
    ...     train_one_epoch_and_checkpoint()
    ...     run_dir.keep()
    """

    def __init__(self, out):
        self.out = pathlib.Path(out)
        self.kept = False

    def __enter__(self):
        top = self.out.absolute()
        while not top.parent.exists() and top.parent != top:
            top = top.parent
        self._top = None if self.out.exists() else top  # the first directory to create
        self._before = set(self.out.iterdir()) if self.out.is_dir() else set()
        return self

    def keep(self):
        """The run has something worth keeping (a checkpoint): never remove it now."""
        self.kept = True

    def __exit__(self, kind, error, traceback):
        if kind is None or self.kept or (self.out / "checkpoint").is_dir():
            return False
        if isinstance(error, RunInUse):  # the folder is another process's run
            return False
        if self._top is not None:
            shutil.rmtree(self._top, ignore_errors=True)
        elif self.out.is_dir():
            for path in set(self.out.iterdir()) - self._before:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        return False
