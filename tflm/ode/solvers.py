"""`odeint`: solve y' = f(t, y) from t0 to t1 with dopri5, rk4 or euler, in `keras.ops`.

    y(t1) = y(t0) + int_{t0}^{t1} f(t, y(t)) dt                     (Andonov 2019, eq. 4.3-4.5)

Gradients reach y0 and `params` by backpropagation through the solver's operations
(`adjoint=False`) or by the adjoint method (`adjoint=True`, `tflm.ode.adjoint`).
"""

import collections
import numbers

import keras
from keras import ops

from tflm.backends import autodiff
from tflm.ode.adjoint import adjoint_integrate
from tflm.ode.integrate import SolverConfig, fixed_step_count, integrate, settle
from tflm.ode.tableaus import ADAPTIVE, FIXED_STEP, TABLEAUS

ODESolution = collections.namedtuple("ODESolution", ["y", "nfe"])
ODESolution.__doc__ = """The result of `odeint`: y, the state at t1 (the structure of y0),
and nfe, the number of evaluations of f in the forward solve (an int32 scalar tensor)."""

_STATE_DTYPES = ("float32", "float64")


def _real(name, value, *, positive=False, non_negative=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; got {value!r}.")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite; got {value!r}.")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0; got {value!r}.")
    if non_negative and value < 0:
        raise ValueError(f"{name} must be >= 0; got {value!r}.")
    return value


def _check_config(method, t0, t1, rtol, atol, step_size, max_steps):
    if method not in TABLEAUS:
        raise ValueError(f"method must be one of {', '.join(map(repr, TABLEAUS))}; "
                         f"got {method!r}.")
    t0 = _real("t0", t0)
    t1 = _real("t1", t1)
    rtol = _real("rtol", rtol, non_negative=True)
    atol = _real("atol", atol, non_negative=True)
    if rtol == 0 and atol == 0:
        raise ValueError("rtol and atol cannot both be 0 (no error would be tolerated).")
    if isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) \
            or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer; got {max_steps!r}.")
    if method in FIXED_STEP:
        if step_size is None:
            raise ValueError(f"method={method!r} takes fixed steps: pass step_size "
                             "(e.g. step_size=0.1); got step_size=None.")
        step_size = _real("step_size", step_size, positive=True)
        steps = fixed_step_count(t0, t1, step_size)
        if steps > max_steps:
            raise ValueError(
                f"step_size={step_size!r} needs {steps} steps from t0={t0!r} to t1={t1!r}, "
                f"more than max_steps={max_steps!r}; raise max_steps or the step size.")
    elif step_size is not None:
        raise ValueError(f"step_size applies to the fixed-step methods "
                         f"({', '.join(map(repr, FIXED_STEP))}); {method!r} chooses its own "
                         f"steps from rtol and atol; got step_size={step_size!r}.")
    return t0, t1, SolverConfig(TABLEAUS[method], rtol, atol, step_size, int(max_steps))


def _state(y0):
    """y0 as a list of tensors of one float dtype, and whether it was a tuple/list."""
    is_sequence = isinstance(y0, (list, tuple))
    parts = list(y0) if is_sequence else [y0]
    if not parts:
        raise ValueError("y0 must be a tensor or a non-empty tuple/list of tensors; got "
                         f"{y0!r}.")
    # a Keras variable is read (as params are below): TensorFlow's custom gradient of the
    # adjoint refuses a variable, and y(t1) for t0 == t1 must be a tensor, not the variable
    parts = [ops.copy(p) if isinstance(p, keras.Variable) else ops.convert_to_tensor(p)
             for p in parts]
    dtypes = {keras.backend.standardize_dtype(p.dtype) for p in parts}
    if len(dtypes) != 1 or not dtypes <= set(_STATE_DTYPES):
        raise ValueError("y0 must be float32 or float64 (one dtype for every component; "
                         f"cast it first); got dtype {', '.join(sorted(dtypes))}.")
    return parts, is_sequence


def _restructure(ys, y0, is_sequence):
    """The list `ys` in y0's structure: a tensor, a tuple or a list."""
    if not is_sequence:
        return ys[0]
    return tuple(ys) if isinstance(y0, tuple) else list(ys)


def _vector_field(f, like, is_sequence, with_params):
    """`field(t, ys, params) -> list of tensors`: f on the user's structure, checked."""
    dtype = like[0].dtype

    def field(t, ys, params):
        y = list(ys) if is_sequence else ys[0]
        out = f(t, y, list(params)) if with_params else f(t, y)
        outs = list(out) if is_sequence and isinstance(out, (list, tuple)) else [out]
        if len(outs) != len(like) or (not is_sequence and isinstance(out, (list, tuple))):
            raise ValueError(f"f(t, y) must return the structure of y0 ({len(like)} "
                             f"tensor(s)); got {type(out).__name__} of {len(outs)}.")
        result = []
        for o, y_n in zip(outs, like):
            o = ops.convert_to_tensor(o)
            if len(o.shape) != len(y_n.shape) or any(
                    a is not None and b is not None and a != b
                    for a, b in zip(o.shape, y_n.shape)):
                raise ValueError(f"f(t, y) must return the shape of y; got {tuple(o.shape)} "
                                 f"for y of shape {tuple(y_n.shape)}.")
            result.append(o if o.dtype == dtype else ops.cast(o, dtype))
        return result

    return field


def check_options(t0, t1, *, method="dopri5", rtol=1e-5, atol=1e-5, step_size=None,
                  max_steps=1000, adjoint=False):
    """Check `odeint`'s solver options without solving: `(t0, t1, SolverConfig)` or the
    `ValueError` `odeint` would raise (a layer checks its options when it is made)."""
    t0, t1, config = _check_config(method, t0, t1, rtol, atol, step_size, max_steps)
    if not isinstance(adjoint, bool):
        raise ValueError(f"adjoint must be True or False; got {adjoint!r}.")
    return t0, t1, config


def odeint(f, y0, t0, t1, *, method="dopri5", rtol=1e-5, atol=1e-5, step_size=None,
           max_steps=1000, adjoint=False, params=None):
    """Solve the initial value problem y' = f(t, y), y(t0) = y0, and return y(t1) and NFE.

        y(t1) = y0 + int_{t0}^{t1} f(t, y(t)) dt

    Methods: "dopri5" (Dormand-Prince 5(4), adaptive: a step is accepted when
    RMS(err / (atol + rtol max(|y|, |y_next|))) <= 1, the step size follows Hairer's
    controller with safety 0.9, growth <= 10, shrink >= 0.2, first step by Hairer's
    algorithm; `tflm.ode.control`), "rk4" and "euler" (n = ceil(|t1 - t0| / step_size)
    equal steps). t1 < t0 integrates backwards. The defaults rtol = atol = 1e-5 are those of
    the reference CNF code (FFJORD on torchdiffeq).

    Gradients: `adjoint=False` backpropagates through the solver's operations (memory grows
    with the number of steps; on JAX the adaptive loop is a bounded scan of `max_steps`
    iterations, so memory grows with max_steps); `adjoint=True` solves the adjoint system
    backwards (`tflm.ode.adjoint`): memory independent of the number of steps, about
    twice the evaluations, the gradient of the exact solution to the solve's tolerance.
    The adjoint forward is a while loop that stops at t1 on every backend, which also
    makes it the cheaper choice for inference on JAX. Step sizes carry no gradient; t0
    and t1 are constants.

    Args:
        f: `f(t, y)` (or `f(t, y, params)` when `params` is given) returning dy/dt with
            y's structure and shapes, written with `keras.ops`; `t` is a scalar tensor of
            y's dtype. A result of another float dtype is cast to y's.
        y0: the state at t0: a float32 / float64 tensor, e.g. `(batch, ..., dim)`, or a
            tuple / list of such tensors (for instance a CNF's `(z, log-density change)`).
        t0, t1: start and end time, Python numbers.
        method: "dopri5" (default), "rk4" or "euler".
        rtol, atol: relative and absolute tolerance of dopri5. Default 1e-5 each.
        step_size: step of rk4 / euler (shortened to divide |t1 - t0| evenly); required
            there, refused for dopri5.
        max_steps: most step attempts (accepted or rejected) of dopri5, most steps of the
            fixed-step methods. Default 1000.
        adjoint: gradients by the adjoint method. Default False (backpropagation).
        params: list of tensors / Keras variables f depends on and passes gradients to;
            f then receives them (as tensors) as its third argument. Required with
            `adjoint=True` for every trainable tensor f uses (a tensor f closes over gets
            no adjoint gradient). Default None: f is called as `f(t, y)`.

    Returns:
        `ODESolution(y, nfe)`: y(t1) in y0's structure, and the number of evaluations of f
        in the forward solve (an int32 scalar tensor; dopri5: 2 + 6 per attempted step).

    Raises:
        ValueError: a bad argument (the message quotes it).
        ODEIntegrationError: dopri5 did not reach t1 (max_steps exhausted, step size
            underflow, f non-finite) where that is known at call time; inside a compiled
            function (tf.function, jax.jit) the state comes back as NaN instead.

    Example:
    >>> from keras import ops
    >>> sol = odeint(lambda t, y: -y, ops.ones((2,)), 0.0, 1.0)
    >>> [round(float(v), 4) for v in ops.convert_to_numpy(sol.y)]
    [0.3679, 0.3679]

    Reference: Chen et al. 2018, "Neural Ordinary Differential Equations" (NeurIPS);
    Dormand & Prince 1980; Hairer, Norsett & Wanner, "Solving Ordinary Differential
    Equations I", §II.4-II.5; Andonov 2019 (thesis), §4.1-4.2.
    """
    if not callable(f):
        raise ValueError(f"f must be callable as f(t, y); got {f!r}.")
    t0, t1, config = check_options(t0, t1, method=method, rtol=rtol, atol=atol,
                                   step_size=step_size, max_steps=max_steps, adjoint=adjoint)
    if params is not None and not isinstance(params, (list, tuple)):
        raise ValueError("params must be a list or tuple of tensors / variables (or None); "
                         f"got {type(params).__name__}.")
    ys, is_sequence = _state(y0)
    if t0 == t1:
        return ODESolution(_restructure(ys, y0, is_sequence), ops.convert_to_tensor(0, "int32"))
    # A Keras variable is read into a tensor here (ops.convert_to_tensor leaves a TensorFlow
    # variable as it is, and tf.custom_gradient refuses variables read inside the solve).
    ps = [] if params is None else [ops.copy(p) if isinstance(p, keras.Variable)
                                    else ops.convert_to_tensor(p) for p in params]
    field = _vector_field(f, ys, is_sequence, params is not None)

    def describe(t, h):
        return (f"odeint(method={method!r}) stopped at t={t!r} before t1={t1!r} (from "
                f"t0={t0!r}) with step size {h!r} after max_steps={config.max_steps!r} "
                "attempts or a step that could not move t. Raise max_steps or loosen "
                f"rtol={config.rtol!r} / atol={config.atol!r}; a NaN or infinite step size "
                "means f or the state became non-finite.")

    if adjoint:
        result = adjoint_integrate(field, ys, ps, t0, t1, config, describe)
    else:
        loop = "while" if autodiff.while_loop_is_differentiable() else "scan"
        result = integrate(lambda t, y: field(t, y, ps), ys, t0, t1, config, loop=loop)
    out = settle(result.y, result.reached, result.t, result.h, describe)
    return ODESolution(_restructure(out, y0, is_sequence), result.nfe)


__all__ = ["odeint", "check_options", "ODESolution"]
