"""Gradients of an ODE solve by the adjoint method: O(1) memory in the number of steps.

For y' = f(t, y; theta), y(t1) = ODESolve(y(t0)) and a loss L(y(t1)), the adjoint
a(t) = dL/dy(t) and the parameter gradient follow from one more solve, backwards from t1
to t0, of the augmented system (Chen et al. 2018, Algorithm 1; Andonov 2019, eq. 4.6-4.7):

    d/dt [ y, a, g ] = [ f(t, y),  -a^T df/dy,  -a^T df/dtheta ]
    start at t1: [ y(t1), dL/dy(t1), 0 ]      end at t0: [ ~y(t0), dL/dy(t0), dL/dtheta ]

so dL/dtheta = -int_{t1}^{t0} a^T df/dtheta dt. The forward solve keeps nothing but y(t1);
the backward solve recomputes y on its way back and needs a^T df/dy and a^T df/dtheta at
each evaluation: one vector-Jacobian product of f (`tflm.backends.autodiff`). The
backward solve uses the forward's method and tolerances; its error norm is the largest
RMS norm over [y, a, g] (torchdiffeq's default mixed norm). The gradient approximates the
exact solution's (optimize-then-discretize): it differs from backpropagation through the
solver's own steps by about the solve's tolerance.

The solve is one `keras.ops.custom_gradient` function of (y0 components, params), so it
runs on TensorFlow, JAX and PyTorch. Its output is a single 1-D tensor (PyTorch's custom
gradient takes one output): [NFE, reached, t, h, y(t1) flattened]; `adjoint_integrate`
unpacks it, and only the y part receives (and passes on) a gradient.

f must receive every tensor it differentiates through `params`: gradients reach y0 and
params only; a tensor f closes over is a constant here (TensorFlow refuses a variable read
inside the solve, JAX a closed-over traced value; PyTorch gives it no gradient).

Reference: Chen, Rubanova, Bettencourt & Duvenaud 2018, "Neural Ordinary Differential
Equations", NeurIPS, §2 and Appendix B; Pontryagin et al. 1962 (adjoint sensitivities).
"""

import math

from keras import ops

from tflm.backends import autodiff
from tflm.ode.integrate import Integration, integrate, settle

_HEADER = 4          # NFE, reached, t, h


def _static(shape):
    return all(isinstance(d, int) for d in shape)


def _split_like(flat, like):
    """Cut the 1-D `flat` into tensors shaped like the list `like` (Python sizes where the
    shapes are static, tensors where a dimension is only known at run time)."""
    out, offset = [], 0
    for x in like:
        shape = tuple(x.shape)
        size = math.prod(shape) if _static(shape) else ops.size(x)
        out.append(ops.reshape(flat[offset:offset + size],
                               shape if _static(shape) else ops.shape(x)))
        offset = offset + size
    return out


def _pack(result, dtype):
    header = ops.stack([ops.cast(result.nfe, dtype), ops.cast(result.reached, dtype),
                        ops.cast(result.t, dtype), ops.cast(result.h, dtype)])
    return ops.concatenate([header] + [ops.reshape(y, (-1,)) for y in result.y], axis=0)


def adjoint_integrate(field, y0, params, t0, t1, config, describe):
    """Solve with adjoint gradients.

    Args:
        field: `field(t, y, params) -> list of tensors`, y and params lists of tensors.
        y0: list of tensors (one dtype).
        params: list of tensors f differentiates (may be empty).
        t0, t1: Python floats.
        config: `tflm.ode.integrate.SolverConfig`.
        describe: `describe(t, h) -> str`, the message of a failed backward solve.

    Returns:
        An `Integration` whose y carries adjoint gradients to y0 and params.
    """
    n = len(y0)
    dtype = y0[0].dtype

    @ops.custom_gradient
    def solve(*args):
        ys, ps = list(args[:n]), list(args[n:])
        forward = integrate(lambda t, y: field(t, y, ps), ys, t0, t1, config, loop="while")
        y1 = [ops.stop_gradient(y) for y in forward.y]

        def grad(*grad_args, upstream=None):
            if upstream is None:
                (upstream,) = grad_args
            a1 = _split_like(upstream[_HEADER:], ys)

            def augmented(t, state):
                y, a = state[:n], state[n:2 * n]
                values, vjps = autodiff.value_and_vjp(
                    lambda primals: field(t, primals[:n], primals[n:]), y + ps, a)
                return list(values) + [-v for v in vjps]

            start = y1 + a1 + [ops.zeros_like(p) for p in ps]
            back = integrate(augmented, start, t1, t0, config, loop="while")
            grads = settle(back.y[n:], back.reached, back.t, back.h,
                           lambda t, h: "adjoint (backward) solve: " + describe(t, h))
            return tuple(grads)

        return _pack(forward, dtype), grad

    packed = solve(*y0, *params)
    header = packed[:_HEADER]
    return Integration(_split_like(packed[_HEADER:], y0), ops.cast(header[0], "int32"),
                       header[1] > 0.5, header[2], header[3])
