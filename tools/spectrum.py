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
- ``"gram"``: streamed Gram matrix, exact to the bound below. G = Q^T Q is accumulated in
  float64 over row blocks of b rows (BLAS-3 ``dsyrk`` / ``dgemm``: M N^2 flops, half of
  TSQR's 2 M N^2), then s_i = sqrt(max(lambda_i(G), 0)) with ``scipy.linalg.eigh``
  (eigenvalues only, driver ``evd``). Memory O(N^2 + b N), like TSQR. It resolves singular
  values down to a floor s_floor (`gram_floor`), not to zero, and refuses
  (`GramFloorError`) when asked for a threshold below it; the default threshold is the
  Press threshold of Q's dtype, which it resolves for float16 / float32 matrices whose
  energy is not spread flat (see the bound), never for float64 ones.
- ``"randomized"``: Halko, Martinsson & Tropp (2011) range finder with power iterations,
  streamed by row blocks. **Approximate**: the result has ``exact=False`` and every printout
  says APPROXIMATE. Only used when asked for by name.
- ``"auto"``: exact. ``"lapack"`` when Q is an in-memory array and a working copy plus the
  LAPACK workspace takes less than `memory_fraction` (1/4) of the available RAM
  (``MemAvailable`` in /proc/meminfo): the thesis' float32 ``sgesdd``, bit for bit. For
  paths, memmaps and large arrays the fastest exact method that applies: ``"gram"`` (2.5x
  faster than TSQR and 2x faster than LAPACK at 82,430 x 5,000 in
  bench/analysis/results/svd_gram.md) when its floor can lie below the requested threshold; else,
  or when the matrix's own floor does not (the result's ``note`` says so), ``"lapack"`` on
  the matrix read into memory when it fits as above (1.3x faster than TSQR there), and
  ``"tsqr"`` when it does not. Float64 matrices and ``dtype="float32"`` never use gram; on
  a GPU (``device="gpu"``, `tools.gram_gpu`) the same rule holds, except that a file
  gram cannot resolve goes to ``"tsqr"`` (the GPU's memory is not measured).

Error bound of ``"gram"`` (M >= N; a wide Q is streamed as Q^T; sigma_i are the exact
singular values of the stored matrix, u = 2^-53, first order in u):

1. Accumulation. float16 / float32 entries are exact in float64 and so is the product of
   two (2 x 24 <= 53 bits). A block's b x N rows give a scratch Gram tile (BLAS sums each
   entry's b products in any order: at most b - 1 roundings on any product's path, plus one
   for a float64 Q's rounded product), which is then added to G once. Every product thus
   passes through at most d = b + ceil(M / b) roundings, so (Higham 2002, §4.2)
   |G^ - G| <= gamma_d |Q|^T |Q| entrywise, gamma_d = d u / (1 - d u), and
   ||G^ - G||_2 <= gamma_d || |Q| ||_2^2 <= gamma_d ||Q||_F^2.
2. Eigenvalues. ``eigh`` is backward stable: its eigenvalues are exact for G^ + F with
   ||F||_2 <= p(N) u ||G^||_2; we take p(N) = N (the LAPACK Users' Guide, §4.7, only calls it
   a modestly growing function of N; ``evd`` and ``evr`` differ by ~80 u ||G|| at
   N = 3,000, far inside N u ||G||).
3. Weyl: |lambda^_i - sigma_i^2| <= E = gamma_d ||Q||_F^2 + N u s_max^2, and as
   |a - b|^2 <= |a^2 - b^2| for a, b >= 0,  |s^_i - sigma_i| <= min(sqrt(E), E / sigma_i).

The resolved floor is s_floor = sqrt(K E) with the safety constant K = `GRAM_SAFETY` = 16:
for any threshold t >= s_floor, every sigma_i outside t (1 +- 1/K) lies on the same side of
t as s^_i, so a rank counted at t is the exact rank of the stored matrix up to values within
6 % of t. Relative to s_max, s_floor / s_max = 4 sqrt(gamma_d r + N u) with the energy
ratio r = ||Q||_F^2 / s_max^2 in [1, N]. For PTB test (82,430 x 10,000, b = 512, d = 673)
that is 4.4e-6 at r = 1 against the float32 Press threshold 1.8e-5: gram resolves it for r
up to about 260. A log-probability matrix, whose entries share one sign and are dominated
by their mean, has r near 1 (1.01-1.08 for log-softmax of Zipf-biased Gaussian logits of
std 1-4); the benchmark's rank-400 matrix has r = 26; a Gaussian matrix, with
r = N / (1 + sqrt(N / M))^2, is refused.
The check runs before reading Q with r = 1 (a float64 Q's Press threshold, ~3e-14 s_max, is
refused there), after the accumulation with lambda_max <= ||G^||_F, and after ``eigh``
with the computed s_max.

``device="gpu"`` runs the Gram accumulation and its eigensolver (`tools.gram_gpu`, same
bound), the TSQR folds and the final ``svdvals`` (or the LAPACK-style direct ``svdvals``)
with torch on CUDA, else CuPy; it raises a clear error when neither sees a GPU.

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
    N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed. (2002), §4.2
    (summation error bound); Weyl's inequality for symmetric eigenvalues (G. H. Golub,
    C. F. Van Loan, Matrix Computations, 4th ed. (2013), §8.1).
"""

import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np
import scipy.linalg

from tools import gram_gpu
from tools.qmatrix_io import QMatrixError, open_q, scan_finite
from tools.rank_thresholds import press_threshold
from zoo.runs import atomic_files

METHODS = ("auto", "lapack", "tsqr", "gram", "randomized")
DEFAULT_BLOCK_BYTES = 32 * 2**20  # at least 32 MiB per TSQR block (in the compute dtype)
TPQRT_PANEL = 64                  # column panel width nb passed to ?tpqrt
# gram: 512-row blocks keep the depth d = b + ceil(M / b) of the float64 sums small (the
# floor grows as sqrt(d)); measured here on 20,000 x 2,000, gram took 2.74 / 2.54 / 2.50 /
# 2.47 s with 256 / 512 / 1,024 / 2,048 rows (the scratch tile's addition into G is paid
# per block). Tiles of at most 5,000 columns bound the scratch to 200 MB.
GRAM_BLOCK_ROWS = 512
GRAM_TILE = 5000
GRAM_SAFETY = 16.0      # K in s_floor = sqrt(K E): thresholds are resolved to +-1/K
GRAM_EIGH_DRIVER = "evd"  # evd, ev, evr, evx took the same time here (tridiagonalization)
UNIT_ROUNDOFF = 2.0 ** -53


@dataclasses.dataclass
class SpectrumResult:
    """Singular values of Q plus what is needed to re-threshold them later.

    Attributes:
        values: 1-D float64 array, descending (n = min(M, N) values; k for randomized).
        method: ``"lapack"``, ``"tsqr"``, ``"gram"`` or ``"randomized"`` (the method
            actually used).
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
        floor: ``"gram"`` only: the smallest singular value it resolves, s_floor (absolute;
            see the module docstring). Thresholds below it are not resolved.
        note: why the method differs from the one asked for (``auto``'s TSQR fallback).
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
    floor: float | None = None
    note: str = ""

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
            "floor": self.floor, "note": self.note, "num_values": int(self.values.size),
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
            with atomic_files.replacing(path) as tmp:
                np.savez(tmp, values=self.values, meta=np.array(self.to_json(False)))
        elif path.suffix == ".json":
            atomic_files.write_text(path, self.to_json(True))
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


def _lapack_fits(src, dtype, memory_fraction):
    """Whether a working copy of Q plus LAPACK's workspace takes less than
    `memory_fraction` of the available RAM."""
    cdt = _lapack_dtype(src.dtype, dtype)
    m, n = src.shape
    need = m * n * cdt.itemsize + 2 * min(m, n) ** 2 * cdt.itemsize
    avail = available_memory_bytes()
    return avail is not None and need < memory_fraction * avail


def _choose_method(src, dtype, memory_fraction, device, gram_resolves):
    """`"auto"`'s exact method: LAPACK for arrays in memory (the thesis' sgesdd); for files
    the Gram matrix when it can resolve the threshold, else LAPACK when Q fits in memory,
    else TSQR (TSQR, not LAPACK, on a GPU for files, whose memory we do not measure)."""
    fits = _lapack_fits(src, dtype, memory_fraction)
    if src.in_memory:
        return "lapack" if fits else ("gram" if gram_resolves else "tsqr")
    if gram_resolves:
        return "gram"
    return "lapack" if fits and device == "cpu" else "tsqr"


class _Progress:
    """keras.utils.Progbar when available, else a plain line on stderr per update."""

    def __init__(self, target, enabled, unit):
        self.enabled = enabled
        self.bar = None
        self.target = target
        if not enabled:
            return
        try:
            from keras.utils import Progbar  # deferred: Keras imports TensorFlow
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
        import torch  # deferred: an optional GPU library
        if torch.cuda.is_available():
            return "torch", "cuda"
        why.append(f"torch {torch.__version__} sees no CUDA device")
    except ImportError:
        why.append("torch is not installed")
    try:
        import cupy  # deferred: an optional GPU library
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
    import torch  # deferred: an optional GPU library
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
    import cupy  # deferred: an optional GPU library
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
            scan_finite(src)
        overwrite = a.dtype != cdt
        if overwrite:
            a = a.astype(cdt)
    else:
        a = src.read_all(dtype=cdt, check_finite=check_finite)
        overwrite = True
    if device == "gpu":
        backend, torch_device = _gpu_backend()
        if backend == "torch":
            import torch  # deferred: an optional GPU library
            return torch.linalg.svdvals(torch.from_numpy(np.ascontiguousarray(a))
                                        .to(torch_device)).cpu().numpy()
        import cupy  # deferred: an optional GPU library
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


class GramFloorError(ValueError):
    """``method="gram"`` was asked for a threshold below the floor its error bound resolves.

    Attributes:
        floor: the floor s_floor / s_max (a lower bound of it when refused early).
        requested: the requested threshold / s_max.
    """

    def __init__(self, message, floor, requested):
        super().__init__(message)
        self.floor, self.requested = floor, requested


def gram_depth(m, block_rows):
    """d = b + ceil(m / b): roundings on any product's path in the streamed Gram sum.

    Args:
        m: number of rows summed over (max(M, N)).
        block_rows: rows per block b (capped at m).
    """
    b = max(1, min(int(block_rows), int(m)))
    return b + -(-int(m) // b)


def gram_floor(shape, block_rows=GRAM_BLOCK_ROWS, energy_ratio=1.0, safety=GRAM_SAFETY):
    """s_floor / s_max = sqrt(K (gamma_d r + n u)) of ``method="gram"`` (module docstring).

    Args:
        shape: (M, N) of Q.
        block_rows: rows per streamed block b (d = b + ceil(max(M, N) / b)).
        energy_ratio: r = ||Q||_F^2 / s_max^2 (>= 1; 1 gives the smallest possible floor).
        safety: K (default `GRAM_SAFETY` = 16).

    Returns:
        float, relative to s_max.

    Example:
        >>> round(gram_floor((82430, 10000), 512) / 1e-6, 2)      # PTB test, r = 1
        4.35
    """
    m, n = max(shape), min(shape)
    d = gram_depth(m, block_rows)
    gamma = d * UNIT_ROUNDOFF / (1.0 - d * UNIT_ROUNDOFF)
    return float(np.sqrt(safety * (gamma * float(energy_ratio) + n * UNIT_ROUNDOFF)))


def _press_relative(shape, dtype):
    return press_threshold(1.0, shape, dtype)


def _gram_refusal(src, block, floor_rel, want_rel, asked, when):
    m, n = src.shape
    return GramFloorError(
        f"method='gram' cannot resolve singular values down to {want_rel:.3g} s_max "
        f"({asked}): its error bound puts the floor at {floor_rel:.3g} s_max for this "
        f"{m:,} x {n:,} {src.dtype} matrix in blocks of {block} "
        f"{'rows' if m >= n else 'columns'} ({when}). Use "
        f"method='tsqr' (streamed QR) or method='lapack' instead, or pass a "
        f"min_resolved of at least {floor_rel:.3g}.", floor_rel, want_rel)


class _CpuGram:
    """Upper triangle of G = A^T A in float64 (A = Q, or Q^T when wide), streamed by
    `add(rows)`: BLAS dsyrk / dgemm tiles into a scratch, each added to G once."""

    def __init__(self, n, block):
        self.g = np.zeros((n, n), order="F")
        parts = -(-n // GRAM_TILE)
        edges = list(range(0, n, -(-n // parts))) + [n]
        self.tiles = list(zip(edges, edges[1:]))
        self.scratch = np.empty((edges[1], edges[1]), order="F")
        self.buf = np.empty((block, n))

    def add(self, rows):
        syrk, gemm = scipy.linalg.blas.dsyrk, scipy.linalg.blas.dgemm
        x = self.buf[:len(rows)]
        np.copyto(x, rows)  # float16 / float32 -> float64 is exact
        xt = x.T            # F-ordered n x b: block Gram = xt @ xt.T
        for i, (i0, i1) in enumerate(self.tiles):
            for j0, j1 in self.tiles[i:]:
                # The tile's b-term sums land in scratch (beta = 0) and reach G by one
                # addition: the depth bound holds whatever order the BLAS sums in.
                c = self.scratch[:i1 - i0, :j1 - j0]
                if i0 == j0:  # writes the upper triangle of c only; G's lower part is unused
                    c = syrk(1.0, xt[i0:i1], beta=0.0, c=c, trans=0, lower=0, overwrite_c=1)
                else:
                    c = gemm(1.0, xt[i0:i1], xt[j0:j1], beta=0.0, c=c, trans_b=1,
                             overwrite_c=1)
                self.g[i0:i1, j0:j1] += c

    def trace_and_frobenius(self):
        diag = np.diag(self.g)
        tri = scipy.linalg.lapack.dlantr(b"F", self.g, uplo=b"U", diag=b"N")
        fro = float(np.sqrt(max(2.0 * tri * tri - float(np.sum(diag ** 2)), 0.0)))
        return float(np.sum(diag)), fro

    def eigenvalues(self):
        lam = scipy.linalg.eigh(self.g, lower=False, eigvals_only=True, overwrite_a=True,
                                check_finite=False, driver=GRAM_EIGH_DRIVER)
        self.g = None
        return lam


def _gram_accumulator(n, block, dev):
    if dev == "gpu":
        backend, torch_device = _gpu_backend()
        return gram_gpu.accumulator(backend, n, torch_device)
    return _CpuGram(n, block)


def _gram(src, block, progress, check_finite, want_rel, asked, dev="cpu"):
    """(singular values, s_floor) by the Gram route; `GramFloorError` below the floor."""
    floor_rel = gram_floor(src.shape, block)
    if floor_rel > want_rel:
        raise _gram_refusal(src, block, floor_rel, want_rel, asked,
                            "before reading it, at the smallest energy ratio r = 1")
    gram = _gram_accumulator(min(src.shape), block, dev)  # block <= max(M, N): _gram_block
    bar = _Progress(max(src.shape), progress, "row" if src.shape[0] >= min(src.shape)
                    else "column")
    for done, rows in _stream(src, block, check_finite):
        gram.add(rows)
        bar.update(done)
    trace, fro = gram.trace_and_frobenius()  # trace = ||Q||_F^2 (to gamma_d)
    if fro > 0:  # lambda_max <= ||G||_F: the smallest floor this matrix can have
        floor_rel = gram_floor(src.shape, block, trace / fro)
        if floor_rel > want_rel:
            raise _gram_refusal(src, block, floor_rel, want_rel, asked,
                                f"after the accumulation, ||Q||_F^2 = {trace:.4g}")
    lam = gram.eigenvalues()
    lam_max = max(float(lam[-1]), 0.0)
    values = np.sqrt(np.clip(lam, 0.0, None))
    if lam_max == 0.0:  # Q = 0: every sum was exact
        return values, 0.0
    floor_rel = gram_floor(src.shape, block, trace / lam_max)
    if floor_rel > want_rel:
        raise _gram_refusal(src, block, floor_rel, want_rel, asked,
                            f"s_max = {np.sqrt(lam_max):.6g}, ||Q||_F^2 / s_max^2 = "
                            f"{trace / lam_max:.3g}")
    return values, floor_rel * float(np.sqrt(lam_max))


def _check_min_resolved(min_resolved, shape, q_dtype):
    """(relative threshold, its description) for gram; default: the Press threshold."""
    if min_resolved is None:
        return (_press_relative(shape, q_dtype),
                f"the {np.dtype(q_dtype)} Press threshold 0.5 sqrt(M + N + 1) eps")
    try:
        want = float(min_resolved)
    except (TypeError, ValueError):
        want = float("nan")
    if not np.isfinite(want) or want < 0:
        raise ValueError(f"min_resolved must be a finite number >= 0 (a fraction of s_max), "
                         f"got {min_resolved!r}")
    return want, f"min_resolved={want:.3g}"


def _tsqr(src, dtype, block_rows, dev, progress, check_finite):
    m, n = src.shape
    cdt = np.dtype(np.float64 if dtype is None else dtype)
    if cdt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64 for tsqr, got {cdt}")
    block = int(block_rows) if block_rows else default_block_rows(min(m, n), cdt)
    if block < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    if dev == "gpu":
        backend, tdev = _gpu_backend()
        if backend == "torch":
            return _tsqr_torch(src, cdt, block, progress, check_finite, tdev), cdt, block
        return _tsqr_cupy(src, cdt, block, progress, check_finite), cdt, block
    return _tsqr_cpu(src, cdt, block, progress, check_finite), cdt, block


def _gram_block(src, block_rows):
    if block_rows is not None and int(block_rows) < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    return min(int(block_rows) if block_rows else GRAM_BLOCK_ROWS, max(src.shape))


def singular_values(q, method="auto", block_rows=None, dtype=None, device=None,
                    progress=False, *, k=None, oversample=10, power_iters=4, seed=0,
                    check_finite=True, memory_fraction=0.25, min_resolved=None):
    """Singular values s_1 >= ... >= s_n of Q (n = min(M, N)), exact unless randomized.

    Q = U diag(s) V^T (thin SVD, thesis §2.3, eq. 2.25); only s is computed.

    Args:
        q: 2-D float16/32/64 ndarray, ``np.memmap``, or path to a ``.npy`` file (opened with
            ``mmap_mode="r"``, read block by block).
        method: ``"auto"`` (default, exact), ``"lapack"``, ``"tsqr"``, ``"gram"`` (exact
            above its floor) or ``"randomized"`` (approximate; see the module docstring).
        block_rows: rows per streamed block for ``"tsqr"`` / ``"gram"`` / ``"randomized"``
            (columns per block for a wide Q). Default: `default_block_rows`;
            `GRAM_BLOCK_ROWS` (512) for gram.
        dtype: compute dtype. Default: the matrix's dtype for ``"lapack"`` (float16 ->
            float32), float64 for ``"tsqr"`` and ``"randomized"``; ``"gram"`` is float64.
        device: None / ``"cpu"``, or ``"gpu"`` (torch CUDA, else CuPy; error if neither).
        progress: show a ``keras.utils.Progbar`` while streaming.
        k: number of singular values for ``"randomized"`` (default min(M, N)).
        oversample, power_iters, seed: randomized range finder settings.
        check_finite: raise `QMatrixError` naming the first row holding NaN / inf.
        memory_fraction: ``"auto"`` picks LAPACK only below this fraction of free RAM.
        min_resolved: ``"gram"`` (and ``"auto"``'s choice of it) only: the smallest singular
            value, as a fraction of s_max, that must be resolved. Default: the Press
            threshold of Q's dtype, 0.5 sqrt(M + N + 1) eps (the numpy-rank threshold is
            larger). ``"gram"`` raises `GramFloorError` (a ValueError) when its floor lies
            above it; ``"auto"`` then uses ``"lapack"`` (if Q fits in memory) or
            ``"tsqr"``.

    Returns:
        `SpectrumResult` (``.values`` float64, descending; ``.floor`` for gram).

    Example:
        >>> import numpy as np
        >>> q = np.log(np.random.default_rng(1).dirichlet(np.ones(30), size=200))
        >>> res = singular_values(q)                # in memory and small: LAPACK
        >>> res.method, res.values.shape
        ('lapack', (30,))
        >>> g = singular_values(q.astype(np.float32), method="gram")
        >>> bool(g.floor < 0.5 * np.sqrt(231) * np.finfo(np.float32).eps * g.s_max)
        True
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    src = open_q(q)
    m, n = src.shape
    dev = _normalize_device(device)
    auto = method == "auto"
    want_rel, asked = _check_min_resolved(min_resolved, src.shape, src.dtype)
    if auto:
        float64 = dtype is None or np.dtype(dtype) == np.float64
        gram_resolves = float64 and \
            gram_floor(src.shape, _gram_block(src, block_rows)) <= want_rel
        method = _choose_method(src, dtype, memory_fraction, dev, gram_resolves)
    t0 = time.perf_counter()
    used_block, floor, note = None, None, ""
    if method == "lapack":
        cdt = _lapack_dtype(src.dtype, dtype)
        values = _lapack(src, cdt, dev, check_finite)
    elif method == "tsqr":
        values, cdt, used_block = _tsqr(src, dtype, block_rows, dev, progress, check_finite)
    elif method == "gram":
        if dtype is not None and np.dtype(dtype) != np.float64:
            raise ValueError(f"method='gram' accumulates in float64; got dtype={dtype!r} "
                             f"(use dtype=None)")
        cdt = np.dtype(np.float64)
        used_block = _gram_block(src, block_rows)
        try:
            values, floor = _gram(src, used_block, progress, check_finite, want_rel, asked,
                                  dev)
        except GramFloorError as exc:
            if not auto:
                raise
            method = "lapack" if _lapack_fits(src, dtype, memory_fraction) and (
                src.in_memory or dev == "cpu") else "tsqr"
            note = (f"auto: used {method}, as gram's error floor {exc.floor:.3g} s_max lies "
                    f"above the threshold to resolve, {exc.requested:.3g} s_max ({asked})")
            floor = None
            if method == "lapack":
                cdt, used_block = _lapack_dtype(src.dtype, dtype), None
                values = _lapack(src, cdt, dev, check_finite)
            else:
                values, cdt, used_block = _tsqr(src, dtype, block_rows, dev, progress,
                                                  check_finite)
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
                          block_rows=used_block, k=k if method == "randomized" else None,
                          floor=floor, note=note)


__all__ = ["SpectrumResult", "singular_values", "default_block_rows", "gram_floor",
           "gram_depth", "GramFloorError", "available_memory_bytes", "METHODS",
           "QMatrixError"]
