"""The run directory of a new run: refusing one in use, creating it, undoing a failed start.

A run that fails before its first epoch checkpoint has nothing worth keeping, so
`NewRunDir` removes what this invocation created (the directory itself, and any parent it
had to create, or only the new entries of a directory that existed before) and lets the
error through. Once a checkpoint is written, `keep()` makes the directory permanent: a later
failure (divergence, a kill, a Ctrl-C) leaves the last good checkpoint for `--resume` or
`--init-from`. A directory that holds a checkpoint is kept even when `keep()` was not reached
(a Ctrl-C just after the first checkpoint was written).
"""

import json
import pathlib
import shutil

from zoo.errors import UserError


def prepare_run_dir(out, config, vocabulary):
    """Create a new run directory with config.json and vocab.txt; refuse one that holds a
    finished or an unfinished run."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; choose another --out.")
    if (out / "metrics.json").exists():
        raise UserError(f"{out} already holds a finished run (metrics.json); choose another "
                        "--out so nothing of it is overwritten.")
    if (out / "checkpoint").exists():
        raise UserError(f"{out} holds an unfinished run; continue it with --resume {out} or "
                        "choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")


class NewRunDir:
    """Context manager: on an exception, remove what was created under `out` unless
    `keep()` was called; never anything that existed when it was entered.

    Example:

    >>> with NewRunDir(out) as run_dir:                     # doctest: +SKIP
    ...     prepare_run_dir(out, config, vocabulary)
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
        if self._top is not None:
            shutil.rmtree(self._top, ignore_errors=True)
        elif self.out.is_dir():
            for path in set(self.out.iterdir()) - self._before:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        return False
