"""ODE solvers in `keras.ops` for the NeuralODE and CNF output heads (issue 13).

    odeint(f, y0, t0, t1, method="dopri5", rtol=1e-5, atol=1e-5, step_size=None,
           max_steps=1000, adjoint=False, params=None) -> ODESolution(y, nfe)

    tableaus.py     Butcher tableaus: dopri5 (Dormand-Prince 5(4), FSAL), rk4, euler
    steps.py        one explicit Runge-Kutta step (+ embedded error estimate)
    control.py      error norm, step-size controller, Hairer's first step
    integrate.py    the solve loops (fixed grid; adaptive while / bounded scan), their outcome
    adjoint.py      adjoint gradients (custom gradient + backward augmented solve)
    solvers.py      `odeint`: arguments, the choice of loop and gradient, errors

NFE (evaluations of f in the forward solve) comes back as an int32 scalar tensor for a head
to report as a metric. Backend-specific pieces (a vector-Jacobian product, whether a while
loop is reverse-differentiable) are in `tflm.backends.autodiff` (docs/design.md, contract 6).

Why one `keras.ops` implementation and not the field's solvers: diffrax runs on JAX only,
torchdiffeq on PyTorch only and TensorFlow Probability's `tfp.math.ode` on TensorFlow (and
its JAX substrate) only; a head built on them would carry three dependencies, a backend
switch inside a layer, and three slightly different semantics (torchdiffeq steps past t1
and interpolates, diffrax clips the last step, TFP has its own controller and adjoint), so
the same model would not give the same numbers or NFE across backends. One implementation
keeps one semantics everywhere, follows the reference CNF code's torchdiffeq on what
matters to reproduce it (dopri5, rtol = atol = 1e-5, RMS error norm, safety 0.9, factors
0.2 / 10, Hairer's first step, adjoint with a mixed norm), and is checked against closed
forms and SciPy. What it gives up: dense output, stiff solvers, diffrax's checkpointed
backpropagation (here backpropagation on JAX keeps all max_steps iterations: prefer the
adjoint there) and some speed of the hand-tuned libraries.

Reference: Chen et al. 2018, "Neural Ordinary Differential Equations"; Grathwohl et al.
2019, "FFJORD"; Andonov 2019 (thesis), chapters 4-5.
"""

from tflm.ode.integrate import ODEIntegrationError
from tflm.ode.solvers import ODESolution, check_options, odeint
from tflm.ode.tableaus import ADAPTIVE, FIXED_STEP, TABLEAUS

METHODS = tuple(TABLEAUS)

__all__ = ["odeint", "check_options", "ODESolution", "ODEIntegrationError", "METHODS", "ADAPTIVE", "FIXED_STEP"]
