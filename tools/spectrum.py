"""Singular values of a log-probability matrix Q_theta (M contexts x N words).

The rank analyses of the softmax bottleneck need only the singular values s_1 >= ... >= s_n
(n = min(M, N)) of Q_theta (Parthiban 2020 thesis §2.3 and §4.3.3; Yang et al. 2018 ICLR §3).
Methods:

- ``"lapack"``: ``scipy.linalg.svdvals`` (LAPACK ``?gesdd``, singular values only) on the
  matrix in memory, computed **in the matrix's dtype**, as the thesis did: a float32 matrix
  goes to ``sgesdd`` in float32 (float16 is promoted to float32, LAPACK has no half
  precision). ``numpy.linalg.svd``, by contrast, runs float32 input in float64 and rounds
  the result to float32 (and needs a float64 copy). Needs the whole matrix in RAM (a path
  or memmap is read into one fresh array, which LAPACK then overwrites: a single copy).
- ``"tsqr"``: exact streamed tall-skinny QR. Rows are read in blocks, never the whole matrix;
  each block B is folded into an n x n upper-triangular factor with
  ``[R; B] = Q' [R'; 0]`` (LAPACK ``?tpqrt``, which exploits the triangle of R), and at the
  end s(Q_theta) = s(R) because Q_theta = (orthogonal) R. Memory O(n^2 + block * n).
  Accumulates in float64 by default (``dtype="float32"`` keeps float32). A wide matrix
  (M < N) is streamed by column blocks, i.e. the rows of Q_theta^T (same singular values).
- ``"randomized"``: Halko, Martinsson & Tropp (2011) range finder with power iterations,
  streamed by row blocks. **Approximate**: the result has ``exact=False`` and every printout
  says APPROXIMATE. Only used when asked for by name.
- ``"auto"``: exact. ``"lapack"`` when Q is an in-memory array and a working copy plus the
  LAPACK workspace takes less than `memory_fraction` (1/4) of the available RAM
  (``MemAvailable`` in /proc/meminfo); ``"tsqr"`` for paths, memmaps and large arrays.

``device="gpu"`` runs the TSQR folds and the final ``svdvals`` (or the LAPACK-style direct
``svdvals``) with torch on CUDA, else CuPy; it raises a clear error when neither sees a GPU.

Example:
    >>> import numpy as np
    >>> a = np.random.default_rng(0).standard_normal((500, 40)).astype(np.float32)
    >>> r = singular_values(a, method="tsqr", block_rows=128)
    >>> r.values.shape, r.exact, r.dtype
    ((40,), True, 'float32')

Reference:
    W. H. Press et al., Numerical Recipes, 3rd ed. (2007), §2.6 (SVD, rank threshold).
    J. Demmel et al., "Communication-optimal parallel and sequential QR and LU
    factorizations", SIAM J. Sci. Comput. 34(1), 2012 (TSQR).
    N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness", SIAM
    Review 53(2), 2011 (randomized SVD).
"""

import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np
import scipy.linalg

from tools.qmatrix_io import QMatrixError, open_q

METHODS = ("auto", "lapack", "tsqr", "randomized")
DEFAULT_BLOCK_BYTES = 32 * 2**20  # at least 32 MiB per TSQR block (in the compute dtype)
TPQRT_PANEL = 64                  # column panel width nb passed to ?tpqrt


@dataclasses.dataclass
class SpectrumResult:
    """Singular values of Q plus what is needed to re-threshold them later.

    Attributes:
        values: 1-D float64 array, descending (n = min(M, N) values; k for randomized).
        method: ``"lapack"``, ``"tsqr"`` or ``"randomized"`` (the method actually used).
        exact: False only for ``"randomized"``.
        dtype: dtype of Q itself (e.g. ``"float32"``); the Press / numpy thresholds use its
            machine epsilon.
        shape: (M, N) of Q.
        seconds: wall-clock time of the computation.
        compute_dtype: dtype the factorization ran in (e.g. ``"float64"`` for TSQR).
        device: ``"cpu"`` or ``"gpu"``.
        source: file name of Q, or ``"array"``.
        block_rows: rows (or columns, for wide Q) per streamed block, when streamed.
        k: number of singular values requested (randomized only).
    """

    values: np.ndarray
    method: str
    exact: bool
    dtype: str
    shape: tuple
    seconds: float
    compute_dtype: str = ""
    device: str = "cpu"
    source: str = ""
    block_rows: int | None = None
    k: int | None = None

    def __post_init__(self):
        self.values = np.asarray(self.values, dtype=np.float64).reshape(-1)
        self.shape = tuple(int(d) for d in self.shape)
        self.dtype = str(np.dtype(self.dtype))

    @property
    def approximate(self):
        return not self.exact

    @property
    def s_max(self):
        return float(self.values[0]) if self.values.size else 0.0

    @property
    def method_label(self):
        """Method name for tables; randomized results read ``randomized (APPROXIMATE)``."""
        return self.method if self.exact else f"{self.method} (APPROXIMATE)"

    def to_dict(self, include_values=True):
        """A JSON-serializable dict (values as a list of floats when `include_values`)."""
        d = {
            "method": self.method, "exact": bool(self.exact), "approximate": not self.exact,
            "dtype": self.dtype, "shape": list(self.shape), "seconds": float(self.seconds),
            "compute_dtype": self.compute_dtype, "device": self.device,
            "source": self.source, "block_rows": self.block_rows, "k": self.k,
            "num_values": int(self.values.size),
        }
        if include_values:
            d["values"] = [float(v) for v in self.values]
        return d

    def to_json(self, include_values=True):
        """The result as a JSON string (see `to_dict`)."""
        return json.dumps(self.to_dict(include_values))

    @classmethod
    def from_dict(cls, d):
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})

    def save(self, path):
        """Save values and metadata: ``.npz`` (values array + JSON metadata) or ``.json``.

        Args:
            path: file name ending in ``.npz`` or ``.json``.
        """
        path = pathlib.Path(path)
        if path.suffix == ".npz":
            np.savez(path, values=self.values, meta=np.array(self.to_json(False)))
        elif path.suffix == ".json":
            path.write_text(self.to_json(True))
        else:
            raise ValueError(f"cannot save a spectrum as {path.name!r}: use a .npz or .json "
                             f"file name")
        return path

    @classmethod
    def load(cls, path):
        """Load a result written by `save` (``.npz`` or ``.json``)."""
        path = pathlib.Path(path)
        if not path.exists():
            raise FileNotFoundError(f"spectrum file {path} does not exist")
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(str(z["meta"]))
                    meta["values"] = np.array(z["values"], dtype=np.float64)
            else:
                meta = json.loads(path.read_text())
            return cls.from_dict(meta)
        except (KeyError, ValueError, TypeError, OSError) as exc:
            raise ValueError(f"{path} is not a spectrum saved by SpectrumResult.save "
                             f"({type(exc).__name__}: {exc}); recompute it with "
                             f"tools.spectrum.singular_values(...).save(path)") from None


def available_memory_bytes():
    """Available RAM in bytes (``MemAvailable`` from /proc/meminfo, else sysconf), or None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_block_rows(n, compute_dtype=np.float64):
    """Rows per TSQR block: max(32 MiB, bytes of R / 8) per block in the compute dtype.

    With n = 10,000 columns in float64 this gives 1,250 rows (100 MB per block next to the
    800 MB triangle R); with n = 100 it gives 41,943 rows (32 MiB).
    """
    item = np.dtype(compute_dtype).itemsize
    budget = max(DEFAULT_BLOCK_BYTES, n * n * item // 8)
    return max(1, budget // (n * item))


def _lapack_dtype(q_dtype, dtype):
    if dtype is not None:
        dt = np.dtype(dtype)
    else:
        dt = np.dtype(np.float32) if q_dtype == np.float16 else np.dtype(q_dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64 for the SVD, got {dt}")
    return dt


def _choose_method(src, dtype, memory_fraction):
    if not src.in_memory:
        return "tsqr"
    cdt = _lapack_dtype(src.dtype, dtype)
    m, n = src.shape
    need = m * n * cdt.itemsize + 2 * min(m, n) ** 2 * cdt.itemsize
    avail = available_memory_bytes()
    if avail is not None and need < memory_fraction * avail:
        return "lapack"
    return "tsqr"


class _Progress:
    """keras.utils.Progbar when available, else a plain line on stderr per update."""

    def __init__(self, target, enabled, unit):
        self.enabled = enabled
        self.bar = None
        self.target = target
        if not enabled:
            return
        try:
            from keras.utils import Progbar
            self.bar = Progbar(target, unit_name=unit)
        except Exception:  # keras missing or broken: fall back to text
            self.bar = None
        self.unit = unit

    def update(self, done):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(done)
        else:
            print(f"{done}/{self.target} {self.unit}s", file=sys.stderr, flush=True)


def _gpu_backend():
    """("torch", "cuda") or ("cupy", None) for a visible GPU, else a RuntimeError."""
    why = []
    try:
        import torch
        if torch.cuda.is_available():
            return "torch", "cuda"
        why.append(f"torch {torch.__version__} sees no CUDA device")
    except ImportError:
        why.append("torch is not installed")
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy", None
        why.append("cupy sees no device")
    except ImportError:
        why.append("cupy is not installed")
    except Exception as exc:  # CUDA runtime errors
        why.append(f"cupy failed: {exc}")
    raise RuntimeError("device='gpu' was requested but no GPU is usable (" + "; ".join(why)
                       + "). Use device=None (CPU) or install a CUDA build of torch or cupy.")


def _normalize_device(device):
    if device in (None, "cpu"):
        return "cpu"
    if device in ("gpu", "cuda"):
        return "gpu"
    raise ValueError(f"device must be None, 'cpu' or 'gpu', got {device!r}")


def _stream(src, block, check_finite):
    """Yield (first index, F-orderable rows of A or A^T) for tall / wide matrices."""
    m, n = src.shape
    if m >= n:
        for s, blk in src.iter_row_blocks(block, check_finite=check_finite):
            yield s + len(blk), blk
    else:
        for j, blk in src.iter_col_blocks(block, check_finite=check_finite):
            yield j + blk.shape[1], blk.T


def _tsqr_cpu(src, cdt, block, progress, check_finite):
    n = min(src.shape)
    tpqrt, = scipy.linalg.get_lapack_funcs(("tpqrt",), dtype=cdt)
    r = np.zeros((n, n), dtype=cdt, order="F")
    nb = min(TPQRT_PANEL, n)
    bar = _Progress(max(src.shape), progress, "row" if src.shape[0] >= n else "column")
    for done, rows in _stream(src, block, check_finite):
        b = np.array(rows, dtype=cdt, order="F", copy=True)  # tpqrt overwrites it
        r, _, _, info = tpqrt(0, nb, r, b, overwrite_a=1, overwrite_b=1)
        if info != 0:
            raise RuntimeError(f"LAPACK ?tpqrt failed with info={info} at row {done}")
        del b
        bar.update(done)
    # r is upper triangular: tpqrt never writes below the diagonal of the zero start.
    return scipy.linalg.svdvals(r, overwrite_a=True, check_finite=False)


def _tsqr_torch(src, cdt, block, progress, check_finite, torch_device):
    import torch
    tdt = torch.float64 if cdt == np.float64 else torch.float32
    n = min(src.shape)
    dev = torch.device(torch_device)
    r = torch.zeros((n, n), dtype=tdt, device=dev)
    bar = _Progress(max(src.shape), progress, "row" if src.shape[0] >= n else "column")
    for done, rows in _stream(src, block, check_finite):
        x = torch.from_numpy(np.ascontiguousarray(rows)).to(device=dev, dtype=tdt)
        r = torch.linalg.qr(torch.cat([r, x]), mode="r").R
        bar.update(done)
    return torch.linalg.svdvals(r).cpu().numpy()


def _tsqr_cupy(src, cdt, block, progress, check_finite):
    import cupy
    n = min(src.shape)
    r = cupy.zeros((n, n), dtype=cdt)
    bar = _Progress(max(src.shape), progress, "row" if src.shape[0] >= n else "column")
    for done, rows in _stream(src, block, check_finite):
        x = cupy.asarray(np.ascontiguousarray(rows), dtype=cdt)
        r = cupy.linalg.qr(cupy.concatenate([r, x]), mode="r")
        bar.update(done)
    return cupy.asnumpy(cupy.linalg.svd(r, compute_uv=False))


def _lapack(src, cdt, device, check_finite):
    if src.in_memory:
        a = src.array
        if check_finite:
            from tools.qmatrix_io import scan_finite
            scan_finite(src)
        overwrite = a.dtype != cdt
        if overwrite:
            a = a.astype(cdt)
    else:
        a = src.read_all(dtype=cdt, check_finite=check_finite)
        overwrite = True
    if device == "gpu":
        backend, _ = _gpu_backend()
        if backend == "torch":
            import torch
            return torch.linalg.svdvals(torch.from_numpy(np.ascontiguousarray(a))
                                        .to("cuda")).cpu().numpy()
        import cupy
        return cupy.asnumpy(cupy.linalg.svd(cupy.asarray(a), compute_uv=False))
    # s(A) = s(A^T): a C-ordered A is a Fortran-ordered A^T, which LAPACK takes without a copy.
    if a.flags.c_contiguous and not a.flags.f_contiguous:
        a = a.T
    return scipy.linalg.svdvals(a, overwrite_a=overwrite, check_finite=False)


def _randomized(src, cdt, block, k, oversample, power_iters, seed, progress, check_finite):
    m, n = src.shape
    ell = min(k + oversample, m, n)
    rng = np.random.default_rng(seed)
    passes = 2 * power_iters + 2
    bar = _Progress(passes * m, progress, "row")
    state = {"done": 0, "check": check_finite}

    def rows():
        for s, blk in src.iter_row_blocks(block, check_finite=state["check"]):
            yield s, np.asarray(blk, dtype=cdt)
            state["done"] += len(blk)
            bar.update(state["done"])
        state["check"] = False  # the first full pass has validated every row

    def a_times(x):  # A @ x, streamed
        y = np.empty((m, x.shape[1]), dtype=cdt)
        for s, blk in rows():
            y[s:s + len(blk)] = blk @ x
        return y

    def at_times(y):  # A^T @ y, streamed
        z = np.zeros((n, y.shape[1]), dtype=cdt)
        for s, blk in rows():
            z += blk.T @ y[s:s + len(blk)]
        return z

    y = a_times(rng.standard_normal((n, ell)).astype(cdt))
    for _ in range(power_iters):
        qy = scipy.linalg.qr(y, mode="economic")[0]
        qz = scipy.linalg.qr(at_times(qy), mode="economic")[0]
        y = a_times(qz)
    qy = scipy.linalg.qr(y, mode="economic")[0]
    b = at_times(qy).T  # (ell x n) = Q^T A
    return scipy.linalg.svdvals(b, check_finite=False)[:k]


def singular_values(q, method="auto", block_rows=None, dtype=None, device=None,
                    progress=False, *, k=None, oversample=10, power_iters=4, seed=0,
                    check_finite=True, memory_fraction=0.25):
    """Singular values s_1 >= ... >= s_n of Q (n = min(M, N)), exact unless randomized.

    Q = U diag(s) V^T (thin SVD, thesis §2.3, eq. 2.25); only s is computed.

    Args:
        q: 2-D float16/32/64 ndarray, ``np.memmap``, or path to a ``.npy`` file (opened with
            ``mmap_mode="r"``, read block by block).
        method: ``"auto"`` (default, exact), ``"lapack"``, ``"tsqr"`` or ``"randomized"``
            (approximate; see the module docstring).
        block_rows: rows per streamed block for ``"tsqr"`` / ``"randomized"`` (columns per
            block for a wide Q with tsqr). Default: `default_block_rows`.
        dtype: compute dtype. Default: the matrix's dtype for ``"lapack"`` (float16 ->
            float32), float64 for ``"tsqr"`` and ``"randomized"``.
        device: None / ``"cpu"``, or ``"gpu"`` (torch CUDA, else CuPy; error if neither).
        progress: show a ``keras.utils.Progbar`` while streaming.
        k: number of singular values for ``"randomized"`` (default min(M, N)).
        oversample, power_iters, seed: randomized range finder settings.
        check_finite: raise `QMatrixError` naming the first row holding NaN / inf.
        memory_fraction: ``"auto"`` picks LAPACK only below this fraction of free RAM.

    Returns:
        `SpectrumResult` (``.values`` float64, descending).

    Example:
        >>> import numpy as np
        >>> q = np.log(np.random.default_rng(1).dirichlet(np.ones(30), size=200))
        >>> res = singular_values(q)                # in memory and small: LAPACK
        >>> res.method, res.values.shape
        ('lapack', (30,))
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    src = open_q(q)
    m, n = src.shape
    dev = _normalize_device(device)
    if method == "auto":
        method = _choose_method(src, dtype, memory_fraction)
    t0 = time.perf_counter()
    used_block = None
    if method == "lapack":
        cdt = _lapack_dtype(src.dtype, dtype)
        values = _lapack(src, cdt, dev, check_finite)
    elif method == "tsqr":
        cdt = np.dtype(np.float64 if dtype is None else dtype)
        if cdt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64 for tsqr, got {cdt}")
        used_block = int(block_rows) if block_rows else default_block_rows(min(m, n), cdt)
        if used_block < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        if dev == "gpu":
            backend, tdev = _gpu_backend()
            if backend == "torch":
                values = _tsqr_torch(src, cdt, used_block, progress, check_finite, tdev)
            else:
                values = _tsqr_cupy(src, cdt, used_block, progress, check_finite)
        else:
            values = _tsqr_cpu(src, cdt, used_block, progress, check_finite)
    else:  # randomized
        if dev == "gpu":
            raise ValueError("method='randomized' runs on the CPU only; use device=None")
        cdt = np.dtype(np.float64 if dtype is None else dtype)
        k = min(m, n) if k is None else int(k)
        if not 1 <= k <= min(m, n):
            raise ValueError(f"k must be in [1, min(M, N)] = [1, {min(m, n)}], got {k}")
        if oversample < 0 or power_iters < 0:
            raise ValueError(f"oversample and power_iters must be >= 0, got {oversample}, "
                             f"{power_iters}")
        used_block = int(block_rows) if block_rows else default_block_rows(n, cdt)
        values = _randomized(src, cdt, used_block, k, int(oversample), int(power_iters),
                             seed, progress, check_finite)
    seconds = time.perf_counter() - t0
    values = np.sort(np.asarray(values, dtype=np.float64))[::-1].copy()
    return SpectrumResult(values=values, method=method, exact=method != "randomized",
                          dtype=str(src.dtype), shape=(m, n), seconds=seconds,
                          compute_dtype=str(cdt), device=dev, source=src.name,
                          block_rows=used_block, k=k if method == "randomized" else None)


__all__ = ["SpectrumResult", "singular_values", "default_block_rows",
           "available_memory_bytes", "METHODS", "QMatrixError"]
