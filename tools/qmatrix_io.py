"""Open and validate a log-probability matrix Q_theta stored as ``.npy`` (or held in memory).

Q_theta stacks log P(w | c_t) over M contexts (rows) and N vocabulary words (columns)
(Parthiban 2020 thesis §4.3.3, eq. 4.19; Yang et al. 2018 ICLR §3). For PTB test it is
82,430 x 10,000 (3.3 GB in float32), so this module never needs the whole matrix in memory:
`QSource` hands out blocks of rows (or columns) read straight from the file with ordinary
``readinto`` calls, which keeps the resident memory of the process at one block.

Example:
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "q.npy")
    >>> np.save(path, np.log(np.full((4, 3), 1 / 3, dtype=np.float32)))
    >>> q = load_q(path)            # validated, memory-mapped read-only
    >>> q.shape, str(q.dtype)
    ((4, 3), 'float32')
"""

import mmap
import os
import pathlib

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
EXPORT_HINT = "export one with tools.qmatrix.export_q"
SCAN_BLOCK_BYTES = 32 * 2**20  # block size for validation scans (32 MiB of rows)


class QMatrixError(ValueError):
    """A Q matrix that cannot be analysed: wrong file, shape, dtype or non-finite values."""


def _describe(q):
    if isinstance(q, (str, os.PathLike)):
        return f"file {os.fspath(q)}"
    return "array"


def _find_mmap(array):
    """The `mmap.mmap` behind a numpy memmap (or a view of one), else None."""
    obj = array
    while obj is not None:
        if isinstance(obj, mmap.mmap):
            return obj
        mm = getattr(obj, "_mmap", None)
        if isinstance(mm, mmap.mmap):
            return mm
        obj = getattr(obj, "base", None)
    return None


class QSource:
    """A 2-D float matrix that can be read block by block.

    Build one with `open_q`. Blocks handed out by the iterators are only valid until the next
    block is requested (a buffer may be reused); copy them if you keep them.

    Attributes:
        shape: (M, N).
        dtype: numpy dtype of the stored matrix.
        name: the file path, or ``"array"``.
        in_memory: True for an ordinary in-RAM ndarray (not a memmap, not a path).
    """

    def __init__(self, array, name, path=None, offset=0, in_memory=False):
        self._array = array
        self.name = name
        self.shape = tuple(int(d) for d in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.in_memory = in_memory
        # Plain file reads are possible for a C-ordered matrix that fills its file region.
        self._path = path if (path is not None and array.flags.c_contiguous) else None
        self._offset = int(offset)
        self._mmap = None if in_memory else _find_mmap(array)
        mode = getattr(array, "mode", "r")
        self._can_drop_pages = self._mmap is not None and mode in ("r", "r+", "readonly",
                                                                     "readwrite")

    @property
    def nbytes(self):
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    @property
    def array(self):
        """The underlying ndarray or read-only memmap (touching it all loads it all)."""
        return self._array

    def _drop_pages(self):
        # A memmap's pages count towards the process's resident set once touched; tell the
        # kernel we are done with them (file-backed, so nothing is lost).
        if self._can_drop_pages:
            try:
                self._mmap.madvise(mmap.MADV_DONTNEED)
            except (AttributeError, OSError, ValueError):
                self._can_drop_pages = False

    def _read_rows_into(self, fh, start, out):
        """Fill `out` (C-ordered, self.dtype) with rows start:start+len(out) from the file."""
        row_bytes = self.shape[1] * self.dtype.itemsize
        fh.seek(self._offset + start * row_bytes)
        view = memoryview(out.reshape(-1).view(np.uint8))
        got = 0
        while got < len(view):
            n = fh.readinto(view[got:])
            if not n:
                raise QMatrixError(f"{self.name}: the file ended early (truncated .npy?) while "
                                   f"reading row {start + got // row_bytes}; {EXPORT_HINT}")
            got += n

    def iter_row_blocks(self, block_rows, start=0, stop=None, check_finite=True):
        """Yield ``(first_row, block)`` for consecutive blocks of at most `block_rows` rows.

        Args:
            block_rows: rows per block (>= 1).
            start, stop: row range (default: all rows).
            check_finite: raise `QMatrixError` naming the first row holding NaN or inf.
        """
        block_rows = int(block_rows)
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        m = self.shape[0]
        stop = m if stop is None else min(int(stop), m)
        if self._path is not None:
            buf = np.empty((min(block_rows, max(stop - start, 1)), self.shape[1]), self.dtype)
            with open(self._path, "rb", buffering=0) as fh:
                for s in range(start, stop, block_rows):
                    n = min(block_rows, stop - s)
                    block = buf[:n]
                    self._read_rows_into(fh, s, block)
                    if check_finite:
                        raise_if_not_finite(block, s, self.name)
                    yield s, block
            return
        for s in range(start, stop, block_rows):
            block = self._array[s:min(s + block_rows, stop)]
            if check_finite:
                raise_if_not_finite(block, s, self.name)
            yield s, block
            self._drop_pages()

    def iter_col_blocks(self, block_cols, check_finite=True):
        """Yield ``(first_col, block)`` with block = Q[:, j:j+w] as a C-ordered copy.

        Used for wide matrices (M < N), whose singular values are those of Q^T. Reads are
        strided through a memory map whose pages are dropped after every block.
        """
        block_cols = int(block_cols)
        if block_cols < 1:
            raise ValueError(f"block_cols must be >= 1, got {block_cols}")
        for j in range(0, self.shape[1], block_cols):
            block = np.ascontiguousarray(self._array[:, j:j + block_cols])
            self._drop_pages()
            if check_finite and not np.isfinite(block).all():
                bad = ~np.isfinite(block)
                r, c = np.argwhere(bad)[0]
                raise QMatrixError(
                    f"{self.name}: row {int(r)}, column {j + int(c)} holds {block[r, c]!r}; "
                    f"Q must hold finite log-probabilities. Check the model output for "
                    f"log(0) (use log_softmax) and re-export with tools.qmatrix.export_q")
            yield j, block

    def read_rows(self, start, stop, dtype=None, check_finite=True):
        """A fresh C-ordered in-memory copy of rows start:stop, cast to `dtype` if given."""
        stop = min(int(stop), self.shape[0])
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        out = np.empty((max(stop - start, 0), self.shape[1]), dtype)
        if self._path is not None and dtype == self.dtype:
            with open(self._path, "rb", buffering=0) as fh:
                step = max(1, SCAN_BLOCK_BYTES // max(1, self.shape[1] * dtype.itemsize))
                for s in range(start, stop, step):
                    blk = out[s - start:min(s + step, stop) - start]
                    self._read_rows_into(fh, s, blk)
                    if check_finite:
                        raise_if_not_finite(blk, s, self.name)
            return out
        for s, block in self.iter_row_blocks(scan_block_rows(self.shape[1], self.dtype),
                                             start, stop, check_finite):
            out[s - start:s - start + len(block)] = block
        return out

    def read_all(self, dtype=None, check_finite=True):
        """The whole matrix as a fresh C-ordered in-memory array (M * N * itemsize bytes)."""
        return self.read_rows(0, self.shape[0], dtype=dtype, check_finite=check_finite)


def scan_block_rows(n_cols, dtype, budget_bytes=SCAN_BLOCK_BYTES):
    """Rows per block so that one block takes about `budget_bytes`."""
    return max(1, int(budget_bytes) // max(1, int(n_cols) * np.dtype(dtype).itemsize))


def raise_if_not_finite(block, first_row, name="array"):
    """Raise `QMatrixError` naming the first row of `block` that holds NaN or inf.

    Args:
        block: 2-D array of consecutive rows of Q.
        first_row: index in Q of ``block[0]``.
        name: file name (or ``"array"``) for the message.
    """
    if np.isfinite(block).all():
        return
    bad = ~np.isfinite(block)
    r, c = np.argwhere(bad)[0]
    value = block[r, c]
    raise QMatrixError(
        f"{name}: row {first_row + int(r)} is the first row with a non-finite value "
        f"({value!r} in column {int(c)}); Q must hold finite log-probabilities. Check the "
        f"model output for log(0) (use log_softmax) and re-export with tools.qmatrix.export_q")


def _check_matrix(arr, what):
    if arr.ndim != 2 or arr.dtype not in FLOAT_DTYPES:
        raise QMatrixError(
            f"{what} is not a 2-D float matrix: got shape {tuple(arr.shape)}, dtype "
            f"{arr.dtype} (need 2-D float16/float32/float64, rows = contexts, columns = "
            f"vocabulary); {EXPORT_HINT}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise QMatrixError(f"{what} is empty: shape {tuple(arr.shape)}; {EXPORT_HINT}")


def open_q(q):
    """Wrap a Q matrix for block-wise reading, checking its shape and dtype (not its values).

    Args:
        q: a 2-D float ndarray, a ``np.memmap``, a `QSource`, or a path to a ``.npy`` file
            (opened with ``mmap_mode="r"``; nothing is read until blocks are requested).

    Returns:
        `QSource`.

    Raises:
        FileNotFoundError: the path does not exist.
        QMatrixError: not a ``.npy`` file, not 2-D, not float16/32/64, or empty.
    """
    if isinstance(q, QSource):
        return q
    if isinstance(q, (str, os.PathLike)):
        path = pathlib.Path(q)
        what = f"file {path}"
        if not path.exists():
            raise FileNotFoundError(f"{what} does not exist; {EXPORT_HINT}")
        if path.is_dir():
            raise QMatrixError(f"{what} is a directory, not a .npy matrix; {EXPORT_HINT}")
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as exc:  # numpy raises several types for a bad file
            raise QMatrixError(f"{what} is not a readable .npy array ({type(exc).__name__}: "
                               f"{exc}); {EXPORT_HINT}") from None
        if not isinstance(arr, np.ndarray):  # .npz archives load as NpzFile
            raise QMatrixError(f"{what} is a .npz archive, not a single .npy matrix; "
                               f"{EXPORT_HINT}")
        _check_matrix(arr, what)
        offset = getattr(arr, "offset", None)
        return QSource(arr, str(path), path=str(path) if offset is not None else None,
                       offset=offset or 0)
    if isinstance(q, np.memmap):
        _check_matrix(q, "memmap")
        path = getattr(q, "filename", None)
        # Only a memmap built directly on the mapping starts at `q.offset` in the file; a
        # view (slice) inherits its parent's filename and offset, so it is read by slicing.
        whole = isinstance(q.base, mmap.mmap)
        return QSource(q, str(path) if path else "memmap",
                       path=path if (path and whole) else None,
                       offset=getattr(q, "offset", 0) or 0)
    if isinstance(q, np.ndarray):
        _check_matrix(q, "array")
        return QSource(q, "array", in_memory=True)
    raise QMatrixError(f"expected a 2-D float numpy array or a path to a .npy file, got "
                       f"{type(q).__name__}; {EXPORT_HINT}")


def scan_finite(q, block_rows=None):
    """Scan Q block by block and raise `QMatrixError` naming the first non-finite row.

    Memory stays at one block (about 32 MiB by default) whatever the size of Q.
    """
    src = open_q(q)
    rows = block_rows or scan_block_rows(src.shape[1], src.dtype)
    for _ in src.iter_row_blocks(rows, check_finite=True):
        pass


def load_q(path_or_array, check_finite=True, block_rows=None):
    """Open a Q matrix and validate it: 2-D, float16/32/64, non-empty, all values finite.

    Args:
        path_or_array: path to a ``.npy`` file, or an ndarray / memmap.
        check_finite: scan every row for NaN / inf (block by block, bounded memory).
        block_rows: rows per scan block (default: about 32 MiB per block).

    Returns:
        The matrix: a read-only ``np.memmap`` for a path, else the array itself.

    Raises:
        FileNotFoundError, QMatrixError: with what was wrong and how to fix it, e.g.
        ``file q.npy is not a 2-D float matrix: got shape (10,), dtype float32 ...``.
    """
    src = open_q(path_or_array)
    if check_finite:
        rows = block_rows or scan_block_rows(src.shape[1], src.dtype)
        for _ in src.iter_row_blocks(rows, check_finite=True):
            pass
    return src.array
