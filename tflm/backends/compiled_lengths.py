"""Which length a window runs at where every new length compiles a new program (JAX).

`jax.jit` compiles the train step once per input shape. AWD-LSTM's random window lengths,
even padded to a multiple of 4, make about ten lengths an epoch (bptt 35), and one compile
of the 200 / 400 x 3 PTB model's step takes 2-4 s on the 2-core CPU of bench/training/results/reference_throughput.md
against ~0.1-0.15 s a step. A window padded to a longer length that is compiled already
(positions holding `PAD_ID`, which `tflm.LanguageModel` masks out of everything: loss,
carried state, AR / TAR, the T / bptt scaling) gives the same update as at its own
length, at the cost of the padded positions' compute.

`CompiledLengths` decides per window, as the ski-rental rule does (rent until the rent
paid reaches the price, then buy):

    length compiled already                  run it
    no longer length compiled                compile this length
    else, L' the shortest compiled length > L:
        waste = s (L' - L)                   s: measured seconds a step per position
        if spent(L) + waste < C              C: measured seconds of a compile
            pad to L', spent(L) += waste
        else                                 compile L

so a length pays at most twice what the better of "always pad" and "compile at once"
would have paid for it, whatever the order the lengths come in. Over a long run every
frequent length ends up compiled; a short run (one epoch, a search trial) compiles a few.
With JAX's persistent compilation cache warm (`zoo.runtime.compilation_cache`), a "compile" is
tracing the step and loading the program (0.6-0.7 s for the PTB model), C is small, and
lengths are compiled sooner.

`shortest` replaces that rule: a window no longer than `shortest` runs padded to it, a
longer one at its own length (compiled the first time it comes). Where a padded position
costs little (JAX's softmax output layer and LSTM loops stop at a window's last real
position: `tflm.backends.jax_target_log_probs`, `extent_loop`), one program at a length
nearly every window fits (`python -m zoo.train`: bptt + 3.5 times the window-length rule's
standard deviation) serves the run. The choice then depends on the windows alone, not on
measured times: the ski-rental rule compiles sooner with a warm compilation cache, and a
window run at another padded length is summed in another float order, so two runs of the
same seed (cold and warm cache) trained to validation perplexities 761 and 786 after one
epoch of bench/training/reference_throughput.py's configuration.

Lengths are kept per shape with the time axis left out (another batch size is another
program). C is the mean duration of the calls that compiled (tracing and compiling; the
step itself runs asynchronously after them); s is measured on the second call of a
program, between blocking on its inputs and on its outputs (`block`).

`padding_steps(step_function, lengths, block, pad_id)` wraps a Keras step function
`(state, iterator) -> (logs, state)` (`steps_per_execution` 1) so that each batch
`(x, y[, sample_weight])` is padded at the end of the time axis (x with `pad_id`, y and the
weights with 0) to the length `lengths` chooses: NumPy arrays on the host, and the
`jax.Array`s Keras' JAX trainer puts on the device before the step (on a GPU, and under a
`keras.distribution`) where they are. Those once passed unpadded, so each window length
compiled its own program there: 8 and 10 train-step traces in two epochs under
`DataParallel` on two host devices, against 1.
"""

import statistics
import time

import numpy as np


class CompiledLengths:
    """The ski-rental choice of a window length (see the module docstring); with
    `shortest`, the fixed rule instead: a window no longer than `shortest` runs at
    `shortest`, a longer one at its own length."""

    def __init__(self, shortest=0):
        self.shortest = int(shortest or 0)
        self._programs = {}  # shape key -> {length: seconds per position or None}
        self._compile_seconds = []
        self._spent = {}  # (shape key, length) -> seconds spent padding it

    def programs(self, key):
        """`{length: measured seconds per position or None}` compiled for `key`."""
        return dict(self._programs.get(key, {}))

    def choose(self, key, length):
        """`(length to run at, whether that compiles a program)` for a window of `length`
        positions whose other dimensions are `key`."""
        programs = self._programs.setdefault(key, {})
        if self.shortest:
            target = max(length, self.shortest)
            return target, target not in programs
        if length in programs:
            return length, False
        longer = [other for other in programs if other > length]
        if not longer:
            return length, True
        target = min(longer)
        per_position = self._seconds_per_position()
        if per_position is None:  # nothing measured yet: this run measures `target`
            return target, False
        spent = self._spent.get((key, length), 0.0) + per_position * (target - length)
        if spent >= statistics.fmean(self._compile_seconds):
            return length, True
        self._spent[(key, length)] = spent
        return target, False

    def compiled(self, key, length, seconds):
        """Record that the call running `length` compiled it, taking `seconds`."""
        self._programs.setdefault(key, {})[length] = None
        self._compile_seconds.append(float(seconds))

    def needs_measuring(self, key, length):
        """Whether the next step at `length` should be timed (compiled, not yet timed;
        never with `shortest`, whose rule reads no time: no wait on the device for it)."""
        return not self.shortest and self._programs.get(key, {}).get(length, 0.0) is None

    def measured(self, key, length, seconds):
        """Record one step at `length` that took `seconds`."""
        self._programs.setdefault(key, {})[length] = float(seconds) / length

    def _seconds_per_position(self):
        values = [v for programs in self._programs.values() for v in programs.values()
                  if v is not None]
        return statistics.median(values) if values else None


def pad_batch(batch, length, pad_id):
    """`(x, y[, w])` with the time axis (1) padded at the end to `length`: NumPy arrays
    with NumPy, arrays on a device (JAX's) where they are, with `jnp.pad`."""
    x = batch[0]
    width = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    if isinstance(x, np.ndarray):
        pad = np.pad
    else:
        import jax.numpy as jnp  # deferred: device arrays are JAX's
        pad = jnp.pad
    padded = [pad(x, width, constant_values=pad_id)]
    for array in batch[1:]:
        padded.append(None if array is None else pad(
            array, width[:array.ndim], constant_values=0))
    return tuple(padded)


def _is_array(a):
    """A NumPy array or a device array (a `jax.Array`: Keras' JAX trainer puts each batch on
    the device before the step on a GPU and under a `keras.distribution`)."""
    return (isinstance(a, np.ndarray)
            or (hasattr(a, "shape") and hasattr(a, "dtype") and hasattr(a, "ndim")
                and type(a).__module__.startswith(("jax", "jaxlib"))))


def window_shape(batch):
    """`(shape key, length)` of a batch of token windows this module pads, else None."""
    if not isinstance(batch, (tuple, list)) or not batch:
        return None
    x = batch[0]
    arrays = [a for a in batch if a is not None]
    if not (_is_array(x) and x.ndim >= 2 and np.issubdtype(np.dtype(x.dtype), np.integer)
            and all(_is_array(a) and a.ndim >= 2 and a.shape[:2] == x.shape[:2]
                    for a in arrays)):
        return None
    return (x.shape[0],) + tuple(x.shape[2:]), x.shape[1]


class _PaddedBatches:
    """The iterator a step function reads, each batch padded to the chosen length."""

    def __init__(self, iterator, lengths, block, state, pad_id):
        self._iterator, self._lengths, self._block = iterator, lengths, block
        self._state, self._pad_id = state, pad_id
        self.ran = None  # (key, length, compiles, start) of the batch handed out

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._iterator)
        window = window_shape(batch)
        if window is None:
            return batch
        key, length = window
        target, compiles = self._lengths.choose(key, length)
        if not compiles and self._lengths.needs_measuring(key, target):
            self._block(self._state)  # time this step alone
        self.ran = (key, target, compiles, time.perf_counter())
        return batch if target == length else pad_batch(batch, target, self._pad_id)


def padding_steps(step_function, lengths, block, pad_id):
    """`step_function` `(state, iterator) -> (logs, state)` with its batches padded to the
    lengths `lengths` (a `CompiledLengths`) chooses; `block(tree)` waits for the arrays in
    `tree` (`jax.block_until_ready`)."""

    def function(state, iterator):
        batches = _PaddedBatches(iterator, lengths, block, state, pad_id)
        outputs = step_function(state, batches)
        if batches.ran is not None:
            key, length, compiles, start = batches.ran
            if compiles:
                lengths.compiled(key, length, time.perf_counter() - start)
            elif lengths.needs_measuring(key, length):
                block(outputs)
                lengths.measured(key, length, time.perf_counter() - start)
        return outputs

    function.lengths = lengths
    return function
