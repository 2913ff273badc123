"""Padded BPTT windows: input positions holding `PAD_ID` are absent.

`tflm.data.lm_dataset(..., pad_to_multiple=m)` pads a window of T positions at the end to
the next multiple of m (inputs `PAD_ID` = -1, targets 0) so that JAX compiles a few programs
instead of one per window length. A language model then treats the padded positions as if
the window had T positions:

    mask[b, t]   = tokens[b, t] != PAD_ID
    loss         = sum(mask * nll) / sum(mask)
    T            = sum(mask) / B                        (for the T / bptt step scaling)
    LSTM state   = held through masked steps, so the carried state is the one after T steps
    AR, TAR      = means over real positions (TAR: over pairs of real positions)

`padding_mask` returns None where the tokens are concrete and hold no padding, so eager
backends keep the mask-free kernels (PyTorch's cuDNN LSTM takes no mask), and inside
`promised_unpadded(check)`, where the caller knows its traced windows hold no padding and
`check` places a runtime check of that promise (`LanguageModel.padded_windows = False` on
TensorFlow: the masked LSTM loop costs ops every step that an unpadded window never uses).
"""

import contextlib
import threading

from keras import ops

from tflm import backends
from tflm.data.pad_id import PAD_ID


_PROMISE = threading.local()
# Set from the start (in the importing thread): `torch.compile` guards on whether the
# attribute exists, and its first promise would otherwise compile the forward again.
_PROMISE.check = None


@contextlib.contextmanager
def promised_unpadded(check):
    """Within: traced windows hold no `PAD_ID`, so `padding_mask` returns None for them
    after `check(tokens)` has placed a runtime check that fails on a padded window.
    `check` None: no promise (traced tokens get a mask, as outside)."""
    previous = getattr(_PROMISE, "check", None)
    _PROMISE.check = check
    try:
        yield
    finally:
        _PROMISE.check = previous


def padding_mask(tokens):
    """Boolean `(batch, time)` mask of the real positions, or None when there is no padding.

    Traced tokens (a TensorFlow graph, JAX under `jit`) get a mask, the values being
    unknown when the program is built, unless inside `promised_unpadded`."""
    backend = backends.current()
    mask = ops.not_equal(tokens, backend.constant(PAD_ID, tokens))
    if backend.is_concrete(tokens):
        return None if bool(ops.convert_to_numpy(ops.all(mask))) else mask
    check = getattr(_PROMISE, "check", None)
    if check is not None:
        check(tokens)
        return None
    return mask


def without_padding(tokens):
    """Tokens with `PAD_ID` replaced by 0 (any valid id: their outputs are masked)."""
    return ops.where(ops.equal(tokens, PAD_ID), ops.zeros_like(tokens), tokens)


def real_position_weights(tokens):
    """float32 `(batch, time)`: 1 at real positions, 0 at padding."""
    return ops.cast(ops.not_equal(tokens, backends.current().constant(PAD_ID, tokens)),
                    "float32")


def masked_mean(values, mask):
    """Mean of `values` (batch, time, ...) over the positions where `mask` (batch, time) is
    True, and over every trailing element; the plain mean when `mask` is None. 0 where
    there is nothing to average: TAR's pairs of a one-position window (a mean of nothing
    would be NaN and end the run)."""
    values = ops.cast(values, "float32")
    if mask is None:
        count = 1
        for size in ops.shape(values):  # ints, or dynamic sizes on TensorFlow
            count = count * size
        if isinstance(count, int):  # a Python number divides without becoming a tensor
            return ops.sum(values) / float(max(count, 1))
        return ops.sum(values) / ops.maximum(ops.cast(count, "float32"), 1.0)
    weights = ops.cast(mask, "float32")
    per_position = 1
    for size in values.shape[2:]:
        per_position *= int(size)
    for _ in range(len(values.shape) - 2):
        weights = ops.expand_dims(weights, -1)
    total = ops.sum(values * weights)
    counted = ops.sum(weights) * float(per_position)
    return total / ops.maximum(counted, backends.current().constant(1.0, counted))
