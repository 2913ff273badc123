"""tflm.data.WindowSequence (the PyDataset pipeline JAX and PyTorch use, no TensorFlow)
yields exactly the windows of lm_windows and of lm_dataset for the same arguments; fit and
evaluate take it on the running backend; lm_batches picks tf.data only on TensorFlow."""

import keras
import numpy as np
import pytest

from tflm import data

ARGS = [dict(train=False), dict(train=True, seed=7, epoch=0), dict(train=True, seed=7, epoch=3),
        dict(train=True, seed=7, epoch=1, max_len=12, pad_to_multiple=4),
        dict(train=False, pad_to_multiple=8)]


@pytest.mark.parametrize("kwargs", ARGS)
def test_the_windows_are_lm_windows_and_lm_datasets(kwargs):
    ids = np.random.default_rng(0).integers(0, 50, size=1001).astype("int32")
    sequence = data.WindowSequence(ids, 4, 10, **kwargs)
    ours = [sequence[i] for i in range(len(sequence))]
    numpy_windows = list(data.lm_windows(ids, 4, 10, **kwargs))
    tf_windows = [(x.numpy(), y.numpy()) for x, y in data.lm_dataset(ids, 4, 10, **kwargs)]
    assert len(ours) == len(numpy_windows) == len(tf_windows) == data.num_windows(
        ids, 4, 10, **{k: v for k, v in kwargs.items() if k != "pad_to_multiple"})
    for (x, y), (nx, ny), (tx, ty) in zip(ours, numpy_windows, tf_windows):
        assert x.dtype == np.int32 and x.flags.c_contiguous
        np.testing.assert_array_equal(x, nx)
        np.testing.assert_array_equal(y, ny)
        np.testing.assert_array_equal(x, tx)
        np.testing.assert_array_equal(y, ty)
    assert [tuple(x.shape) for x, _ in sequence] == [tuple(x.shape) for x, _ in ours]
    with pytest.raises(IndexError):
        sequence[len(sequence)]


def test_every_position_is_an_input_once_and_its_target_follows():
    streams = np.arange(2 * 60, dtype="int32").reshape(2, 60)
    sequence = data.WindowSequence(streams, 2, 9, train=True, seed=1, epoch=0)
    xs = np.concatenate([x for x, _ in sequence], axis=1)
    ys = np.concatenate([y for _, y in sequence], axis=1)
    np.testing.assert_array_equal(xs, streams[:, :-1])
    np.testing.assert_array_equal(ys, streams[:, 1:])


def test_training_windows_need_the_epoch():
    with pytest.raises(ValueError, match="needs the epoch number"):
        data.WindowSequence(np.arange(100), 2, 5, train=True, epoch=None)


def test_lm_batches_is_tf_data_on_tensorflow_only():
    import tensorflow as tf
    batches = data.lm_batches(np.arange(100), 2, 5, train=False)
    assert isinstance(batches, tf.data.Dataset) == (keras.backend.backend() == "tensorflow")
    assert isinstance(batches, data.WindowSequence) == (keras.backend.backend() != "tensorflow")


def test_fit_and_evaluate_take_it():
    """On JAX and PyTorch (on TensorFlow, Keras makes a PyDataset a tf.data pipeline of the
    first window's shape: lm_batches gives lm_dataset there)."""
    if keras.backend.backend() == "tensorflow":
        pytest.skip("run under JAX by test_fit_and_evaluate_take_it_on_jax")
    from zoo import AWDLSTM
    keras.utils.set_random_seed(0)
    ids = np.random.default_rng(1).integers(0, 30, size=400).astype("int32")
    model = AWDLSTM(30, embed_dim=8, hidden_dim=8, num_layers=1)
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    train = data.WindowSequence(ids, 4, 10, train=True, seed=0, epoch=0)
    history = model.fit(train, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    from_sequence = model.evaluate(data.WindowSequence(ids, 2, 10, train=False), verbose=0,
                                   return_dict=True)["nll"]
    from_tf_data = model.evaluate(data.lm_dataset(ids, 2, 10, train=False), verbose=0,
                                  return_dict=True)["nll"]
    assert from_sequence == pytest.approx(from_tf_data, rel=1e-6)


@pytest.mark.slow  # 26 s; in CI zoo.train feeds it on JAX: test_without_tensorflow[jax]
def test_fit_and_evaluate_take_it_on_jax():
    from tests.backends import run_tests_in_backend
    run_tests_in_backend("jax", __file__, "test_fit_and_evaluate_take_it and not on_jax")
