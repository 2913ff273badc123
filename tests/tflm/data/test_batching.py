"""batchify, BPTT window lengths, NumPy windows and the tf.data pipeline."""

import numpy as np
import pytest

from tests.backends import run_in_backend
from tflm.data import (batchify, eval_window_lengths, lm_dataset, lm_windows, num_windows,
                       window_lengths)


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    """Skip conftest's per-test clear_session (0.2 s each): only the fit test builds Keras
    state, and it clears the session itself."""
    yield

# --- batchify -------------------------------------------------------------------------------


def test_batchify_shape_trim_and_contiguous_rows():
    ids = np.arange(23)
    streams = batchify(ids, 4)
    assert streams.shape == (4, 5) and streams.dtype == np.int32
    for b in range(4):
        np.testing.assert_array_equal(streams[b], ids[b * 5:(b + 1) * 5])
    assert 20 not in streams  # the tail 20, 21, 22 is trimmed


def test_batchify_errors():
    with pytest.raises(ValueError, match="at least 2 \\* batch_size = 8 tokens"):
        batchify(np.arange(7), 4)
    assert batchify(np.arange(8), 4).shape == (4, 2)
    with pytest.raises(ValueError, match="positive integer, got 0"):
        batchify(np.arange(10), 0)
    with pytest.raises(ValueError, match="1-D"):
        batchify(np.zeros((2, 5)), 2)


# --- window lengths -------------------------------------------------------------------------


def _reference_lengths(num_positions, bptt, rng, max_len=None):
    """The rule as written in the AWD-LSTM / MoS training loops."""
    out, i = [], 0
    while i < num_positions:
        base = bptt if rng.random() < 0.95 else bptt / 2.
        seq_len = max(5, int(rng.normal(base, 5)))
        if max_len is not None:
            seq_len = min(seq_len, max_len)
        seq_len = min(seq_len, num_positions - i)
        out.append(seq_len)
        i += seq_len
    return out


def test_window_lengths_follow_the_awd_lstm_rule_exactly():
    got = window_lengths(10_000, 70, np.random.default_rng(7))
    assert got == _reference_lengths(10_000, 70, np.random.default_rng(7))
    assert sum(got) == 10_000
    capped = window_lengths(10_000, 70, np.random.default_rng(7), max_len=72)
    assert capped == _reference_lengths(10_000, 70, np.random.default_rng(7), max_len=72)
    assert got != window_lengths(10_000, 70, np.random.default_rng(8))


def test_window_lengths_statistics():
    lengths = np.array(window_lengths(600_000, 70, np.random.default_rng(0))[:-1])
    short = lengths < 52  # N(35, 5) vs N(70, 5): the midpoint separates them
    assert abs(short.mean() - 0.05) < 0.012, short.mean()
    # int() truncates, so the mean of int(N(70, 5)) is about 69.5.
    assert abs(lengths[~short].mean() - 69.5) < 0.25 and abs(lengths[short].mean() - 34.5) < 1.0
    assert abs(lengths[~short].std() - 5) < 0.3
    wide = np.array(window_lengths(100_000, 20, np.random.default_rng(1), std=15.0)[:-1])
    assert wide.min() == 5 and (wide == 5).mean() > 0.1  # max(5, ...) clamps often
    capped = np.array(window_lengths(100_000, 70, np.random.default_rng(2), max_len=72))
    assert capped.max() == 72 and (capped == 72).mean() > 0.2
    assert window_lengths(3, 70, np.random.default_rng(0)) == [3]
    assert window_lengths(0, 70, np.random.default_rng(0)) == []


def test_window_lengths_validate_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="bptt must be a positive integer, got 0"):
        window_lengths(100, 0, rng)
    with pytest.raises(ValueError, match="short_prob"):
        window_lengths(100, 70, rng, short_prob=1.5)
    with pytest.raises(ValueError, match="min_len"):
        window_lengths(100, 70, rng, min_len=0)


def test_eval_window_lengths_cover_every_position_once():
    assert eval_window_lengths(10, 4) == [4, 4, 2]
    assert eval_window_lengths(12, 4) == [4, 4, 4]
    assert eval_window_lengths(3, 70) == [3]
    for n, bptt in [(46_478, 70), (1, 1), (100, 7)]:
        lengths = eval_window_lengths(n, bptt)
        assert sum(lengths) == n and all(0 < t <= bptt for t in lengths)
        assert all(t == bptt for t in lengths[:-1])


# --- NumPy windows --------------------------------------------------------------------------


def _check_covers_streams(windows, streams):
    xs = np.concatenate([x for x, _ in windows], axis=1)
    ys = np.concatenate([y for _, y in windows], axis=1)
    np.testing.assert_array_equal(xs, streams[:, :-1])
    np.testing.assert_array_equal(ys, streams[:, 1:])
    for x, y in windows:  # y is x shifted by one, within each window
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("train", [True, False])
def test_lm_windows_are_contiguous_streams(train):
    ids = np.random.default_rng(0).integers(0, 50, size=4_003)
    streams = batchify(ids, 5)
    windows = list(lm_windows(ids, 5, 35, train=train, seed=1, epoch=3))
    assert all(x.shape == y.shape and x.shape[0] == 5 and x.dtype == np.int32
               for x, y in windows)
    _check_covers_streams(windows, streams)
    if train:
        lengths = [x.shape[1] for x, _ in windows]
        expected = window_lengths(streams.shape[1] - 1, 35, np.random.default_rng([1, 3]))
        assert lengths == expected
    else:
        assert [x.shape[1] for x, _ in windows] == eval_window_lengths(799, 35)
    assert len(windows) == num_windows(ids, 5, 35, train=train, seed=1, epoch=3)


def test_lm_windows_epochs_and_seeds():
    ids = np.arange(20_000) % 97

    def lengths(**kw):
        return [x.shape[1] for x, _ in lm_windows(ids, 4, 70, train=True, **kw)]

    assert lengths(seed=0, epoch=0) == lengths(seed=0, epoch=0)
    assert lengths(seed=0, epoch=0) != lengths(seed=0, epoch=1)
    assert lengths(seed=0, epoch=0) != lengths(seed=1, epoch=0)
    assert max(lengths(seed=0, epoch=0, max_len=60)) == 60


def test_lm_windows_accept_streams_and_check_batch_size():
    streams = batchify(np.arange(100), 4)
    a = list(lm_windows(streams, 4, 10, train=False))
    b = list(lm_windows(np.arange(100), 4, 10, train=False))
    assert all((x1 == x2).all() for (x1, _), (x2, _) in zip(a, b)) and len(a) == len(b)
    with pytest.raises(ValueError, match="4 rows but batch_size is 5"):
        next(lm_windows(streams, 5, 10, train=False))
    with pytest.raises(ValueError, match="only supported by lm_dataset"):
        next(lm_windows(streams, 4, 10, train=True, epoch=None))
    with pytest.raises(ValueError, match="epoch"):
        num_windows(streams, 4, 10, train=True, epoch=None)


# --- tf.data --------------------------------------------------------------------------------


def _as_numpy(dataset):
    return [(x.numpy(), y.numpy()) for x, y in dataset]


@pytest.mark.parametrize("train", [True, False])
def test_lm_dataset_equals_numpy_windows(train):
    import tensorflow as tf

    ids = np.random.default_rng(1).integers(0, 1000, size=6_007)
    ds = lm_dataset(ids, 6, 35, train=train, seed=5, epoch=2, max_len=45)
    spec = ds.element_spec
    assert spec[0].shape.as_list() == [6, None] and spec[0].dtype == tf.int32
    assert spec[1].shape.as_list() == [6, None] and spec[1].dtype == tf.int32
    got = _as_numpy(ds)
    want = list(lm_windows(ids, 6, 35, train=train, seed=5, epoch=2, max_len=45))
    assert len(got) == len(want) > 10
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)
    assert _as_numpy(ds)[3][0].tolist() == got[3][0].tolist()  # a fixed epoch repeats


def test_lm_dataset_fresh_windows_each_iteration_and_reproducible():
    ids = np.random.default_rng(2).integers(0, 100, size=8_000)
    streams = batchify(ids, 4)
    ds = lm_dataset(ids, 4, 30, train=True, seed=11, epoch=None, max_len=40)
    assert ds.element_spec[0].shape.as_list() == [4, None]
    first, second = _as_numpy(ds), _as_numpy(ds)
    _check_covers_streams(first, streams)
    _check_covers_streams(second, streams)
    lengths = [[x.shape[1] for x, _ in epoch] for epoch in (first, second)]
    assert lengths[0] != lengths[1]
    for epoch in lengths:
        assert min(epoch[:-1]) >= 5 and max(epoch) <= 40
        assert 25 < np.mean(epoch[:-1]) < 35
    same = lm_dataset(ids, 4, 30, train=True, seed=11, epoch=None, max_len=40)
    assert [[x.shape[1] for x, _ in _as_numpy(same)] for _ in range(2)] == lengths
    other = lm_dataset(ids, 4, 30, train=True, seed=12, epoch=None, max_len=40)
    assert [x.shape[1] for x, _ in _as_numpy(other)] != lengths[0]


def test_lm_dataset_random_lengths_follow_the_rule():
    ids = np.zeros(200_002, dtype=np.int32)
    ds = lm_dataset(ids, 1, 70, train=True, seed=0, epoch=None)
    lengths = np.array([int(x.shape[1]) for x, _ in ds][:-1])
    short = lengths < 52
    assert abs(short.mean() - 0.05) < 0.02, short.mean()
    assert abs(lengths[~short].mean() - 69.5) < 0.5 and abs(lengths[~short].std() - 5) < 0.5


@pytest.mark.filterwarnings("ignore:Your input ran out of data", "ignore:`shuffle=True`")
def test_model_fit_sees_new_windows_each_epoch():
    import keras

    keras.utils.clear_session()
    epochs = []  # per epoch: list of (window length, first token of stream 0)

    class Recorder(keras.Model):
        def __init__(self):
            super().__init__()
            self.embed = keras.layers.Embedding(50, 4)
            self.out = keras.layers.Dense(50)

        def call(self, x):
            return self.out(self.embed(x))

        def train_step(self, data):
            x, _ = data
            epochs[-1].append((int(x.shape[1]), int(x[0, 0])))
            return super().train_step(data)

    class NewEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs.append([])

    ids = np.random.default_rng(3).integers(0, 50, size=2_000)
    model = Recorder()
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    ds = lm_dataset(ids, 2, 70, train=True, seed=0, epoch=None)
    model.fit(ds, epochs=3, verbose=0, callbacks=[NewEpoch()])
    assert len(epochs) == 3
    for windows in epochs:  # every epoch is one full pass, starting at the stream start
        assert sum(length for length, _ in windows) == 1_000 - 1
        assert windows[0][1] == ids[0]
    lengths = [[length for length, _ in windows] for windows in epochs]
    assert lengths[0] != lengths[1] and lengths[1] != lengths[2]


def test_import_does_not_load_tensorflow():
    out = run_in_backend("jax", """
        import sys
        import tflm.data
        from tflm.data import lm_windows, load_corpus, synthetic
        print("tensorflow" in sys.modules)
    """, fresh=True)  # what importing tflm.data loads: nothing imported before it
    assert out.strip() == "False"


def test_lm_dataset_runs_without_tf_data_autotuning():
    # Autotuning's thread kept each finished evaluate / fit pass alive until its doubling
    # sleep ended (bench/training/data_pipeline.py); the pipeline must keep it off, also after
    # a user's own options are merged in.
    import tensorflow as tf
    ds = lm_dataset(np.arange(500), 4, 10, train=False)
    assert ds.options().autotune.enabled is False
    user = tf.data.Options()
    user.deterministic = True
    assert ds.with_options(user).options().autotune.enabled is False
    assert len(list(ds)) == num_windows(np.arange(500), 4, 10)
