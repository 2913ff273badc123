"""Step-size control of an adaptive Runge-Kutta solver: error norm, next step, first step.

Error of a step with estimate err from y to y_next (per component, then the worst component
of a state that is a list of tensors, a "mixed" norm):

    ratio = max_n RMS( err_n / (atol + rtol max(|y_n|, |y_next_n|)) )

The step is accepted when ratio <= 1. The next step (Hairer et al. §II.4, eq. 4.13, as the
reference CNF code's torchdiffeq does it) with q the embedded order (dopri5: q = 4):

    h_next = h min(ifactor, max(safety ratio^(-1/(q+1)), dfactor'))
    dfactor' = 1 after an accepted step (never shrink), dfactor after a rejected one,
    safety = 0.9, ifactor = 10, dfactor = 0.2;   ratio == 0 gives h ifactor.

First step (Hairer et al. §II.4, "starting step size"), with scale = atol + rtol |y0| and
the mixed norm above:

    d0 = ||y0 / scale||, d1 = ||f0 / scale||
    h0 = 0.01 d0 / d1 (1e-6 when d0 < 1e-5 or d1 < 1e-5)
    f1 = f(t0 + h0, y0 + h0 f0)          (one evaluation of f)
    d2 = ||(f1 - f0) / scale|| / h0
    h1 = (0.01 / max(d1, d2))^(1/(q+1))   (max(1e-6, 1e-3 h0) when d1, d2 <= 1e-15)
    h  = min(100 h0, h1)

All of it is control, not part of the solution: the solver stops gradients through it, so
backpropagation differentiates the discrete solution at the chosen steps (as the adjoint
method approximates the gradient of the exact one).

Reference: Hairer, Norsett & Wanner, "Solving Ordinary Differential Equations I", 2nd ed.,
§II.4 (automatic step size control, starting step size).
"""

from keras import ops

SAFETY = 0.9
IFACTOR = 10.0
DFACTOR = 0.2


def rms_norm(x):
    """sqrt(mean(x^2)) over every element of the tensor x."""
    return ops.sqrt(ops.mean(ops.square(x)))


def mixed_norm(xs):
    """The largest RMS norm among the tensors of the list `xs`."""
    norms = [rms_norm(x) for x in xs]
    return norms[0] if len(norms) == 1 else ops.max(ops.stack(norms))


def error_ratio(err, y, y_next, rtol, atol):
    """||err / (atol + rtol max(|y|, |y_next|))|| (mixed RMS norm); <= 1 accepts the step."""
    return mixed_norm([e / (atol + rtol * ops.maximum(ops.abs(a), ops.abs(b)))
                       for e, a, b in zip(err, y, y_next)])


def next_step_size(h, ratio, error_order):
    """The next step magnitude after a step of magnitude `h` with error `ratio`.

    Non-finite `ratio` (f or the state blew up) gives a NaN step, which stops the solver.
    """
    exponent = 1.0 / (error_order + 1)
    # full_like: two Python scalars would make a float32 tensor (0.2 rounded) in float64
    floor = ops.where(ratio < 1.0, ops.ones_like(ratio), ops.full_like(ratio, DFACTOR))
    factor = SAFETY * ops.power(ops.maximum(ratio, 1e-30), -exponent)
    factor = ops.minimum(IFACTOR, ops.maximum(factor, floor))
    return ops.where(ops.isfinite(ratio), h * factor, float("nan"))


def initial_step_size(func, t0, y0, f0, direction, error_order, rtol, atol):
    """Hairer's starting step magnitude (> 0) for `y' = func(t, y)` from (t0, y0), where
    f0 = func(t0, y0) and `direction` is +1 or -1. Costs one evaluation of `func`."""
    scale = [atol + rtol * ops.abs(y) for y in y0]
    d0 = mixed_norm([y / s for y, s in zip(y0, scale)])
    d1 = mixed_norm([f / s for f, s in zip(f0, scale)])
    tiny = ops.logical_or(d0 < 1e-5, d1 < 1e-5)
    h0 = ops.where(tiny, 1e-6, 0.01 * d0 / ops.where(tiny, 1.0, d1))
    y1 = [y + (direction * h0) * f for y, f in zip(y0, f0)]
    f1 = func(t0 + direction * h0, y1)
    d2 = mixed_norm([(b - a) / s for a, b, s in zip(f0, f1, scale)]) / h0
    flat = ops.logical_and(d1 <= 1e-15, d2 <= 1e-15)
    dmax = ops.where(flat, 1.0, ops.maximum(d1, d2))
    h1 = ops.where(flat, ops.maximum(1e-6, h0 * 1e-3),
                   ops.power(0.01 / dmax, 1.0 / (error_order + 1)))
    return ops.minimum(100.0 * h0, h1)
