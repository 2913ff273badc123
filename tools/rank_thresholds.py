"""The thresholds of the numerical-rank rules, below which a singular value counts as zero.

For an M x N matrix stored in a floating dtype of machine epsilon eps:

- Press:  0.5 * sqrt(M + N + 1) * s_max * eps   (Press et al., Numerical Recipes 3rd ed. 2007,
  §2.6);
- numpy:  s_max * max(M, N) * eps                (``numpy.linalg.matrix_rank``'s default).

The ranks themselves, and their command line, are `tools.rank`'s; the spectra and their plots
(`tools.spectrum`, `tools.plots`) draw and check these thresholds too.
"""

import math

import numpy as np


def check_shape(shape):
    """`(M, N)` as ints from a matrix shape; ValueError unless 2-D with both sizes >= 1."""
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be (M, N) with M, N >= 1, got {tuple(shape)}")
    return int(shape[0]), int(shape[1])


def machine_eps(dtype):
    """Machine epsilon of the matrix dtype, e.g. ``machine_eps("float32") == 2**-23``."""
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise ValueError(f"dtype must be a floating dtype (the dtype of Q), got {dt}")
    return float(np.finfo(dt).eps)


def press_threshold(s_max, shape, dtype):
    """0.5 * sqrt(M + N + 1) * s_max * eps(dtype) (Numerical Recipes §2.6)."""
    m, n = check_shape(shape)
    return 0.5 * math.sqrt(m + n + 1.0) * float(s_max) * machine_eps(dtype)


def numpy_threshold(s_max, shape, dtype):
    """s_max * max(M, N) * eps(dtype) (``numpy.linalg.matrix_rank`` default)."""
    m, n = check_shape(shape)
    return float(s_max) * max(m, n) * machine_eps(dtype)


def rule_applies(threshold, s_max):
    """Whether a rank rule can count anything: its threshold lies below s_max."""
    return float(threshold) < float(s_max)
