"""Output-layer activation functions: logits -> log-probabilities.

Plain functions on `keras.ops` (any backend). Each returns log-probabilities in float32
(the input is cast to float32 first; docs/design.md, contract 1) unless
`return_probs=True`.

    pl_tilde(x; c, k)  = k (x - c) + c - (k - 1) softplus(x - c)          (thesis eq 4.15)
    gss(l; c, k)       = log_softmax(pl_tilde(l; c, k))                   (thesis eq 4.16)
    sigsoftmax(l)      = log SS(l),  SS(l)_w = exp(l_w) sigmoid(l_w) / sum_v exp(l_v) sigmoid(l_v)

Reference: Parthiban 2020 (thesis, §3.1.3 SigSoftmax, §4.2.2 Generalized SigSoftmax);
Kanai et al. 2018 (SigSoftmax).
"""

from keras import ops

__all__ = ["pl_tilde", "gss", "sigsoftmax"]


def pl_tilde(x, c=0.0, k=2.0):
    """Smooth two-piece linear map of the Generalized SigSoftmax (thesis eq 4.15).

        PL~(x; c, k) = k (x - c) + c - (k - 1) softplus(x - c)

    It tends to `x` for x >> c and to `k (x - c) + c` for x << c. Special cases:
    PL~(x; c, 1) = x exactly, PL~(x; 0, 2) = 2x - softplus(x) (SigSoftmax),
    PL~(x; 0, 0) = softplus(x).

    Numerics: for k >= 1 it is evaluated as `x - (k - 1) softplus(c - x)` (equal, by
    softplus(z) = z + softplus(-z)), for k < 1 as `k (x - c) + c + (1 - k) softplus(x - c)`;
    each form adds terms of the same sign in the region where the other one cancels, so the
    result keeps float32 relative accuracy and stays finite for |x| up to ~1e37 (softplus is
    the backend's overflow-safe one). A tensor k selects the form elementwise.

    Args:
        x: tensor of logits (any shape).
        c: breakpoint (float or scalar tensor). Default 0.0.
        k: slope of the left piece (float or scalar tensor). Default 2.0.

    Returns:
        Tensor of the shape of `x`, in x's dtype (c and k are cast to it).

    Example:
    >>> float(pl_tilde(np.float32(30.0), c=-1.5, k=2.5))  # ~ identity far right of c
    30.0
    """
    x = ops.convert_to_tensor(x)
    static_k = isinstance(k, (int, float))
    c = ops.cast(c, x.dtype)
    kt = ops.cast(k, x.dtype)

    def steep():                     # k >= 1
        return x - (kt - 1.0) * ops.softplus(c - x)

    def flat():                      # k < 1
        return kt * (x - c) + c + (1.0 - kt) * ops.softplus(x - c)

    if static_k:
        return steep() if k >= 1 else flat()
    return ops.where(kt >= 1.0, steep(), flat())


def _finish(log_probs, return_probs):
    return ops.exp(log_probs) if return_probs else log_probs


def gss(logits, c=0.0, k=2.0, return_probs=False, axis=-1):
    """Generalized SigSoftmax (thesis eq 4.16) as log-probabilities.

        log GSS(l; c, k) = log_softmax(PL~(l; c, k))

    GSS(l; c, 1) = softmax(l) exactly; GSS(l; 0, 2) = SigSoftmax. Values chosen in the thesis:
    PTB (c, k) = (-1.5, 2.5), WikiText-2 (c, k) = (-1.5, 3.0).

    Args:
        logits: tensor `(..., V)`; cast to float32.
        c: breakpoint. Default 0.0.
        k: left slope. Default 2.0.
        return_probs: return probabilities instead of log-probabilities. Default False.
        axis: vocabulary axis. Default -1.

    Returns:
        float32 tensor of the shape of `logits`; rows logsumexp to 0 (or sum to 1).

    Example:
    >>> gss(np.zeros((2, 5), "float32"), c=-1.5, k=2.5).shape
    (2, 5)

    Reference: Parthiban 2020 (thesis), §4.2.2, eq 4.15-4.18.
    """
    logits = ops.cast(logits, "float32")
    return _finish(ops.log_softmax(pl_tilde(logits, c, k), axis=axis), return_probs)


def sigsoftmax(logits, return_probs=False, axis=-1):
    """SigSoftmax as log-probabilities.

        SS(l)_w = exp(l_w) sigmoid(l_w) / sum_v exp(l_v) sigmoid(l_v)
                = softmax(2 l - softplus(l))_w = softmax(l + log sigmoid(l))_w

    Computed as `log_softmax(l - softplus(-l))` (the same function, no overflow).

    Args:
        logits: tensor `(..., V)`; cast to float32.
        return_probs: return probabilities instead of log-probabilities. Default False.
        axis: vocabulary axis. Default -1.

    Returns:
        float32 tensor of the shape of `logits`.

    Example:
    >>> sigsoftmax(np.zeros((2, 5), "float32")).shape
    (2, 5)

    Reference: Kanai et al. 2018 (SigSoftmax); Parthiban 2020 (thesis), §3.1.3, eq 3.5, 4.5.
    """
    logits = ops.cast(logits, "float32")
    return _finish(ops.log_softmax(logits - ops.softplus(-logits), axis=axis), return_probs)
