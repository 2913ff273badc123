"""The vector field of the flow output layers and the trace of its Jacobian, in closed form.

Andonov 2019 §7.3.3 trains continuous normalizing flows over the output embeddings with

    f(z, t [, h]) = W_out^T softplus(W_z^T z + t w_t + b_in [+ W_h^T h + b_h]) + b_out

(the thesis writes W Softplus(W_f^T [z; t] [+ W_h h]) with W_f = [W_z; w_t^T]; the biases
are those of the reference code's ffjord layers). z is `(..., d)`, the hidden width is k.
The log-density change of a CNF needs Tr(df/dz) along the solve (Chen et al. 2018, eq. 4;
thesis eq. 5.8). For this f the Jacobian is W_out^T diag(sigmoid(a)) W_z^T, a the
pre-activation, so

    Tr(df/dz)          = sum_j sigmoid(a_j) c_j,        c_j = sum_i W_z[i, j] W_out[j, i]
    eps^T (df/dz) eps  = sum_j sigmoid(a_j) (eps W_out^T)_j (eps W_z)_j

the exact trace in O(k) per state once c is formed (cheaper than the O(d k) Hutchinson
estimate, and noise-free), and Hutchinson's estimate (Grathwohl et al. 2019) without a
vector-Jacobian product, so both run inside the solver on every backend. Both are
checked against a brute-force Jacobian in tests/tflm/layers/test_cnf_heads.py.
"""

from keras import ops

TRACES = ("exact", "hutchinson")
NOISES = ("gaussian", "rademacher")


def pre_activation(t, z, w_z, w_t, b_in, context=None):
    """a = z W_z + t w_t + b_in (+ context): `(..., k)`."""
    a = ops.matmul(z, w_z) + t * w_t + b_in
    return a if context is None else a + context


def field_value(a, w_out, b_out):
    """f = softplus(a) W_out + b_out: `(..., d)`."""
    return ops.matmul(ops.softplus(a), w_out) + b_out


def exact_trace(a, w_z, w_out):
    """Tr(df/dz) for every state: `a.shape[:-1]`."""
    diagonal = ops.sum(w_z * ops.transpose(w_out), axis=0)
    return ops.sum(ops.sigmoid(a) * diagonal, axis=-1)


def hutchinson_trace(a, eps, w_z, w_out):
    """eps^T (df/dz) eps for every state (eps `(..., d)` like z): `a.shape[:-1]`."""
    left = ops.matmul(eps, ops.transpose(w_out))
    right = ops.matmul(eps, w_z)
    return ops.sum(ops.sigmoid(a) * left * right, axis=-1)


def augmented_dynamics(trace, with_context):
    """`f(t, (z, delta), params)` of the augmented CNF state: (dz/dt, d delta/dt) with
    d delta/dt = Tr(df/dz) (exact) or eps^T (df/dz) eps (Hutchinson). params:
    [W_z, w_t, b_in, W_out, b_out] + [eps] (Hutchinson) + [context] (conditional)."""
    if trace not in TRACES:
        raise ValueError(f"trace must be one of {TRACES}; got {trace!r}.")

    def dynamics(t, state, params):
        z = state[0]
        w_z, w_t, b_in, w_out, b_out = params[:5]
        rest = list(params[5:])
        eps = rest.pop(0) if trace == "hutchinson" else None
        context = rest.pop(0) if with_context else None
        a = pre_activation(t, z, w_z, w_t, b_in, context)
        if trace == "exact":
            change = exact_trace(a, w_z, w_out)
        else:
            change = hutchinson_trace(a, eps, w_z, w_out)
        return field_value(a, w_out, b_out), change

    return dynamics
