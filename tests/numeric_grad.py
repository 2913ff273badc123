"""Central-difference gradients for the tests that check a formula's gradient against NumPy."""

import numpy as np


def numeric_grad(fn, x, h=1e-6):
    """d fn / d x by central differences, float64, element by element (small arrays only)."""
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (fn(up) - fn(down)) / (2 * h)
    return grad
