"""What a command line says when the user has to fix something: one line, exit status 2.

Every command's `main` is wrapped in `one_line_errors(prog)`: a `zoo.errors.UserError` (and
its `ConfigError`), or an `OSError` (a missing folder, a file in the way, no permission, a
full disk or a file-size limit) that escapes it, is printed as

    <prog>: error: <what was wrong and what to do>

on one line of stderr, and `main` returns 2; never a traceback. Anything else is a bug and
keeps its traceback. `check_output_dir` / `check_output_file` check where a command will
write before it computes anything, so that a result is not lost to a bad path at the end.
"""

import errno
import functools
import os
import pathlib
import sys

from zoo.errors import UserError

EXIT_USER_ERROR = 2

# What to do about an OSError, by errno.
_ADVICE = {
    errno.ENOENT: "a folder on the path does not exist",
    errno.ENOTDIR: "a file is in the way where a folder should be",
    errno.EISDIR: "it is a folder; name a file",
    errno.EACCES: "permission denied; choose a place you can write to",
    errno.EPERM: "not permitted; choose a place you can write to",
    errno.EROFS: "the file system is read-only; choose another place",
    errno.ENOSPC: "the disk is full; free space and run the command again",
    errno.EFBIG: "the file-size limit was reached; raise it (ulimit -f) or free space",
    errno.EDQUOT: "the disk quota is exhausted; free space and run the command again",
}


def one_line(text):
    """`text` on a single line (a message with line breaks joined by "; ")."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe(err):
    """The one-line message of a `UserError` or an `OSError` (its file and what to do)."""
    if isinstance(err, OSError) and not isinstance(err, UserError):
        where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
        text = (f"{where}: {err.strerror or type(err).__name__}" if where
                else str(err) or type(err).__name__)
        advice = _ADVICE.get(err.errno)
        return one_line(f"{text} ({advice})" if advice else text)
    return one_line(err)


def report(prog, err):
    """Print `err` as `prog: error: ...` on one line of stderr; returns exit status 2."""
    print(f"{prog}: error: {describe(err)}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


def one_line_errors(prog):
    """Decorator for a command's `main(argv=None)`: a `UserError` or `OSError` that escapes
    it is `report`ed (one line, exit status 2) instead of a traceback."""
    def wrap(main):
        @functools.wraps(main)
        def guarded(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except (UserError, OSError) as err:
                return report(prog, err)
        return guarded
    return wrap


def _writable_ancestor(folder, flag, shown):
    """Raise `UserError` unless the nearest existing ancestor of `folder` (itself included)
    is a folder this process may write into; `shown` is the path the message names."""
    existing = pathlib.Path(folder).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {shown}: {existing} is a file, not a folder; choose another "
                        "place.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown}: cannot write into {existing} (permission denied); "
                        "choose a folder you can write to.")


def check_output_dir(path, flag):
    """Raise `UserError` unless the folder `path` exists or can be made: it is not a file,
    and its nearest existing ancestor is a folder this process may write into. `flag`
    names the option in the message ("--out")."""
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: a file is there; name a folder.")
    _writable_ancestor(path, flag, path)


def check_output_file(path, flag, make_folders=False):
    """Raise `UserError` unless the file `path` can be written: it is not a folder, and its
    folder exists (or, with `make_folders`, can be made) and is writable. `flag` names the
    option ("--json")."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path}: it is a folder; name a file.")
    folder = path.absolute().parent
    if not make_folders and not folder.exists():
        raise UserError(f"{flag} {path}: there is no folder {folder}; create it first or "
                        "name a file in an existing folder.")
    _writable_ancestor(folder, flag, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path}: the file is read-only (permission denied); choose "
                        "another name.")
