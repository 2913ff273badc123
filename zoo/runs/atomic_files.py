"""Files replaced whole or not at all: a result file is written under a temporary name in
its own folder, flushed to the disk and renamed over the old one.

A failure at any byte (a full disk, a file-size limit, a Ctrl-C, a kill) therefore leaves
the previous file whole, and every exception but a kill removes the temporary; what a kill
leaves, `remove_orphans` deletes. A reader sees the old file or the new one, never half of
one. The steps, for a target `DIR/best.keras`:

  1. create `DIR/.best.tmp-<random>.keras` (beside the target, so the rename stays on one
     file system; the suffix kept, since Keras wants `.keras` and NumPy `.npz`)
  2. the writer fills it (`model.save`, `np.savez`, text)
  3. `os.fsync` the temporary: its bytes are on the disk before it gets the name
  4. `os.replace` it over the target (atomic on POSIX), then `os.fsync` the folder so the
     rename itself survives a power cut

Only the standard library: `tempfile`'s naming ideas, `os.replace` and `os.fsync` are the
whole technique, and Keras saves a model to a path (not to a file object a library could
wrap), so the atomic step has to be a rename of a finished file anyway. The maintained
libraries for this (atomicwrites was archived by its author in 2022) would add a dependency
for these few lines.

A failed write raises the writer's `OSError` with the temporary removed; the command lines
turn it into one line with `write_failed` (a `WriteError`: what failed, what was kept).

Example:

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.json"
>>> write_json(path, {"test_perplexity": 81.2})
>>> with replacing(path) as tmp:               # any writer that takes a path
...     _ = tmp.write_text('{"test_perplexity": 80.9}')
>>> sorted(p.name for p in path.parent.iterdir())
['metrics.json']
"""

import contextlib
import json
import os
import pathlib
import secrets

from zoo.errors import UserError

TEMPORARY_MARK = ".tmp-"


class WriteError(UserError):
    """A file a command could not write (a full disk, a file-size limit, no permission);
    printed as one line that names the file and what was kept."""


def temporary_name(path):
    """A new temporary name beside `path`: `.<stem>.tmp-<random><suffix>`."""
    path = pathlib.Path(path)
    return path.with_name(f".{path.stem}{TEMPORARY_MARK}{secrets.token_hex(4)}{path.suffix}")


@contextlib.contextmanager
def replacing(path):
    """Context manager: yields a temporary path beside `path` (created empty, mode 0666
    less the umask) for any writer to fill; on a normal exit it is made durable and renamed
    over `path`, on any exception removed (and the exception goes on). `path`'s previous
    content is whole until the rename. An `OSError` about the temporary (or about no file)
    goes on naming `path` in its `filename`, the file the user asked for."""
    path = pathlib.Path(path)
    tmp = temporary_name(path)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as err:
        _raise_naming(err, tmp, path)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError):
            _raise_naming(err, tmp, path)
        raise
    fsync_dir(path.parent)


def _raise_naming(err, tmp, path):
    """Raise `err`, or where it named the temporary `tmp` or no file, the same class, errno
    and message naming the target `path`."""
    if err.errno is None or err.filename not in (None, str(tmp), tmp):
        raise err
    raise type(err)(err.errno, err.strerror, str(path)) from err


def write_bytes(path, data):
    """Replace `path` with `data` (bytes), atomically and durably."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_text(path, text, encoding="utf-8"):
    """Replace `path` with `text`, atomically and durably."""
    write_bytes(path, text.encode(encoding))


def write_json(path, value, indent=2):
    """Replace `path` with `value` as JSON (serialized before the file is touched, so a
    value that is not JSON leaves no trace)."""
    write_text(path, json.dumps(value, indent=indent))


@contextlib.contextmanager
def failing_in_one_line(path, kept, todo=None):
    """Within the block, an `OSError` (a failed write of `path`) becomes `write_failed`'s
    one-line `WriteError` saying what was kept and what to do."""
    try:
        yield
    except OSError as err:
        raise write_failed(path, err, kept, todo) from None


def write_result_json(path, value, kept="the figures are printed above"):
    """`write_json` for a command's result file (`--json`): a failed write is the one-line
    `WriteError` saying what was kept (`kept`)."""
    with failing_in_one_line(path, kept):
        write_json(path, value)


def save_model(model, path):
    """`model.save(path)` (a `.keras` file), atomically and durably: the previous model at
    `path` stays whole and loadable until the new one is complete."""
    with replacing(path) as tmp:
        model.save(tmp)


def fsync_file(path):
    """Flush `path`'s bytes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    """Flush the folder `path` (its renames and new entries) to the disk; a file system
    that cannot (some network ones) is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_orphans(folder, names):
    """Remove the temporaries that a killed writer left beside the files `names` in
    `folder` (those a live writer holds too: call it only where nothing else writes, e.g.
    under the run folder's lock). Returns the names removed."""
    folder = pathlib.Path(folder)
    removed = []
    for name in names:
        target = pathlib.Path(name)
        for path in sorted(folder.glob(f".{target.stem}{TEMPORARY_MARK}*{target.suffix}")):
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path.name)
    return removed


def reason(err):
    """An `OSError`'s cause in words ("File too large", "No space left on device")."""
    if getattr(err, "errno", None):
        return os.strerror(err.errno)
    return " ".join(str(err).split()) or type(err).__name__


def write_failed(path, err, kept, todo=None):
    """The `WriteError` for `path`, whose write failed with `err`: one line with the
    cause, what was kept (`kept`, a phrase) and what to do (`todo`)."""
    line = f"cannot write {path} ({reason(err)}); {kept}"
    return WriteError(f"{line}; {todo}" if todo else line)
