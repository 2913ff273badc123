"""One explicit Runge-Kutta step on a state held as a list of tensors.

    k_i     = f(t + c_i h, y + h sum_{j<i} a_ij k_j)
    y_next  = y + h sum_i b_i k_i          err = h sum_i e_i k_i

(`tflm.ode.tableaus`). Every operation is a `keras.ops` call, so a step runs, and is
differentiated, on every backend; zero coefficients are skipped.
"""

from keras import ops


def _combine(y, h, coefficients, ks):
    """[y_n + h sum_j coefficients_j ks_j[n]] for every component n (zeros skipped);
    `y=None` reads as zeros."""
    out = []
    for n in range(len(ks[0])):
        y_n = None if y is None else y[n]
        acc = None
        for coef, k in zip(coefficients, ks):
            if coef == 0.0:
                continue
            term = k[n] if coef == 1.0 else coef * k[n]
            acc = term if acc is None else acc + term
        if acc is None:
            out.append(ops.zeros_like(ks[0][n]) if y_n is None else y_n)
        else:
            out.append(h * acc if y_n is None else y_n + h * acc)
    return out


def evaluations_per_step(tableau, have_k1):
    """Evaluations of f one attempted step costs (k_1 is free when the caller has it)."""
    return len(tableau.c) - (1 if have_k1 else 0)


def rk_step(func, t, y, h, tableau, k1=None):
    """Advance the state `y` (a list of tensors) from time `t` by the signed step `h`.

    Args:
        func: `func(t, y) -> list of tensors` shaped like `y`.
        t: scalar tensor, the current time.
        y: list of tensors, the current state.
        h: scalar tensor of y's dtype, the step (negative when integrating backwards).
        tableau: a `tflm.ode.tableaus.Tableau`.
        k1: `func(t, y)` when the caller already has it (FSAL), else None.

    Returns:
        `(y_next, k_last, err)`: the new state; the last stage `k_s` (for an FSAL method
        f(t + h, y_next), the next step's k_1); the error estimate (a list like `y`) or None
        for a method without an embedded solution.
    """
    ks = [func(t, y) if k1 is None else k1]
    y_stage = y
    for i in range(1, len(tableau.c)):
        y_stage = _combine(y, h, tableau.a[i], ks)
        ks.append(func(t + tableau.c[i] * h, y_stage))
    if tableau.fsal:
        y_next = y_stage                       # b equals the last row of a
    else:
        y_next = _combine(y, h, tableau.b, ks)
    err = None
    if tableau.e is not None:
        err = _combine(None, h, tableau.e, ks)
    return y_next, ks[-1], err
