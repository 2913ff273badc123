"""Batchify a token stream into parallel streams and cut them into BPTT windows.

The language-model references (AWD-LSTM, MoS) train on `batch_size` contiguous streams:
the id sequence is trimmed and reshaped so that row b is the b-th contiguous chunk of the
text. Windows walk along the time axis; the hidden state of every row is carried from one
window to the next, so row b of consecutive windows is consecutive text.

Training windows have random lengths (AWD-LSTM): with probability 0.95 the base is `bptt`,
otherwise `bptt / 2`; the length is `max(5, int(N(base, 5)))`, capped at `max_len` when
given (MoS uses `bptt + 40`), and the last window is cut to the positions that remain.
Evaluation windows have fixed length `bptt`, the last one shorter. Scale the learning rate of
a training step by `T / bptt`, T the window's real length.

Padding (`pad_to_multiple=m`): a window of length T is padded at the end to the next multiple
of m, inputs with `PAD_ID` (-1) and targets with 0, so that a backend that compiles one
program per input shape (JAX under `jit`) sees a few lengths instead of one per distinct T.
`tflm.LanguageModel` treats input positions holding `PAD_ID` as absent: no loss, no state
update, no AR/TAR, and T counts the real positions only.

Reference:
    Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models", §4.1
    (variable length backpropagation sequences); salesforce/awd-lstm-lm.
"""

import numpy as np

from tflm.data.pad_id import PAD_ID  # noqa: F401 (re-exported: tflm.data.batching.PAD_ID)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def default_pad_to_multiple(backend):
    """The padding `python -m zoo.train` uses on a Keras backend: 4 on JAX, 1 elsewhere.

    JAX compiles the train step once per window shape. With the AWD-LSTM lengths
    (N(bptt, 5), some N(bptt / 2, 5)) a multiple of 4 leaves about a dozen shapes for about
    1.5 wasted positions per window; measured on this project's CPU comparison (PTB, bptt 35)
    it beat both 8 (fewer compiles, 10 % padding) and 1 (a compile for nearly every early
    window). TensorFlow and PyTorch take any length, so padding would only cost them."""
    return 4 if backend == "jax" else 1


def padded_length(length, pad_to_multiple):
    """`length` rounded up to a multiple of `pad_to_multiple` (1: unchanged)."""
    multiple = _positive_int(pad_to_multiple, "pad_to_multiple")
    return -(-int(length) // multiple) * multiple


def pad_window(x, y, pad_to_multiple):
    """Pads a window (x, y) of shape (B, T) at the end to `padded_length(T, m)` positions:
    x with `PAD_ID`, y with 0."""
    extra = padded_length(x.shape[1], pad_to_multiple) - x.shape[1]
    if not extra:
        return x, y
    return (np.pad(x, ((0, 0), (0, extra)), constant_values=PAD_ID),
            np.pad(y, ((0, 0), (0, extra)), constant_values=0))


def pad_window_tensors(x, y, pad_to_multiple):
    """`pad_window` for TensorFlow tensors of a dynamic length (in a tf.data map)."""
    import tensorflow as tf  # deferred: tflm.data must import without TensorFlow loaded
    multiple = _positive_int(pad_to_multiple, "pad_to_multiple")
    if multiple == 1:
        return x, y
    length = tf.shape(x)[1]
    extra = (multiple - length % multiple) % multiple
    return (tf.pad(x, [[0, 0], [0, extra]], constant_values=PAD_ID),
            tf.pad(y, [[0, 0], [0, extra]], constant_values=0))


def batchify(ids, batch_size):
    """Reshapes a 1-D id sequence into `batch_size` contiguous streams.

    Rule: with `L = len(ids) // batch_size`, row b is `ids[b * L:(b + 1) * L]`; the last
    `len(ids) % batch_size` tokens are dropped.

    Args:
        ids: 1-D integer array of token ids (length N >= 2 * batch_size).
        batch_size: number of streams B.

    Returns:
        int32 array of shape (B, N // B).

    Example:

    >>> batchify(np.arange(10), 3)
    array([[0, 1, 2],
           [3, 4, 5],
           [6, 7, 8]], dtype=int32)

    Reference:
        salesforce/awd-lstm-lm, utils.py: batchify.
    """
    batch_size = _positive_int(batch_size, "batch_size")
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"batchify expects a 1-D id sequence, got shape {ids.shape}.")
    if len(ids) < 2 * batch_size:
        raise ValueError(
            f"batchify needs at least 2 * batch_size = {2 * batch_size} tokens (each stream "
            f"needs an input and a target), got {len(ids)}. Use a smaller batch_size.")
    length = len(ids) // batch_size
    return ids[:batch_size * length].reshape(batch_size, length).astype(np.int32)


def _check_window_args(num_positions, bptt):
    if isinstance(num_positions, bool) or not isinstance(num_positions, (int, np.integer)) \
            or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative integer, got {num_positions!r}.")
    return int(num_positions), _positive_int(bptt, "bptt")


def _check_rule(short_prob, std, min_len, max_len):
    if not 0.0 <= short_prob <= 1.0:
        raise ValueError(f"short_prob must be in [0, 1], got {short_prob!r}.")
    if not std >= 0:
        raise ValueError(f"std must be >= 0, got {std!r}.")
    min_len = _positive_int(min_len, "min_len")
    if max_len is not None:
        max_len = _positive_int(max_len, "max_len")
    return float(short_prob), float(std), min_len, max_len


def covering_length(bptt, std=5.0, max_len=None, sigmas=3.5):
    """A window length that all but a few of `window_lengths`' windows fit in:
    ceil(bptt + sigmas std), capped at `max_len`. With the default 3.5 standard deviations
    about 2 windows in 10,000 are longer (the normal tail)."""
    length = int(np.ceil(float(bptt) + float(sigmas) * float(std)))
    return length if max_len is None else min(length, int(max_len))


def window_lengths(num_positions, bptt, rng, *, short_prob=0.05, std=5.0, min_len=5,
                   max_len=None):
    """Random BPTT window lengths covering `num_positions` positions (AWD-LSTM rule).

    Rule, per window: `base = bptt` if `u < 1 - short_prob` (u ~ U[0, 1)), else `bptt / 2`;
    `T = max(min_len, int(normal(base, std)))`; `T = min(T, max_len)` if `max_len`; the last
    window is cut to the remaining positions. Each window draws `rng.random()` then
    `rng.normal(base, std)`. (salesforce main.py's loop, `while i < L - 2`, ends instead
    when a single position remains, so in the epochs whose remainder is one position, about
    one in `bptt`, it trains on that position's target once less; we keep it, and a
    one-position window's TAR counts 0: `tflm.padding.masked_mean`.)

    Args:
        num_positions: positions to cover: stream length - 1 (every input needs a target).
        bptt: the nominal window length.
        rng: a `numpy.random.Generator`.
        short_prob: probability of the half-length base. Default 0.05.
        std: standard deviation of the length. Default 5.0.
        min_len: minimum length before the cap. Default 5.
        max_len: optional cap (MoS: bptt + 40). Default None.

    Returns:
        List of positive ints summing to `num_positions`.

    Example:

    >>> sum(window_lengths(1000, 70, np.random.default_rng(0)))
    1000
    """
    num_positions, bptt = _check_window_args(num_positions, bptt)
    short_prob, std, min_len, max_len = _check_rule(short_prob, std, min_len, max_len)
    lengths = []
    position = 0
    while position < num_positions:
        base = bptt if rng.random() < 1.0 - short_prob else bptt / 2.0
        length = max(min_len, int(rng.normal(base, std)))
        if max_len is not None:
            length = min(length, max_len)
        length = min(length, num_positions - position)
        lengths.append(length)
        position += length
    return lengths


def eval_window_lengths(num_positions, bptt):
    """Fixed BPTT window lengths for evaluation: `bptt` each, the last one shorter.

    Args:
        num_positions: positions to cover (stream length - 1).
        bptt: window length.

    Returns:
        List of ints summing to `num_positions`.

    Example:

    >>> eval_window_lengths(10, 4)
    [4, 4, 2]
    """
    num_positions, bptt = _check_window_args(num_positions, bptt)
    full, rest = divmod(num_positions, bptt)
    return [bptt] * full + ([rest] if rest else [])


def as_streams(ids_or_streams, batch_size):
    """1-D ids -> batchify; 2-D streams are used as they are (batch_size must match)."""
    array = np.asarray(ids_or_streams)
    if array.ndim == 1:
        return batchify(array, batch_size)
    if array.ndim != 2:
        raise ValueError(f"Expected 1-D token ids or 2-D streams (batch, length), got shape "
                         f"{array.shape}.")
    if batch_size is not None and array.shape[0] != batch_size:
        raise ValueError(f"The streams have {array.shape[0]} rows but batch_size is "
                         f"{batch_size}. Pass 1-D ids to batchify, or a matching batch_size.")
    if array.shape[1] < 2:
        raise ValueError(f"Streams need at least 2 time steps, got shape {array.shape}.")
    return array.astype(np.int32, copy=False)


def _lengths(num_positions, bptt, train, seed, epoch, max_len, rule):
    if not train:
        return eval_window_lengths(num_positions, bptt)
    if epoch is None:
        raise ValueError("epoch=None (fresh lengths on every iteration) is only supported by "
                         "lm_dataset; pass the epoch number to get that epoch's windows.")
    rng = np.random.default_rng([int(seed), int(epoch)])
    return window_lengths(num_positions, bptt, rng, max_len=max_len, **rule)


def window_starts(ids_or_streams, batch_size, bptt, *, train, seed=0, epoch=0, max_len=None,
                  **rule):
    """Start positions and lengths of the windows `lm_windows` yields, as int64 arrays."""
    streams = as_streams(ids_or_streams, batch_size)
    lengths = np.asarray(_lengths(streams.shape[1] - 1, bptt, train, seed, epoch, max_len, rule),
                         dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return starts[:len(lengths)], lengths


def num_windows(ids_or_streams, batch_size, bptt, *, train=False, seed=0, epoch=0,
                max_len=None, **rule):
    """Number of (x, y) windows one pass yields (for `steps_per_epoch`, progress bars).

    For training windows the count depends on the epoch's random lengths, so `epoch` must be
    an int (raises `ValueError` for None). `rule` takes `short_prob`, `std`, `min_len` as in
    `window_lengths`.
    """
    return len(window_starts(ids_or_streams, batch_size, bptt, train=train, seed=seed,
                             epoch=epoch, max_len=max_len, **rule)[1])


def lm_windows(ids_or_streams, batch_size, bptt, *, train, seed=0, epoch=0, max_len=None,
               pad_to_multiple=1, **rule):
    """Yields the (input, target) BPTT windows of one pass, as NumPy arrays.

    Rule: `x = streams[:, i:i + T]`, `y = streams[:, i + 1:i + 1 + T]`, with window lengths
    T from `window_lengths(L - 1, bptt, np.random.default_rng([seed, epoch]))` when `train`,
    else `eval_window_lengths(L - 1, bptt)`. Windows come in order; every position of every
    stream is an input exactly once.

    Args:
        ids_or_streams: 1-D token ids (batchified here) or 2-D streams (B, L).
        batch_size: number of streams B.
        bptt: nominal window length.
        train: random (True) or fixed (False) window lengths.
        seed: seed of the random lengths. Default 0.
        epoch: epoch number, mixed into the seed. Default 0.
        max_len: optional cap on training window lengths. Default None.
        pad_to_multiple: pad each window at the end to a multiple of this many positions
            (inputs `PAD_ID`, targets 0; see the module docstring). Default 1 (no padding).
        **rule: `short_prob`, `std`, `min_len` of `window_lengths` (defaults 0.05, 5.0, 5).

    Yields:
        (x, y), int32 arrays of shape (B, T) (T padded when `pad_to_multiple` > 1).

    Example:

    >>> [x.shape for x, y in lm_windows(np.arange(22), 2, 4, train=False)]
    [(2, 4), (2, 4), (2, 2)]
    """
    streams = as_streams(ids_or_streams, batch_size)
    starts, lengths = window_starts(streams, batch_size, bptt, train=train, seed=seed,
                                    epoch=epoch, max_len=max_len, **rule)
    padded_length(1, pad_to_multiple)  # validates it before the first window
    for start, length in zip(starts.tolist(), lengths.tolist()):
        yield cut_window(streams, start, length, pad_to_multiple)


def cut_window(streams, start, length, pad_to_multiple=1):
    """The window (x, y) at `start` of `length` positions of `streams` (B, L):
    `x = streams[:, start:start + length]`, y one position on, contiguous, padded as
    `pad_window` pads."""
    return pad_window(np.ascontiguousarray(streams[:, start:start + length]),
                      np.ascontiguousarray(streams[:, start + 1:start + 1 + length]),
                      pad_to_multiple)


def lm_dataset(ids_or_streams, batch_size, bptt, *, train, seed=0, epoch=0, max_len=None,
               short_prob=0.05, std=5.0, min_len=5, pad_to_multiple=1):
    """A `tf.data.Dataset` of BPTT windows (no Python generators, no shuffling).

    With an int `epoch` (or `train=False`) it yields exactly the windows of `lm_windows` for
    the same arguments: the (start, length) pairs are computed with NumPy and each element
    slices a constant streams tensor. With `epoch=None` and `train=True` the lengths are drawn
    in the pipeline instead, afresh on every iteration over the dataset (so
    `model.fit(ds, epochs=n)` sees new windows each epoch), reproducibly from `seed`:
    `Dataset.random(seed, rerandomize_each_iteration=True)` gives one seed per window, which
    draws `u ~ U(0, 1)` and `z ~ N(0, 1)` with stateless ops; `T = max(min_len,
    int(base + std * z))` as in `window_lengths`, and a `scan` over the position cuts the
    last window. Two datasets built with the same seed give the same sequence of epochs
    (these lengths differ from the NumPy ones, which use NumPy's generator). tf.data's
    autotuning is off (`options().autotune.enabled` False): with it on, TensorFlow kept each
    finished pass's iterator alive until its tuning thread woke up.

    Args:
        ids_or_streams: 1-D token ids (batchified here) or 2-D streams (B, L).
        batch_size: number of streams B.
        bptt: nominal window length.
        train: random (True) or fixed (False) window lengths.
        seed: seed of the random lengths. Default 0.
        epoch: epoch number mixed into the seed, or None for fresh lengths per iteration.
            Default 0.
        max_len: optional cap on training window lengths (MoS: bptt + 40). Default None.
        short_prob, std, min_len: the length rule (see `window_lengths`).
        pad_to_multiple: pad each window at the end to a multiple of this many positions
            (inputs `PAD_ID`, targets 0). On JAX use `default_pad_to_multiple("jax")` (4):
            a few compiled programs instead of one per window length. Default 1.

    Returns:
        Dataset of (x, y), int32 tensors of shape (B, None); T is `tf.shape(x)[1]`.

    Example:

    >>> ds = lm_dataset(np.arange(1000), 4, 35, train=True, seed=1)       # doctest: +SKIP
    >>> x, y = next(iter(ds)); x.shape[0]                                   # doctest: +SKIP
    4
    """
    import tensorflow as tf  # deferred: tflm.data must import without TensorFlow loaded

    streams_np = as_streams(ids_or_streams, batch_size)
    batch = streams_np.shape[0]
    num_positions = streams_np.shape[1] - 1
    streams = tf.constant(streams_np, dtype=tf.int32)
    multiple = _positive_int(pad_to_multiple, "pad_to_multiple")

    if train and epoch is None:
        short_prob, std, min_len, max_len = _check_rule(short_prob, std, min_len, max_len)
        windows = _random_windows(tf, num_positions, _positive_int(bptt, "bptt"), int(seed),
                                  short_prob=short_prob, std=std, min_len=min_len,
                                  max_len=max_len)
    else:
        starts, lengths = window_starts(streams_np, batch, bptt, train=train, seed=seed,
                                        epoch=epoch, max_len=max_len, short_prob=short_prob,
                                        std=std, min_len=min_len)
        windows = tf.data.Dataset.from_tensor_slices((starts, lengths))

    def cut(start, length):
        start = tf.cast(start, tf.int32)
        length = tf.cast(length, tf.int32)
        x = tf.slice(streams, tf.stack([0, start]), tf.stack([batch, length]))
        y = tf.slice(streams, tf.stack([0, start + 1]), tf.stack([batch, length]))
        x, y = pad_window_tensors(x, y, multiple)
        return tf.ensure_shape(x, (batch, None)), tf.ensure_shape(y, (batch, None))

    # Autotuning off: its optimisation thread sleeps in doubling intervals (10 ms, 20 ms,
    # ...), and TensorFlow 2.21 destroys the iterator only when that sleep ends, so an
    # evaluate / fit pass idled after its last batch until (2^n - 1) x 10 ms had passed
    # (up to twice the work; bench/training/data_pipeline.py). Cutting a window is one slice:
    # a sequential map and two windows of prefetch keep the model fed.
    options = tf.data.Options()
    options.autotune.enabled = False
    return windows.map(cut).prefetch(2).with_options(options)


def _random_windows(tf, num_positions, bptt, seed, *, short_prob, std, min_len, max_len):
    """Dataset of (start, length), lengths redrawn on each iteration (pure tf.data)."""

    def draw(window_seed):
        pair = tf.stack([window_seed, tf.constant(0, tf.int64)])
        u = tf.random.stateless_uniform([], seed=pair, dtype=tf.float64)
        z = tf.random.stateless_normal([], seed=pair + tf.constant([0, 1], tf.int64),
                                       dtype=tf.float64)
        base = tf.where(u < 1.0 - short_prob, tf.constant(float(bptt), tf.float64),
                        tf.constant(bptt / 2.0, tf.float64))
        length = tf.maximum(tf.constant(min_len, tf.int64), tf.cast(base + std * z, tf.int64))
        if max_len is not None:
            length = tf.minimum(length, max_len)
        return length

    def step(position, length):
        length = tf.minimum(length, num_positions - position)
        return position + length, (position, length)

    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    return (seeds.map(draw)
            .scan(tf.constant(0, tf.int64), step)
            .take_while(lambda start, length: start < num_positions))
