"""The solve loops: a fixed grid of steps, or adaptive steps until t1, and their outcome.

Fixed step (euler, rk4): n = ceil(|t1 - t0| / step_size) equal steps h = (t1 - t0) / n in a
`keras.ops.fori_loop` with a static trip count (reverse-differentiable everywhere); NFE =
n * stages.

Adaptive (dopri5): the loop carries (t, h, NFE, y, k_1) and each iteration attempts one
step of magnitude min(h, |t1 - t|) (the last step lands on t1 exactly), accepts it when
the error ratio is <= 1 (`tflm.ode.control`), keeps (t, y, k_1) otherwise, and picks the
next h either way; both outcomes are selected with `where`, so one program serves every
iteration. Start: f(t0, y0) and Hairer's first step (2 evaluations); each attempt costs 6
more (FSAL). Two loop forms:

    "while"  `keras.ops.while_loop` until t1 is reached (at most max_steps attempts): no
             work after the end. Reverse-differentiable on TensorFlow and PyTorch, forward
             only on JAX (the adjoint's forward and backward solves use it there).
    "scan"   `keras.ops.fori_loop` over exactly max_steps iterations (a `lax.scan` on JAX,
             reverse-differentiable); an iteration after the end is a `keras.ops.cond` that
             returns the state unchanged and counts no NFE. Backpropagation through it
             keeps max_steps iterations' intermediates: memory grows with max_steps.

The loop stops early (not reached) when the step size is no longer a finite number that
moves t: f or the state became non-finite, or the step underflowed. `settle` turns an
unreached t1 into an `ODEIntegrationError` where the values are known (eager) and into
NaN states inside a compiled function, where no Python error can be raised.
"""

import collections
import math

from keras import ops

from tflm import backends
from tflm.ode import control
from tflm.ode.steps import evaluations_per_step, rk_step

Integration = collections.namedtuple("Integration", ["y", "nfe", "reached", "t", "h"])
Integration.__doc__ = """The end of one solve: y (list of tensors), nfe (int32 scalar),
reached (bool scalar: t1 was reached), t and h (where it stopped, the last step size)."""

SolverConfig = collections.namedtuple(
    "SolverConfig", ["tableau", "rtol", "atol", "step_size", "max_steps"])


class ODEIntegrationError(RuntimeError):
    """The solver stopped before t1 (max_steps exhausted, step-size underflow, NaN/inf)."""


def fixed_step_count(t0, t1, step_size):
    """n = ceil(|t1 - t0| / step_size) (at least 1), tolerant to the rounding of the ratio."""
    return max(1, math.ceil(abs(t1 - t0) / step_size * (1.0 - 1e-12)))


def integrate(func, y0, t0, t1, config, loop="while"):
    """Solve y' = func(t, y) from y(t0) = y0 (a list of tensors) to t1 (Python floats).

    Returns an `Integration`. `loop` ("while" or "scan") applies to adaptive methods only.
    """
    if config.tableau.e is None:
        return _fixed(func, y0, t0, t1, config)
    return _adaptive(func, y0, t0, t1, config, loop)


def _fixed(func, y0, t0, t1, config):
    tableau = config.tableau
    dtype = y0[0].dtype
    n = fixed_step_count(t0, t1, config.step_size)
    h_value = (t1 - t0) / n
    h = ops.convert_to_tensor(h_value, dtype)
    t_start = ops.convert_to_tensor(t0, dtype)

    def body(i, ys):
        t = t_start + ops.cast(i, dtype) * h
        y_next, _, _ = rk_step(func, t, list(ys), h, tableau)
        return tuple(y_next)

    ys = ops.fori_loop(0, n, body, tuple(y0))
    nfe = ops.convert_to_tensor(n * evaluations_per_step(tableau, False), "int32")
    return Integration(list(ys), nfe, ops.convert_to_tensor(True),
                       ops.convert_to_tensor(t1, dtype), h)


def _adaptive(func, y0, t0, t1, config, loop):
    tableau, rtol, atol = config.tableau, config.rtol, config.atol
    q = tableau.error_order
    dtype = y0[0].dtype
    n = len(y0)
    direction = 1.0 if t1 > t0 else -1.0
    t_start = ops.convert_to_tensor(t0, dtype)
    t_end = ops.convert_to_tensor(t1, dtype)
    per_attempt = evaluations_per_step(tableau, tableau.fsal)

    f0 = func(t_start, y0)
    h0 = control.initial_step_size(
        func, t_start, [ops.stop_gradient(y) for y in y0], [ops.stop_gradient(f) for f in f0],
        direction, q, rtol, atol)
    state = (t_start, ops.stop_gradient(h0), ops.convert_to_tensor(2, "int32"),
             *y0, *f0)

    def alive(t, h, nfe, *rest):
        remaining = direction * (t_end - t)
        # where, not ops.minimum: Keras' type promotion runs minimum of two float64
        # tensors in float32 on PyTorch, and the last step must land on t1 exactly
        step = ops.where(h < remaining, h, remaining)
        moves = ops.not_equal(t + direction * step, t)
        return ops.logical_and(ops.logical_and(remaining > 0, ops.isfinite(h)), moves)

    def attempt(t, h, nfe, *rest):
        y, k1 = list(rest[:n]), list(rest[n:])
        remaining = direction * (t_end - t)
        last = h >= remaining
        h_step = ops.where(last, remaining, h)
        y_new, k_new, err = rk_step(func, t, y, direction * h_step, tableau, k1=k1)
        ratio = control.error_ratio([ops.stop_gradient(e) for e in err],
                                    [ops.stop_gradient(v) for v in y],
                                    [ops.stop_gradient(v) for v in y_new], rtol, atol)
        accept = ratio <= 1.0
        t_next = ops.where(accept, ops.where(last, t_end, t + direction * h_step), t)
        h_next = ops.stop_gradient(control.next_step_size(h_step, ratio, q))
        ys = [ops.where(accept, a, b) for a, b in zip(y_new, y)]
        ks = [ops.where(accept, a, b) for a, b in zip(k_new, k1)]
        return (ops.stop_gradient(t_next), h_next, nfe + per_attempt, *ys, *ks)

    if loop == "while":
        state = ops.while_loop(alive, attempt, state, maximum_iterations=config.max_steps)
    elif loop == "scan":
        def body(i, s):
            return ops.cond(alive(*s), lambda: tuple(attempt(*s)), lambda: tuple(s))
        state = ops.fori_loop(0, config.max_steps, body, state)
    else:
        raise ValueError(f"loop must be 'while' or 'scan'; got {loop!r}.")
    t, h, nfe = state[0], state[1], state[2]
    reached = direction * (t_end - t) <= 0
    return Integration(list(state[3:3 + n]), nfe, reached, t, h)


def settle(ys, reached, t, h, describe):
    """`ys` if t1 was reached; else raise `ODEIntegrationError(describe(t, h))` where the
    flag is known now, or return NaN states where it is not (inside a compiled function)."""
    current = backends.current()
    if current.is_concrete(reached):
        if not bool(ops.convert_to_numpy(reached)):
            raise ODEIntegrationError(describe(float(ops.convert_to_numpy(t)),
                                               float(ops.convert_to_numpy(h))))
        return ys
    return [ops.where(reached, y, float("nan")) for y in ys]
