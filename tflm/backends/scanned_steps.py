"""Several training steps in one compiled program and one dispatch (JAX).

Keras' JAX trainer runs `compile(steps_per_execution=k)` as a Python loop that calls the
jitted one-step program k times, so the host still dispatches every step. On a GPU a
batch-20 AWD-LSTM step is latency-bound: issue 41's lent H200 was busy 12.5 ms of the 16.9
ms `zoo.train` took a step (`bench/results/gpu_session.md`), the rest the host's work
between dispatches. `scanned_steps` runs the k steps inside one program instead,

    (logs, state) = scan(step, state, windows[0..k-1])     one jax.jit, one dispatch

with the k windows padded to one length (`tflm.backends.compiled_lengths`: positions
holding `PAD_ID`, masked out of everything by `tflm.LanguageModel`) and stacked on a new
leading axis. The last group of an epoch may hold fewer than k windows: its empty slots
run on all-`PAD_ID` windows and their results are dropped (`jnp.where` on the slot's
flag), so one program serves every group, and the state and the logs are those of the
last real window. A window of `PAD_ID` alone costs little where the LSTM and output layer
stop at a window's last real position (JAX's LSTM and its softmax and MoS output layers in
training: `extent_loop`, `jax_target_log_probs`, `jax_mixture_target_log_probs`), and a
whole step for a head that computes every position: at most k - 1 such steps an epoch,
against one less dispatch a window. `lax.cond` would
skip them, but on a GPU XLA copies a conditional's predicate to the host and waits for the
stream (openxla/xla, `backends/gpu/runtime/conditional_thunk.cc`), a wait for the device at
every slot, which is what the scan is there to remove; the scan itself, a loop of known
trip count, runs its body without reading anything back (`while_thunk.cc`). Evaluation keeps
Keras' loop (`JaxBackend.make_test_function`): its passes have few windows.

The updates are those of k single steps in order (the same state flows from window to
window: weights, optimizer slots, carried LSTM state, seed generator, metrics);
`tests/tflm/backends/test_scanned_steps.py` checks the weights against k single steps.
Callbacks then see a batch end every k windows, as with Keras' own `steps_per_execution`.
"""

import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

from tflm.backends.compiled_lengths import pad_batch, window_shape


def _stack(batches, slots, pad_id):
    """`(x, y[, w])` of `slots` windows stacked on a new axis 0: the `batches` (of one
    length), then all-`pad_id` windows (targets and weights 0) for the empty slots."""
    xp = np if isinstance(batches[0][0], np.ndarray) else jnp
    stacked = []
    for i, first in enumerate(batches[0]):
        if first is None:
            stacked.append(None)
            continue
        parts = [b[i] for b in batches]
        fill = pad_id if i == 0 else 0
        parts += [xp.full(first.shape, fill, first.dtype)] * (slots - len(batches))
        stacked.append(xp.stack(parts))
    return tuple(stacked)


def _program(step, slots):
    """`(state, windows, count) -> (logs, state)`: `step` over the `slots` stacked windows,
    the results of the slots from `count` on dropped."""

    def run(state, windows, count):
        def body(state, xs):
            window, slot = xs
            logs, new_state = step(state, window)
            keep = slot < count
            new_state = jax.tree_util.tree_map(
                lambda new, old: jnp.where(keep, new, old), new_state, state)
            return new_state, logs

        state, logs = jax.lax.scan(body, state, (windows, jnp.arange(slots)))
        return jax.tree_util.tree_map(lambda each: each[count - 1], logs), state

    return jax.jit(run, donate_argnums=0)


def next_groups(iterator, slots, lengths, pad_id):
    """The next `slots` batches of `iterator` (fewer at the end; none: `[]`) as programs'
    inputs, padded to the length `lengths` chooses: one `(stacked windows, count, (key,
    length, compiles))` per run of batches of one batch size (more than one where a batch
    size changes: an epoch's last, smaller batch)."""
    batches = list(itertools.islice(iterator, slots))
    windows = [window_shape(b) for b in batches]
    if any(w is None for w in windows):
        raise ValueError(
            "steps_per_execution > 1 on JAX stacks each group of batches into one program, "
            "so every batch must be a tuple of token windows (x, y[, sample_weight]: "
            "integer x of shape (batch, time)); got "
            f"{[type(b).__name__ for b in batches]}. Use steps_per_execution=1 for other "
            "data.")
    groups = []
    for shape, run in itertools.groupby(zip(batches, windows), key=lambda bw: bw[1][0]):
        run = [(batch, n) for batch, (_, n) in run]
        key = ("steps", slots) + shape
        length, compiles = lengths.choose(key, max(n for _, n in run))
        padded = [tuple(b) if n == length else pad_batch(b, length, pad_id) for b, n in run]
        groups.append((_stack(padded, slots, pad_id), len(padded), (key, length, compiles)))
    return groups


def scanned_steps(step, slots, lengths, block, pad_id):
    """A Keras JAX step function `(state, iterator) -> (logs, state)` that reads `slots`
    batches from the iterator and runs `step` `(state, batch) -> (logs, state)` on them in
    one jitted scan (one per batch size among them); `lengths` (a `CompiledLengths`)
    chooses each group's length, `block` waits for arrays (`jax.block_until_ready`, to
    time a program's first warm call)."""
    program = _program(step, slots)

    def function(state, iterator):
        groups = next_groups(iterator, slots, lengths, pad_id)
        if not groups:
            raise StopIteration
        for windows, count, (key, length, compiles) in groups:
            measuring = not compiles and lengths.needs_measuring(key, length)
            if measuring:
                block(state)
            start = time.perf_counter()
            logs, state = program(state, windows, np.int32(count))
            if compiles:
                lengths.compiled(key, length, time.perf_counter() - start)
            elif measuring:
                block((logs, state))
                lengths.measured(key, length, time.perf_counter() - start)
        return logs, state

    return function
