"""Partial shuffle: every epoch, each training stream is rotated by its own random offset."""

import numpy as np


def partial_shuffle(streams, seed=0, epoch=0):
    """Rotate each row of the batchified `streams` (B, L) left by a random offset.

        row'_b = concat(row_b[o_b:], row_b[:o_b]),   o_b ~ U{0, ..., L - 1}

    Every stream keeps its tokens and their order except at the one seam where its end
    meets its start, while the windows of an epoch cut the text at new places and a
    stream's state starts from a new position: Press's "partial shuffle", as the AdvSoft
    code applies it before every epoch (ChengyueGongR/advsoft `partial_shuffle.py`, with
    NumPy's global generator; here the offsets are reproducible from `seed` and `epoch`).

    Args:
        streams: int array (B, L), e.g. `tflm.data.batchify(ids, B)`.
        seed: the run's seed. Default 0.
        epoch: the epoch number, mixed into the seed (new offsets every epoch). Default 0.

    Returns:
        int32 array (B, L).

    Example:
    >>> partial_shuffle(np.arange(8).reshape(2, 4), seed=1, epoch=0).shape
    (2, 4)

    Reference: Press 2019, "Partially Shuffling the Training Data to Improve Language
    Models" (arXiv:1903.04167).
    """
    streams = np.asarray(streams)
    if streams.ndim != 2 or streams.shape[1] < 1:
        raise ValueError(f"partial_shuffle needs batchified streams (batch, length); got "
                         f"shape {streams.shape}. Use tflm.data.batchify first.")
    rng = np.random.default_rng([int(seed), int(epoch), 0x5F])
    offsets = rng.integers(0, streams.shape[1], size=streams.shape[0])
    columns = (np.arange(streams.shape[1])[None, :] + offsets[:, None]) % streams.shape[1]
    return np.take_along_axis(streams, columns, axis=1).astype(np.int32)
