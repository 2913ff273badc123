"""Butcher tableaus of the explicit Runge-Kutta methods `tflm.ode.odeint` offers.

An s-stage explicit method advances y' = f(t, y) from (t, y) by a step h:

    k_i     = f(t + c_i h, y + h sum_{j<i} a_ij k_j)          i = 1..s
    y_next  = y + h sum_i b_i k_i
    err     = h sum_i e_i k_i,   e = b - b*                   (embedded pair only)

where b* is an embedded solution of lower order; err estimates the local error of the
lower-order solution and drives the step size (`tflm.ode.control`).

    euler    1 stage,  order 1
    rk4      4 stages, order 4 (the classical Runge-Kutta method, the "1/6, 1/3, 1/3, 1/6" rule)
    dopri5   7 stages, order 5 with an embedded order-4 solution (Dormand-Prince 5(4));
             first-same-as-last (FSAL): b = a_7j and c_7 = 1, so k_7 = f(t + h, y_next) is the
             next step's k_1 and an attempted step costs 6 evaluations of f.

Reference: Dormand & Prince 1980, "A family of embedded Runge-Kutta formulae", J. Comput.
Appl. Math. 6(1), Table 2; Hairer, Norsett & Wanner, "Solving Ordinary Differential
Equations I", 2nd ed., §II.1 (rk4, Table 1.2) and §II.5 (DOPRI5, Table 5.2).
"""

import collections
from fractions import Fraction as F

Tableau = collections.namedtuple(
    "Tableau", ["name", "c", "a", "b", "e", "order", "error_order", "fsal"])
Tableau.__doc__ = """An explicit Runge-Kutta method.

    c: nodes (s floats); a: lower-triangular rows (row i has i entries); b: weights of the
    propagated solution; e: b - b* (None without an embedded solution); order: order of the
    propagated solution; error_order: order q of the embedded one (err = O(h^(q+1)));
    fsal: whether k_s = f(t + h, y_next)."""


def _floats(rows):
    return tuple(tuple(float(x) for x in row) for row in rows)


EULER = Tableau("euler", c=(0.0,), a=((),), b=(1.0,), e=None, order=1, error_order=None,
                fsal=False)

RK4 = Tableau("rk4", c=(0.0, 0.5, 0.5, 1.0),
              a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
              b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), e=None, order=4, error_order=None, fsal=False)

_DP_A = (
    (),
    (F(1, 5),),
    (F(3, 40), F(9, 40)),
    (F(44, 45), F(-56, 15), F(32, 9)),
    (F(19372, 6561), F(-25360, 2187), F(64448, 6561), F(-212, 729)),
    (F(9017, 3168), F(-355, 33), F(46732, 5247), F(49, 176), F(-5103, 18656)),
    (F(35, 384), F(0), F(500, 1113), F(125, 192), F(-2187, 6784), F(11, 84)),
)
_DP_B = (F(35, 384), F(0), F(500, 1113), F(125, 192), F(-2187, 6784), F(11, 84), F(0))
_DP_B_STAR = (F(5179, 57600), F(0), F(7571, 16695), F(393, 640), F(-92097, 339200),
              F(187, 2100), F(1, 40))

DOPRI5 = Tableau(
    "dopri5",
    c=(0.0, 0.2, 0.3, 0.8, 8 / 9, 1.0, 1.0),
    a=_floats(_DP_A),
    b=tuple(float(x) for x in _DP_B),
    e=tuple(float(x - y) for x, y in zip(_DP_B, _DP_B_STAR)),   # exact before rounding
    order=5, error_order=4, fsal=True)

TABLEAUS = {t.name: t for t in (DOPRI5, RK4, EULER)}
ADAPTIVE = tuple(name for name, t in TABLEAUS.items() if t.e is not None)
FIXED_STEP = tuple(name for name, t in TABLEAUS.items() if t.e is None)
