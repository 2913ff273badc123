"""tflm.layers.MogrifierLSTM against a NumPy transcription of Melis et al. 2020's equations
(written in the paper's column-vector notation, Q^i in R^{m x n}, Q^i = Q_left Q_right), its
gradients against finite differences, carried state, padding, state dropout and saving."""

import os

import keras
import numpy as np
import pytest

from tests.backends import run_in_backend
from tflm.layers import MogrifierLSTM


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def paper_weights(rng, features, units, rounds, rank, scale=0.5):
    """Random weights in the paper's notation: for odd i (1-based) Q^i (m x n) with m =
    features, n = units, else R^i (n x m); with a rank, the factors (left, right); a bias
    per round; the LSTM's W (features, 4 units), U (units, 4 units), b (4 units)."""
    rounds_ = []
    for i in range(1, rounds + 1):
        rows, cols = (features, units) if i % 2 == 1 else (units, features)
        if rank is None:
            matrix = (rng.standard_normal((rows, cols)) * scale, None)
        else:
            matrix = (rng.standard_normal((rows, rank)) * scale,
                      rng.standard_normal((rank, cols)) * scale)
        rounds_.append((matrix, rng.standard_normal(rows) * 0.3))
    lstm = (rng.standard_normal((features, 4 * units)) * scale,
            rng.standard_normal((units, 4 * units)) * scale,
            rng.standard_normal(4 * units) * 0.3)
    return rounds_, lstm


def paper_forward(x, h0, c0, weights, cap_input_gate=False, state_mask=None, mask=None):
    """Melis et al. 2020 eq. 1-2 per sequence, then the LSTM (gates i, f, g, o):
    x^i = 2 sigma(Q^i h^{i-1} + a^i) * x^{i-2} (odd i), h^i = 2 sigma(R^i x^{i-1} + b^i) *
    h^{i-2} (even i), x^{-1} = x, h^0 = h_prev (dropped by `state_mask` first)."""
    rounds, (w, u, b) = weights
    batch, time, _ = x.shape
    units = u.shape[0]
    outputs = np.zeros((batch, time, units))
    h_fin, c_fin = np.array(h0, float), np.array(c0, float)
    for s in range(batch):
        h, c = np.array(h0[s], float), np.array(c0[s], float)
        for t in range(time):
            if mask is not None and not mask[s, t]:
                continue  # a masked step holds the state; its output is zero
            xs = {-1: x[s, t].astype(float)}
            hs = {0: h * (1.0 if state_mask is None else state_mask[s])}
            for i, ((left, right), bias) in enumerate(rounds, start=1):
                matrix = left if right is None else left @ right
                if i % 2 == 1:
                    xs[i] = 2 * _sigmoid(matrix @ hs[i - 1] + bias) * xs[i - 2]
                    hs[i] = hs[i - 1]
                else:
                    hs[i] = 2 * _sigmoid(matrix @ xs[i - 1] + bias) * hs[i - 2]
                    xs[i] = xs[i - 1]
            r = len(rounds)
            x_up, h_up = xs[r if r else -1], hs[r]
            z = x_up @ w + h_up @ u + b
            zi, zf, zg, zo = np.split(z, 4)
            i_, f = _sigmoid(zi), _sigmoid(zf)
            if cap_input_gate:
                i_ = np.minimum(i_, 1 - f)
            c = f * c + i_ * np.tanh(zg)
            h = _sigmoid(zo) * np.tanh(c)
            outputs[s, t] = h
        h_fin[s], c_fin[s] = h, c
    return outputs, h_fin, c_fin


def set_paper_weights(layer, weights):
    """Write paper-notation weights into the layer (row form: x <- x * 2 sigma(h M + a),
    M = Q^T = Q_right^T Q_left^T, so the layer's left factor is Q_right^T)."""
    rounds, (w, u, b) = weights
    layer.kernel.assign(w)
    layer.recurrent_kernel.assign(u)
    layer.bias.assign(b)
    for j, ((left, right), bias) in enumerate(rounds):
        if right is None:
            layer.mogrifier_kernels[j].assign(left.T)
        else:
            layer.mogrifier_kernels[j].assign(right.T)
            layer.mogrifier_right[j].assign(left.T)
        layer.mogrifier_biases[j].assign(bias)


def _layer(features, units, rounds, rank, **kwargs):
    layer = MogrifierLSTM(units, rounds=rounds, rank=rank, return_state=True, **kwargs)
    layer.build((None, None, features))
    return layer


CASES = [(0, None), (1, None), (2, 2), (4, 3), (5, None), (5, 2), (6, 3)]


@pytest.mark.parametrize("rounds, rank", CASES)
@pytest.mark.parametrize("cap", [False, True])
def test_forward_equals_the_papers_equations(rounds, rank, cap):
    rng = np.random.default_rng(rounds * 10 + (rank or 0) + cap)
    features, units, batch, time = 5, 4, 3, 6
    weights = paper_weights(rng, features, units, rounds, rank)
    layer = _layer(features, units, rounds, rank, cap_input_gate=cap)
    set_paper_weights(layer, weights)
    x = rng.standard_normal((batch, time, features)).astype("float32")
    h0 = rng.standard_normal((batch, units)).astype("float32")
    c0 = rng.standard_normal((batch, units)).astype("float32")
    y, h, c = layer(x, initial_state=[h0, c0])
    ref_y, ref_h, ref_c = paper_forward(x, h0, c0, weights, cap_input_gate=cap)
    np.testing.assert_allclose(np.asarray(y), ref_y, atol=2e-5)
    np.testing.assert_allclose(np.asarray(h), ref_h, atol=2e-5)
    np.testing.assert_allclose(np.asarray(c), ref_c, atol=2e-5)


def test_round_one_gates_the_input_from_the_state():
    """One round changes x only (x^1 = 2 sigma(Q^1 h + a) x): with h_prev = 0 and a zero
    bias the gate is exactly 1, so the step equals the plain LSTM's; with h_prev != 0 not."""
    rng = np.random.default_rng(0)
    weights = paper_weights(rng, 3, 4, 1, None)
    weights[0][0] = (weights[0][0][0], np.zeros(3))
    layer = _layer(3, 4, 1, None)
    set_paper_weights(layer, weights)
    plain = _layer(3, 4, 0, None)
    set_paper_weights(plain, ([], weights[1]))
    x = rng.standard_normal((2, 1, 3)).astype("float32")
    zeros = np.zeros((2, 4), "float32")
    np.testing.assert_allclose(np.asarray(layer(x, initial_state=[zeros, zeros])[0]),
                               np.asarray(plain(x, initial_state=[zeros, zeros])[0]), atol=1e-6)
    ones = np.ones((2, 4), "float32")
    assert not np.allclose(np.asarray(layer(x, initial_state=[ones, zeros])[0]),
                           np.asarray(plain(x, initial_state=[ones, zeros])[0]), atol=1e-4)


def test_zero_rounds_is_keras_lstm():
    rng = np.random.default_rng(1)
    layer = _layer(5, 4, 0, None)
    lstm = keras.layers.LSTM(4, return_sequences=True, return_state=True)
    lstm.build((None, None, 5))
    lstm.set_weights(layer.get_weights()[:3])
    x = rng.standard_normal((2, 7, 5)).astype("float32")
    for a, b in zip(layer(x), lstm(x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_low_rank_matrix_is_the_product_of_its_factors_and_has_that_rank():
    layer = _layer(6, 5, 3, 2)
    for j, shape in enumerate([(5, 6), (6, 5), (5, 6)]):
        matrix = np.asarray(layer.mogrifier_matrix(j))
        assert matrix.shape == shape
        assert np.linalg.matrix_rank(matrix, tol=1e-6) == 2
    for rank in (None, 0):  # 0: full matrices, lamb's convention
        full = _layer(6, 5, 3, rank)
        assert full.rank is None
        assert [tuple(w.shape) for w in full.mogrifier_kernels] == [(5, 6), (6, 5), (5, 6)]
        assert full.mogrifier_right == []


def test_initialisation_follows_lamb():
    """lamb: factors ~ TN(0, (fan_in k)^-1/4), mogrifier biases 0; init="lamb" gives W, U
    variance 1 / fan_in and the forget-gate bias mean forget_bias."""
    keras.utils.set_random_seed(3)
    layer = _layer(400, 300, 2, 50, init="lamb", forget_bias=1.0)
    left = np.asarray(layer.mogrifier_kernels[0])  # round 0 gates x from h: fan_in = units
    std = (1.0 / (300 * 50)) ** 0.25 * 0.8796  # TN at 2 sigma keeps 0.88 of sigma
    assert abs(left.std() / std - 1) < 0.03 and np.abs(left).max() <= 2 * std / 0.8796 + 1e-6
    right = np.asarray(layer.mogrifier_right[1])  # round 1 gates h from x: fan_in = 400
    assert abs(right.std() / ((1.0 / (400 * 50)) ** 0.25 * 0.8796) - 1) < 0.05
    assert all(not np.asarray(b).any() for b in layer.mogrifier_biases)
    assert abs(np.asarray(layer.kernel).std() * np.sqrt(400) - 1) < 0.03
    assert abs(np.asarray(layer.recurrent_kernel).std() * np.sqrt(300) - 1) < 0.03
    bias = np.asarray(layer.bias).reshape(4, 300)
    assert abs(bias[1].mean() - 1.0) < 0.03 and abs(bias[0].mean()) < 0.03
    assert abs(bias[0].std() * np.sqrt(300) - 1) < 0.12
    keras_init = _layer(4, 3, 1, None)  # Keras' LSTM: zero biases, unit forget bias
    np.testing.assert_array_equal(np.asarray(keras_init.bias), [0] * 3 + [1] * 3 + [0] * 6)


def _fd_case(rounds, rank, cap):
    rng = np.random.default_rng(7)
    features, units = 3, 4
    weights = paper_weights(rng, features, units, rounds, rank)
    x = rng.standard_normal((2, 3, features))
    h0 = rng.standard_normal((2, units)) * 0.5
    c0 = rng.standard_normal((2, units)) * 0.5
    probe = rng.standard_normal((2, 3, units))
    return weights, x, h0, c0, probe


def _flat(weights):
    rounds, lstm = weights
    arrays = []
    for (left, right), bias in rounds:
        arrays += [left] + ([] if right is None else [right]) + [bias]
    return arrays + list(lstm)


@pytest.mark.parametrize("rounds, rank, cap", [(3, None, False), (4, 2, True)])
def test_gradients_equal_finite_differences(rounds, rank, cap):
    """d(sum(y * probe) + sum(c_T)) / d every weight entry: the layer's autodiff against
    central differences of the float64 NumPy transcription."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the tape is TensorFlow's; the other backends run test_other_backends")
    import tensorflow as tf  # deferred: this test's gradient tape only
    weights, x, h0, c0, probe = _fd_case(rounds, rank, cap)

    def objective(w):
        y, _, c = paper_forward(x, h0, c0, w, cap_input_gate=cap)
        return float((y * probe).sum() + c.sum())

    layer = _layer(3, 4, rounds, rank, cap_input_gate=cap)
    set_paper_weights(layer, weights)
    with tf.GradientTape() as tape:
        y, _, c = layer(x.astype("float32"), initial_state=[h0.astype("float32"),
                                                            c0.astype("float32")])
        loss = tf.reduce_sum(y * probe.astype("float32")) + tf.reduce_sum(c)
    grads = dict(zip([id(v) for v in layer.trainable_variables],
                     tape.gradient(loss, [v.value for v in layer.trainable_variables])))
    flat = _flat(weights)
    # which layer variable holds each paper array, and how (transposed for the gates)
    holders = []
    for j, ((left, right), _) in enumerate(weights[0]):
        if right is None:
            holders += [(layer.mogrifier_kernels[j], True)]
        else:
            holders += [(layer.mogrifier_right[j], True), (layer.mogrifier_kernels[j], True)]
        holders += [(layer.mogrifier_biases[j], False)]
    holders += [(layer.kernel, False), (layer.recurrent_kernel, False), (layer.bias, False)]
    eps, checked = 1e-5, 0
    for array, (variable, transposed) in zip(flat, holders):
        grad = np.asarray(grads[id(variable)])
        grad = grad.T if transposed else grad
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            keep = array[index]
            array[index] = keep + eps
            up = objective(weights)
            array[index] = keep - eps
            down = objective(weights)
            array[index] = keep
            numeric[index] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=2e-3, atol=2e-4)
        checked += array.size
    assert checked == sum(int(np.prod(v.shape)) for v in layer.trainable_variables)


def test_state_carried_across_windows_equals_one_long_window():
    rng = np.random.default_rng(2)
    layer = _layer(5, 4, 5, 2)
    set_paper_weights(layer, paper_weights(rng, 5, 4, 5, 2))
    x = rng.standard_normal((3, 12, 5)).astype("float32")
    y, h, c = layer(x)
    y1, h1, c1 = layer(x[:, :7])
    y2, h2, c2 = layer(x[:, 7:], initial_state=[h1, c1])
    np.testing.assert_allclose(np.concatenate([np.asarray(y1), np.asarray(y2)], 1),
                               np.asarray(y), atol=1e-5)
    np.testing.assert_allclose(np.asarray(h2), np.asarray(h), atol=1e-5)
    np.testing.assert_allclose(np.asarray(c2), np.asarray(c), atol=1e-5)


def test_masked_steps_hold_the_state_and_output_zeros():
    rng = np.random.default_rng(4)
    weights = paper_weights(rng, 5, 4, 4, 3)
    layer = _layer(5, 4, 4, 3)
    set_paper_weights(layer, weights)
    x = rng.standard_normal((2, 6, 5)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1]], bool)
    zeros = np.zeros((2, 4), "float32")
    y, h, c = layer(x, initial_state=[zeros, zeros], mask=mask)
    ref_y, ref_h, ref_c = paper_forward(x, zeros, zeros, weights, mask=mask)
    np.testing.assert_allclose(np.asarray(y), ref_y, atol=2e-5)
    np.testing.assert_allclose(np.asarray(h), ref_h, atol=2e-5)
    np.testing.assert_allclose(np.asarray(c), ref_c, atol=2e-5)


def test_the_unrolled_loop_equals_the_loop_and_the_equations():
    """`unroll=True` (the time loop written out): the same outputs, states and masked steps
    as the NumPy transcription, and the same gradients as the loop."""
    import tensorflow as tf
    rng = np.random.default_rng(6)
    weights = paper_weights(rng, 5, 4, 5, 2)
    loop, unrolled = _layer(5, 4, 5, 2), _layer(5, 4, 5, 2, unroll=True)
    for layer in (loop, unrolled):
        set_paper_weights(layer, weights)
    x = rng.standard_normal((2, 6, 5)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1]], bool)
    h0 = rng.standard_normal((2, 4)).astype("float32")
    c0 = np.zeros((2, 4), "float32")
    ref = paper_forward(x, h0, c0, weights, mask=mask)
    grads = []
    for layer in (loop, unrolled):
        with tf.GradientTape() as tape:
            got = layer(x, initial_state=[h0, c0], mask=mask)
            loss = tf.reduce_sum(got[0] ** 2) + tf.reduce_sum(got[2])
        for a, b in zip(got, ref):
            np.testing.assert_allclose(np.asarray(a), b, atol=2e-5)
        grads.append([np.asarray(g) for g in tape.gradient(loss, layer.trainable_weights)])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert MogrifierLSTM.from_config(unrolled.get_config()).unroll


def test_state_dropout_drops_the_recurrent_input_with_one_mask_per_sequence(monkeypatch):
    """The mask multiplies h_{t-1} before mogrification at every step of the window (the
    same mask each step); the carried h_t, c_t are not dropped; inference uses none."""
    rng = np.random.default_rng(5)
    weights = paper_weights(rng, 5, 4, 3, 2)
    layer = _layer(5, 4, 3, 2, state_dropout=0.5, seed=1)
    set_paper_weights(layer, weights)
    x = rng.standard_normal((2, 5, 5)).astype("float32")
    h0 = rng.standard_normal((2, 4)).astype("float32")
    c0 = rng.standard_normal((2, 4)).astype("float32")
    drawn = np.asarray(layer.state_dropout_mask(2, "float32"))
    assert drawn.shape == (2, 4) and set(np.unique(drawn)) <= {0.0, 2.0}
    fixed = np.array([[2, 0, 2, 2], [0, 2, 2, 0]], "float32")
    monkeypatch.setattr(layer, "state_dropout_mask", lambda batch, dtype: fixed)
    y, h, c = layer(x, initial_state=[h0, c0], training=True)
    ref = paper_forward(x, h0, c0, weights, state_mask=fixed)
    for got, want in zip((y, h, c), ref):
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
    inference = paper_forward(x, h0, c0, weights)
    np.testing.assert_allclose(np.asarray(layer(x, initial_state=[h0, c0])[0]), inference[0],
                               atol=2e-5)


def test_state_dropout_masks_are_bernoulli_and_fresh_per_call():
    layer = _layer(3, 400, 0, None, state_dropout=0.3, seed=2)
    a = np.asarray(layer.state_dropout_mask(50, "float32"))
    b = np.asarray(layer.state_dropout_mask(50, "float32"))
    assert set(np.unique(a)) == {0.0, np.float32(1 / 0.7)}
    assert abs((a == 0).mean() - 0.3) < 0.01 and not np.array_equal(a, b)


def test_keras_file_round_trip(tmp_path):
    rng = np.random.default_rng(6)
    inputs = keras.Input((None, 5))
    y, h, c = MogrifierLSTM(4, rounds=5, rank=2, state_dropout=0.2, cap_input_gate=True,
                            init="lamb", return_state=True, name="mog")(inputs)
    model = keras.Model(inputs, [y, h, c])
    model.get_layer("mog").bias.assign(rng.standard_normal(16))
    x = rng.standard_normal((2, 6, 5)).astype("float32")
    path = os.path.join(tmp_path, "mog.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(model(x), loaded(x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    layer = loaded.get_layer("mog")
    assert (layer.rounds, layer.rank, layer.state_dropout, layer.cap_input_gate,
            layer.init) == (5, 2, 0.2, True, "lamb")
    assert len(layer.weights) == 3 + 5 * 3


def test_config_round_trip_and_last_output_only():
    layer = MogrifierLSTM(3, rounds=2, rank=None, mogrifier_bias=False,
                          return_sequences=False)
    x = np.ones((2, 4, 5), "float32")
    assert tuple(layer(x).shape) == (2, 3)
    assert layer.mogrifier_biases == []
    clone = MogrifierLSTM.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize("kwargs, message", [
    ({"rounds": -1}, "rounds"), ({"rounds": 1.5}, "rounds"), ({"rank": -1}, "rank"),
    ({"state_dropout": 1.0}, "state_dropout"), ({"init": "torch"}, "init")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MogrifierLSTM(4, **kwargs)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_match_the_equations(backend):
    """Forward (masked steps included) equals the NumPy transcription, and gradients reach
    every weight, under JAX and PyTorch."""
    out = run_in_backend(backend, """
        import numpy as np, keras
        from tflm.layers import MogrifierLSTM
        from tests.tflm.layers.test_mogrifier import (paper_forward, paper_weights,
                                                      set_paper_weights)
        rng = np.random.default_rng(0)
        weights = paper_weights(rng, 5, 4, 5, 2)
        x = rng.standard_normal((2, 6, 5)).astype("float32")
        mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
        h0 = rng.standard_normal((2, 4)).astype("float32")
        c0 = np.zeros((2, 4), "float32")
        ref = paper_forward(x, h0, c0, weights, cap_input_gate=True, mask=mask)
        for unroll in (False, True):  # the loop and the loop written out
            layer = MogrifierLSTM(4, rounds=5, rank=2, cap_input_gate=True,
                                  return_state=True, unroll=unroll)
            layer.build((None, None, 5))
            set_paper_weights(layer, weights)
            got = layer(x, initial_state=[h0, c0], mask=mask)
            for a, b in zip(got, ref):
                np.testing.assert_allclose(keras.ops.convert_to_numpy(a), b, atol=2e-5)
        print("FORWARD_OK")
    """)
    assert "FORWARD_OK" in out
