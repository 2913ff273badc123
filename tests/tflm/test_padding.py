"""Padded BPTT windows (pad_to_multiple): the data side, the masks, and exact equivalence of
training on padded and unpadded windows on every backend."""

import numpy as np
import pytest

from tests.backends import run_in_backend
from tflm.data import PAD_ID, lm_dataset, lm_windows, pad_window, padded_length


def test_padded_length_and_pad_window():
    assert [padded_length(t, 8) for t in (1, 7, 8, 9, 16, 17)] == [8, 8, 8, 16, 16, 24]
    assert padded_length(13, 1) == 13
    x = np.arange(10).reshape(2, 5)
    px, py = pad_window(x, x + 1, 4)
    assert px.shape == py.shape == (2, 8)
    np.testing.assert_array_equal(px[:, :5], x)
    np.testing.assert_array_equal(py[:, :5], x + 1)
    assert (px[:, 5:] == PAD_ID).all() and (py[:, 5:] == 0).all()
    with pytest.raises(ValueError, match="pad_to_multiple must be a positive integer"):
        padded_length(3, 0)


def test_lm_windows_and_lm_dataset_pad_the_same_windows():
    ids = np.random.default_rng(0).integers(0, 100, 2_000)
    plain = list(lm_windows(ids, 4, 35, train=True, seed=2, epoch=1))
    padded = list(lm_windows(ids, 4, 35, train=True, seed=2, epoch=1, pad_to_multiple=8))
    assert len(plain) == len(padded)
    for (x, y), (px, py) in zip(plain, padded):
        t = x.shape[1]
        assert px.shape[1] == padded_length(t, 8) and px.dtype == np.int32
        np.testing.assert_array_equal(px[:, :t], x)
        np.testing.assert_array_equal(py[:, :t], y)
        assert (px[:, t:] == PAD_ID).all() and (py[:, t:] == 0).all()
    tf_windows = [(x.numpy(), y.numpy()) for x, y in lm_dataset(
        ids, 4, 35, train=True, seed=2, epoch=1, pad_to_multiple=8)]
    for (px, py), (tx, ty) in zip(padded, tf_windows):
        np.testing.assert_array_equal(px, tx)
        np.testing.assert_array_equal(py, ty)
    # the padded lengths are few: that is what saves JAX its compiles
    assert len({x.shape[1] for x, _ in padded}) < len({x.shape[1] for x, _ in plain}) / 2
    with pytest.raises(ValueError, match="pad_to_multiple"):
        lm_dataset(ids, 4, 35, train=False, pad_to_multiple=-8)


def test_masked_mean_and_padding_mask_against_numpy():
    from keras import ops

    from tflm.padding import masked_mean, padding_mask, without_padding
    rng = np.random.default_rng(1)
    values = rng.normal(size=(3, 6, 4)).astype("float32")
    mask = np.ones((3, 6), bool)
    mask[:, 4:] = False
    expected = values[:, :4].mean()
    got = float(ops.convert_to_numpy(masked_mean(values, ops.convert_to_tensor(mask))))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert float(ops.convert_to_numpy(masked_mean(values, None))) == pytest.approx(
        values.mean(), rel=1e-6)
    tokens = np.array([[3, 4, PAD_ID], [5, 6, PAD_ID]], "int32")
    np.testing.assert_array_equal(ops.convert_to_numpy(padding_mask(tokens)),
                                  [[True, True, False]] * 2)
    assert padding_mask(np.array([[3, 4]], "int32")) is None  # eager, no padding: no mask
    np.testing.assert_array_equal(ops.convert_to_numpy(without_padding(tokens)),
                                  [[3, 4, 0], [5, 6, 0]])


def test_a_one_position_window_trains_with_finite_ar_and_tar():
    """A training pass can end in a window of one position (the last of a stream); TAR has
    no pair of positions there and counts 0, not a mean of nothing (NaN, which ended the
    run: found by bench.reproductions.reference_curves on a short text)."""
    import keras
    from keras import ops

    from tflm.padding import masked_mean
    assert float(ops.convert_to_numpy(masked_mean(np.zeros((2, 0, 3), "float32"), None))) == 0
    from zoo import AWDLSTM
    keras.utils.set_random_seed(0)
    model = AWDLSTM(20, embed_dim=8, hidden_dim=8, num_layers=2, alpha=2.0, beta=1.0)
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    x = np.array([[3], [4]], "int32")
    logs = model.train_on_batch(x, np.array([[5], [6]], "int32"), return_dict=True)
    assert np.isfinite(logs["loss"]), logs
    assert all(np.isfinite(ops.convert_to_numpy(v)).all() for v in model.trainable_variables)


def test_doc_cv_regularizer_leaves_masked_positions_out():
    from keras import ops

    from tflm.layers.doc import prior_cv_squared
    pi = np.random.default_rng(2).dirichlet(np.ones(5), size=(2, 7)).astype("float32")
    mask = np.zeros((2, 7), bool)
    mask[:, :4] = True
    masked = float(ops.convert_to_numpy(prior_cv_squared(pi, ops.convert_to_tensor(mask))))
    cropped = float(ops.convert_to_numpy(prior_cv_squared(pi[:, :4])))
    assert masked == pytest.approx(cropped, rel=1e-5)


# With every dropout ON (masks do not depend on the window length, so the same seeds give
# the same masks) and AR / TAR, a DOC head with its CV regularizer: training on windows
# padded to a multiple of 8 must give the unpadded run's weights, losses and perplexity.
_EQUIVALENCE = """
import numpy as np, keras
from tflm import data
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

ids = np.random.default_rng(0).integers(0, 60, 1_500)

def run(multiple):
    keras.utils.set_random_seed(0)
    model = AWDLSTM(60, embed_dim=8, hidden_dim=16, num_layers=3, seed=5, bptt=12,
                    head={HEAD}, dropout_e=0.1, weight_dropout=0.5)
    model.compile(optimizer=keras.optimizers.SGD(2.0))
    windows = data.lm_windows(ids, 4, 12, train=True, seed=3, epoch=0,
                              pad_to_multiple=multiple)
    losses, shapes = [], set()
    for i, (x, y) in enumerate(windows):
        if i == 8:
            break
        shapes.add(x.shape[1])
        losses.append(model.train_on_batch(x, y, return_dict=True)["loss"])
    valid = data.lm_dataset(ids[:400], 3, 10, train=False, pad_to_multiple=multiple)
    ppl = model.evaluate(valid, verbose=0, return_dict=True)["perplexity"]
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return weights, np.array(losses), ppl, shapes

w1, l1, p1, s1 = run(1)
w8, l8, p8, s8 = run(8)
assert all(s % 8 == 0 for s in s8) and len(s8) < len(s1), (s1, s8)
print("weights", float(np.abs(w1 - w8).max()), "loss", float(np.abs(l1 - l8).max()),
      "ppl", p1, p8)
"""


_DOC = ('{"type": "doc", "num_components_per_layer": [0, 2, 3], '
        '"cv_regularization": 0.05}')


# JAX with the softmax head: its train step picks the targets' log-probabilities chunk by
# chunk and its LSTM loops stop at the window's extent (`tflm.backends.extent_loop`).
@pytest.mark.parametrize("backend,head", [("tensorflow", _DOC),
                                          pytest.param("jax", _DOC, marks=pytest.mark.slow),
                                          ("torch", _DOC),
                                          ("jax", '"softmax"')])
def test_training_on_padded_windows_equals_unpadded(backend, head):
    out = run_in_backend(backend, _EQUIVALENCE.replace("{HEAD}", head)).split()
    assert out[0] == "weights"
    assert float(out[1]) < 1e-5, out
    assert float(out[3]) < 1e-5, out
    assert float(out[5]) == pytest.approx(float(out[6]), rel=1e-5)


@pytest.mark.slow  # 11 s; in CI the traces are counted by test_compiled_lengths
def test_jax_compiles_once_per_padded_length():
    out = run_in_backend("jax", """
        import numpy as np, keras
        from tflm import data
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
        model = AWDLSTM(40, embed_dim=8, hidden_dim=16, num_layers=2, seed=1, bptt=20)
        traced = []
        step = model.train_step
        def counted(state, batch):
            traced.append(batch[0].shape[1])
            return step(state, batch)
        model.train_step = counted
        model.compile(optimizer=keras.optimizers.SGD(1.0))
        ids = np.random.default_rng(0).integers(0, 40, 4_000)
        ds = data.lm_dataset(ids, 4, 20, train=True, seed=0, epoch=0, pad_to_multiple=8)
        lengths = {x.shape[1] for x, _ in data.lm_windows(ids, 4, 20, train=True, seed=0,
                                                          epoch=0)}
        model.fit(ds, epochs=1, verbose=0)
        print(len(lengths), *traced)
    """).split("\n")[-2].split()
    distinct_raw, traced = int(out[0]), [int(t) for t in out[1:]]
    assert traced and all(t % 8 == 0 for t in traced)
    assert len(traced) == len(set(traced))  # one trace per padded length, none twice
    assert len(traced) < distinct_raw


def test_unpadded_promise_on_tensorflow():
    """`LanguageModel.padded_windows = False`: the traced train step drops the mask (same
    training as with it, every dropout on), and a padded window fails at run time with an
    error naming the flag; evaluation keeps its mask."""
    out = run_in_backend("tensorflow", """
        import numpy as np, keras, tensorflow as tf
        from tflm import data
        from tflm.padding import padding_mask, promised_unpadded
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

        def mask_is_none_in_trace(check):
            seen = []

            @tf.function
            def trace(tokens):
                with promised_unpadded(check):
                    seen.append(padding_mask(tokens) is None)
                return tokens

            trace(tf.zeros((2, 3), tf.int32))
            return seen[0]

        checked = []
        assert mask_is_none_in_trace(checked.append) and len(checked) == 1
        assert not mask_is_none_in_trace(None)

        ids = np.random.default_rng(0).integers(0, 60, 1_500)

        def run(padded, multiple=1):
            keras.utils.set_random_seed(0)
            model = AWDLSTM(60, embed_dim=8, hidden_dim=16, num_layers=3, seed=5, bptt=12,
                            dropout_e=0.1, weight_dropout=0.5)
            model.compile(optimizer=keras.optimizers.SGD(2.0))
            model.padded_windows = padded
            losses = []
            for i, (x, y) in enumerate(data.lm_windows(ids, 4, 12, train=True, seed=3,
                                                       epoch=0, pad_to_multiple=multiple)):
                if i == 6:
                    break
                losses.append(model.train_on_batch(x, y, return_dict=True)["loss"])
            valid = data.lm_dataset(ids[:400], 3, 10, train=False, pad_to_multiple=8)
            ppl = model.evaluate(valid, verbose=0, return_dict=True)["perplexity"]
            return np.concatenate([w.ravel() for w in model.get_weights()]), losses, ppl

        w1, l1, p1 = run(True)
        w0, l0, p0 = run(False)
        print("weights", float(np.abs(w1 - w0).max()), "loss",
              float(np.abs(np.subtract(l1, l0)).max()), "ppl", p1, p0)
        try:
            run(False, multiple=8)
        except tf.errors.InvalidArgumentError as err:
            print("error", "padded_windows = True" in str(err))
        else:
            print("error none")
    """).strip().split("\n")
    numbers, error = out[-2].split(), out[-1].split()
    assert numbers[0] == "weights"
    assert float(numbers[1]) < 1e-5 and float(numbers[3]) < 1e-5, numbers
    assert float(numbers[5]) == pytest.approx(float(numbers[6]), rel=1e-5)
    assert error == ["error", "True"], out
