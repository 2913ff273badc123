"""`tflm.backends.compiled_lengths`: the ski-rental choice of the length a window runs at
(pad to a compiled length or compile its own), the padding, and JAX training with it."""

import json

import numpy as np
import pytest

from tests.backends import run_in_backend
from tflm.backends.compiled_lengths import CompiledLengths, padding_steps

KEY = (4,)  # batch 4, token windows


def _run(policy, lengths, compile_seconds, step_seconds_per_position):
    """Feed `lengths` through `policy` with the given costs; returns (cost, compiles)."""
    cost, compiles = 0.0, 0
    for length in lengths:
        target, compiles_now = policy.choose(KEY, length)
        assert target >= length
        if compiles_now:
            assert target == length
            policy.compiled(KEY, length, compile_seconds)
            cost += compile_seconds
            compiles += 1
        elif policy.needs_measuring(KEY, target):
            policy.measured(KEY, target, step_seconds_per_position * target)
        cost += step_seconds_per_position * (target - length)  # what padding wasted
    return cost, compiles


def test_first_length_compiles_shorter_ones_pad_longer_ones_compile():
    policy = CompiledLengths()
    assert policy.choose(KEY, 36) == (36, True)
    policy.compiled(KEY, 36, 4.0)
    assert policy.choose(KEY, 36) == (36, False) and policy.needs_measuring(KEY, 36)
    policy.measured(KEY, 36, 0.18)  # 5 ms a position
    assert not policy.needs_measuring(KEY, 36)
    assert policy.choose(KEY, 32) == (36, False)  # 4 positions: 20 ms of 4 s
    assert policy.choose(KEY, 40) == (40, True)  # nothing longer compiled
    assert policy.choose((8,), 32) == (32, True)  # another batch size: its own programs


def test_no_program_is_compiled_shorter_than_shortest():
    """`shortest`: one program at a length the later windows fit (zoo.train: bptt + 3.5 std
    of the window rule), a longer window its own; no timing enters the choice."""
    from tflm.data import covering_length, window_lengths
    policy = CompiledLengths(shortest=52)
    assert policy.choose(KEY, 36) == (52, True)
    policy.compiled(KEY, 52, 4.0)
    assert policy.choose(KEY, 30) == (52, False)
    assert policy.choose(KEY, 55) == (55, True)
    policy.compiled(KEY, 55, 4.0)
    assert policy.choose(KEY, 54) == (54, True)  # its own length, not padded to 55
    # whatever the measured times: the same windows pad the same way (cold or warm cache)
    policy.measured(KEY, 52, 0.01)
    for _ in range(100):
        assert policy.choose(KEY, 40) == (52, False)
    assert covering_length(35) == 53 and covering_length(35, max_len=40) == 40
    lengths = window_lengths(1_000_000, 35, np.random.default_rng(0))
    longer = np.mean(np.array(lengths) > covering_length(35))
    assert 0 < longer < 1e-3, longer  # the normal tail beyond 3.5 std: 2.3e-4


def test_a_length_is_compiled_once_its_padding_has_cost_a_compile():
    policy = CompiledLengths()
    policy.compiled(KEY, 40, 1.0)
    policy.measured(KEY, 40, 0.4)  # 10 ms a position: padding 32 -> 40 wastes 80 ms
    choices = [policy.choose(KEY, 32) for _ in range(13)]
    assert choices[:12] == [(40, False)] * 12  # 12 x 80 ms = 0.96 s < 1 s
    assert choices[12] == (32, True)  # the 13th would pass the price of a compile


def test_unmeasured_steps_pad_without_counting_and_the_warm_cache_compiles_at_once():
    policy = CompiledLengths()
    policy.compiled(KEY, 40, 4.0)
    assert policy.choose(KEY, 28) == (40, False)  # this run measures the 40 step
    policy.measured(KEY, 40, 0.2)
    policy.compiled(KEY, 48, 0.0)  # a cache hit: compiling is free now (mean 2 s)
    policy._compile_seconds[:] = [0.001]
    assert policy.choose(KEY, 28) == (28, True)


def _offline_optimum(lengths, compile_seconds, per_position):
    """The least cost of any fixed set of compiled lengths knowing every window in advance:
    each window padded to the shortest length of the set that holds it (dynamic
    programming over the sorted distinct lengths)."""
    values = sorted(set(lengths))
    counts = {v: lengths.count(v) for v in values}
    best = []
    for j, top in enumerate(values):
        options = []
        for i in range(-1, j):
            below = 0.0 if i < 0 else best[i]
            waste = sum(counts[v] * (top - v) for v in values[i + 1:j + 1])
            options.append(below + compile_seconds + per_position * waste)
        best.append(min(options))
    return best[-1]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("windows", [150, 1500])
def test_online_choice_costs_at_most_twice_the_offline_optimum(seed, windows):
    """AWD-LSTM's window lengths (N(35, 5) padded to a multiple of 4) in random order,
    compiles of 4 s against 5 ms a step per position (this CPU's ratio): the online rule
    pays at most twice what the best fixed set of lengths chosen in hindsight pays
    (1.1-1.9x seen), and fewer compiles than one per distinct length."""
    rng = np.random.default_rng(seed)
    lengths = [int(np.ceil(max(5.0, rng.normal(35, 5)) / 4) * 4) for _ in range(windows)]
    cost, compiles = _run(CompiledLengths(), lengths, 4.0, 0.005)
    assert cost <= 2 * _offline_optimum(lengths, 4.0, 0.005)
    assert compiles < len(set(lengths))


def test_padding_steps_pads_batches_and_times_new_programs():
    x = np.arange(12, dtype="int32").reshape(2, 6)
    y = x + 1
    seen, blocked = [], []

    def step(state, iterator):
        batch = next(iterator)
        seen.append(batch)
        return {"loss": 0.0}, state

    policy = CompiledLengths()
    policy.compiled((2,), 8, 3.0)
    wrapped = padding_steps(step, policy, blocked.append, pad_id=-1)
    wrapped("state", iter([(x, y)]))
    px, py = seen[-1]
    assert px.shape == py.shape == (2, 8)  # padded up to the compiled 8
    np.testing.assert_array_equal(px[:, :6], x)
    assert (px[:, 6:] == -1).all() and (py[:, 6:] == 0).all()
    assert blocked == ["state", ({"loss": 0.0}, "state")]  # the 8 step timed alone
    assert policy.programs((2,))[8] is not None
    wrapped("state", iter([(x[:, :2], y[:, :2], None)]))  # 2 -> 8: 6 x 1/8 of a step, pads
    assert seen[-1][0].shape == (2, 8) and seen[-1][2] is None
    wrapped("state", iter([(x.astype("float32"), y)]))  # not token windows: untouched
    assert seen[-1][0].dtype == np.float32 and seen[-1][0].shape == (2, 6)


def test_jax_training_pads_to_compiled_lengths_with_the_same_weights():
    """A tiny AWD-LSTM (dropouts on) trained on windows of 12 positions and a last one of
    5, with and without `pad_to_compiled_lengths`: one program instead of two (the last
    window runs padded to 12), and the same weights (the padded positions are masked out
    and no dropout mask depends on the window length)."""
    out = run_in_backend("jax", """
        import json
        import keras, numpy as np
        from tflm import data
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

        def train(pad):
            keras.utils.set_random_seed(5)
            model = AWDLSTM(vocab_size=50, embed_dim=8, hidden_dim=16, num_layers=2, bptt=12,
                            dropout=0.3, dropout_h=0.2, dropout_i=0.3, dropout_e=0.1,
                            weight_dropout=0.4, seed=5)
            model.compile(optimizer="sgd")
            model.pad_to_compiled_lengths = pad
            ids = np.random.default_rng(0).integers(0, 50, 4 * (4 * 12 + 5 + 1))
            ds = data.lm_dataset(ids, 4, 12, train=False)
            model.fit(ds, epochs=1, verbose=0)
            lengths = [int(x.shape[1]) for x, _ in ds]
            return model, lengths

        padded, lengths = train(True)
        exact, _ = train(False)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(
            [keras.ops.convert_to_numpy(v) for v in padded.trainable_variables],
            [keras.ops.convert_to_numpy(v) for v in exact.trainable_variables]))
        print(json.dumps([lengths, padded.traced_steps["train"],
                          exact.traced_steps["train"], diff]))
    """)
    lengths, padded_traces, exact_traces, diff = json.loads(out.strip().splitlines()[-1])
    assert lengths == [12, 12, 12, 12, 5]
    assert (padded_traces, exact_traces) == (1, 2)
    assert diff < 1e-5


@pytest.mark.slow  # 10 s; in CI: test_data_parallel's one training program
def test_batches_already_on_the_device_are_padded_there_too():
    """Keras' JAX trainer hands the step each batch as a `jax.Array` on a GPU (its
    one-batch-ahead `device_put`) and under a `keras.distribution`; those were passed on
    unpadded, so every window length compiled a program of its own. Under `DataParallel` on
    two host devices (the same path on a CPU), two epochs of random window lengths at the
    covering length `zoo.train` sets compile one training program, and `pad_batch` pads a
    device array on the device with the pad id and zeros."""
    out = run_in_backend("jax", """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import json
        import jax, jax.numpy as jnp, keras, numpy as np
        from tflm import data, distribute
        from tflm.backends.compiled_lengths import pad_batch, window_shape
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

        x = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
        padded = pad_batch((x, x, jnp.ones((2, 3))), 5, 0)
        kinds = [type(a).__module__.split(".")[0] for a in padded]
        values = [np.asarray(a).tolist() for a in padded]

        distribute.data_parallel(batch_sizes=(8,))
        model = AWDLSTM(vocab_size=50, embed_dim=8, hidden_dim=16, num_layers=2, bptt=70)
        model.compile(optimizer=keras.optimizers.SGD(1.0))
        model.pad_to_compiled_lengths, model.padded_windows = True, True
        model.shortest_compiled_length = data.padded_length(data.covering_length(70), 4)
        ids = np.random.default_rng(0).integers(0, 50, 8 * 70 * 30).astype("int32")
        lengths = set()
        for epoch in range(2):
            train = data.lm_batches(ids, 8, 70, train=True, seed=1, epoch=epoch,
                                    pad_to_multiple=4)
            lengths |= {int(train[i][0].shape[1]) for i in range(len(train))}
            model.fit(train, epochs=1, verbose=0)
        print(json.dumps([window_shape((x, x)), kinds, values, len(lengths),
                          model.traced_steps["train"]]))
    """)
    window, kinds, values, lengths, traces = json.loads(out.strip().splitlines()[-1])
    assert window == [[2], 3] and kinds == ["jaxlib", "jaxlib", "jaxlib"]
    assert values[0] == [[0, 1, 2, 0, 0], [3, 4, 5, 0, 0]]
    assert values[2] == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert lengths > 3 and traces == 1
