"""WeightDropLSTM: exact LSTM recursion with a DropConnect'ed recurrent matrix."""

import numpy as np
import pytest
import keras

from tests.backends import run_in_backend
from tflm.layers import WeightDropLSTM


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(x, W, U, b, h0=None, c0=None):
    """Reference LSTM, gate order i, f, c, o (Keras layout), float64."""
    B, T, _ = x.shape
    n = U.shape[0]
    h = np.zeros((B, n)) if h0 is None else h0.astype(np.float64)
    c = np.zeros((B, n)) if c0 is None else c0.astype(np.float64)
    out = []
    for t in range(T):
        z = x[:, t] @ W + h @ U + b
        i, f, g, o = np.split(z, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        out.append(h)
    return np.stack(out, 1), h, c


def _layer(p=0.5, **kw):
    return WeightDropLSTM(6, weight_dropout=p, seed=4, return_sequences=True,
                          return_state=True, **kw)


def test_inference_equals_plain_lstm_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 9, 5)).astype("float32")
    layer = _layer()
    y, h, c = layer(x, training=False)
    W, U, b = (np.asarray(v, np.float64) for v in layer.get_weights())
    ry, rh, rc = numpy_lstm(x.astype(np.float64), W, U, b)
    np.testing.assert_allclose(np.asarray(y), ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(c), rc, rtol=1e-5, atol=1e-6)


def test_training_uses_one_dropped_matrix_for_all_steps(monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 8, 5)).astype("float32")
    h0 = rng.normal(size=(2, 6)).astype("float32")
    c0 = rng.normal(size=(2, 6)).astype("float32")
    layer = _layer(0.5)
    layer(x)  # build
    mask = (rng.random((6, 24)) < 0.5).astype("float32") / 0.5
    monkeypatch.setattr(layer, "recurrent_kernel_mask", lambda: keras.ops.convert_to_tensor(mask))
    y, h, c = layer(x, initial_state=[h0, c0], training=True)
    W, U, b = (np.asarray(v, np.float64) for v in layer.get_weights())
    ry, rh, rc = numpy_lstm(x.astype(np.float64), W, U * mask, b, h0, c0)
    np.testing.assert_allclose(np.asarray(y), ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(h), rh, rtol=1e-5, atol=1e-6)


def test_mask_is_bernoulli_scaled_and_fresh_per_call():
    layer = WeightDropLSTM(40, weight_dropout=0.3, seed=0)
    layer.build((None, None, 3))
    m1 = np.asarray(layer.recurrent_kernel_mask())
    m2 = np.asarray(layer.recurrent_kernel_mask())
    assert m1.shape == (40, 160)
    assert set(np.unique(m1)) <= {0.0, np.float32(1 / 0.7)}
    assert abs((m1 == 0).mean() - 0.3) < 0.03
    assert not np.array_equal(m1, m2)


def test_dropout_changes_training_output_on_cpu_fallback():
    x = np.random.default_rng(2).normal(size=(2, 6, 5)).astype("float32")
    layer = _layer(0.5)
    y_inf = np.asarray(layer(x, training=False)[0])
    y_tr1 = np.asarray(layer(x, training=True)[0])
    y_tr2 = np.asarray(layer(x, training=True)[0])
    assert not np.allclose(y_inf, y_tr1)
    assert not np.allclose(y_tr1, y_tr2)
    assert np.allclose(np.asarray(layer(x, training=False)[0]), y_inf)


def test_gradient_reaches_recurrent_kernel_through_mask():
    import tensorflow as tf
    x = tf.constant(np.random.default_rng(3).normal(size=(2, 5, 5)).astype("float32"))
    layer = _layer(0.5)
    with tf.GradientTape() as tape:
        y, _, _ = layer(x, training=True)
        loss = tf.reduce_sum(y ** 2)
    g = tape.gradient(loss, layer.cell.recurrent_kernel.value)
    g = np.asarray(g)
    assert np.isfinite(g).all() and np.abs(g).sum() > 0
    assert (g == 0).mean() > 0.3  # dropped entries get no gradient


def test_bad_arguments():
    with pytest.raises(ValueError, match="weight_dropout"):
        WeightDropLSTM(4, weight_dropout=1.5)
    with pytest.raises(ValueError, match="recurrent_dropout"):
        WeightDropLSTM(4, weight_dropout=0.5, recurrent_dropout=0.2)


def test_config_roundtrip():
    layer = WeightDropLSTM(7, weight_dropout=0.25, seed=9, return_sequences=True)
    clone = WeightDropLSTM.from_config(layer.get_config())
    assert clone.weight_dropout == 0.25 and clone.units == 7 and clone.return_sequences


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_other_backends_drop_and_match_at_inference(backend):
    out = run_in_backend(backend, """
        import numpy as np, keras
        from tflm.layers import WeightDropLSTM
        x = np.random.default_rng(0).normal(size=(2, 6, 5)).astype("float32")
        layer = WeightDropLSTM(6, weight_dropout=0.5, seed=1, return_sequences=True)
        a = keras.ops.convert_to_numpy(layer(x, training=False))
        ref = keras.layers.LSTM(6, return_sequences=True)
        ref.build(x.shape); ref.set_weights(layer.get_weights())
        b = keras.ops.convert_to_numpy(ref(x))
        t = keras.ops.convert_to_numpy(layer(x, training=True))
        print(float(np.abs(a - b).max()), float(np.abs(a - t).max()))
    """)
    inference_gap, training_gap = map(float, out.split()[-2:])
    assert inference_gap < 1e-5
    assert training_gap > 1e-3


def test_torch_fused_kernel_equals_the_portable_loop_with_gradients():
    # PyTorch runs its fused kernel (tflm.backends.torch_lstm, public torch.lstm) where
    # Keras would loop in Python; outputs, final state and gradients (through the
    # DropConnect mask) must match the portable loop with the same dropped matrix.
    out = run_in_backend("torch", """
        import numpy as np, torch, keras
        from tflm.backends.lstm_kernels import lstm_window
        from tflm.layers import WeightDropLSTM
        rng = np.random.default_rng(0)
        x = torch.tensor(rng.normal(size=(3, 7, 5)), dtype=torch.float32)
        h0 = torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32)
        c0 = torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32)
        layer = WeightDropLSTM(4, weight_dropout=0.5, seed=2, return_sequences=True)
        layer.build(x.shape)
        mask = layer.recurrent_kernel_mask()
        dropped = layer.cell.recurrent_kernel.value * mask
        gaps = []
        grads = []
        for path in ("fused", "portable"):
            for v in layer.trainable_variables:
                v.value.grad = None
            window = lstm_window(layer.cell, x, [h0, c0], None, dropped, kernel=path)
            assert window.kernel == path
            seq, (h, c) = window.outputs, window.states
            (seq.square().sum() + h.sum() + 2 * c.sum()).backward(retain_graph=True)
            grads.append([v.value.grad.clone() for v in layer.trainable_variables])
            gaps.append(torch.cat([seq.flatten(), h.flatten(), c.flatten()]))
        out_gap = float((gaps[0] - gaps[1]).abs().max())
        grad_gap = max(float((a - b).abs().max()) for a, b in zip(*grads))
        # the dropped entries of U get no gradient on either path
        zero = float(grads[0][1][mask == 0].abs().max())
        print(out_gap, grad_gap, zero)
    """)
    out_gap, grad_gap, zero = map(float, out.split()[-3:])
    assert out_gap < 1e-5 and grad_gap < 1e-4 and zero == 0.0


def test_jax_cudnn_path_for_padded_windows_plumbs_weights_and_lengths():
    # No GPU here: stand in for cuDNN with JAX's own reference LSTM (same flat weight
    # layout, same seq_lengths meaning) and check the plumbing against the masked loop.
    out = run_in_backend("jax", """
        import numpy as np, jax.numpy as jnp, keras
        from jax.experimental import rnn
        from tflm.backends import jax_lstm
        from tflm.backends.lstm_kernels import lstm_window, portable_lstm
        from tflm.layers import WeightDropLSTM

        def reference(x, h0, c0, weights, lengths, input_size, hidden_size, num_layers,
                      dropout, bidirectional):
            w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(
                weights, input_size, hidden_size, num_layers, bidirectional)
            return rnn.lstm_ref(x, h0, c0, w_ih, w_hh, b_ih, b_hh, lengths, input_size,
                                hidden_size, num_layers, dropout, bidirectional)

        jax_lstm._on_gpu = lambda: True
        jax_lstm._cudnn_lstm = lambda: reference
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(3, 8, 5)), jnp.float32)
        h0 = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
        c0 = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
        mask = jnp.asarray(np.arange(8)[None, :] < 6).repeat(3, axis=0)
        layer = WeightDropLSTM(4, weight_dropout=0.5, seed=2, return_sequences=True)
        layer.build(x.shape)
        dropped = layer.cell.recurrent_kernel.value * layer.recurrent_kernel_mask()
        fused = lstm_window(layer.cell, x, [h0, c0], mask, dropped, kernel="fused")
        assert fused.kernel == "fused"
        _, seq_a, (h_a, c_a) = fused[:3]
        _, seq_b, (h_b, c_b) = portable_lstm(layer.cell, x, [h0, c0], mask, dropped)
        real = float(jnp.abs(seq_a[:, :6] - seq_b[:, :6]).max())
        state = float(max(jnp.abs(h_a - h_b).max(), jnp.abs(c_a - c_b).max()))
        # the state after the 6 real steps, not after all 8
        _, _, (h_6, _) = portable_lstm(layer.cell, x[:, :6], [h0, c0], None, dropped)
        print(real, state, float(jnp.abs(h_a - h_6).max()))
    """)
    real, state, after_six = map(float, out.split()[-3:])
    assert real < 1e-5 and state < 1e-5 and after_six < 1e-5


def test_kernel_choice_follows_use_cudnn_and_is_recorded():
    # TensorFlow on a CPU has no fused kernel: "auto" runs the portable loop, True refuses.
    x = np.random.default_rng(5).normal(size=(2, 4, 3)).astype("float32")
    auto = WeightDropLSTM(5, weight_dropout=0.5, seed=0, return_sequences=True)
    y = auto(x, training=True)
    assert auto.last_kernel == "portable"
    portable = WeightDropLSTM(5, weight_dropout=0.5, seed=0, use_cudnn=False,
                              return_sequences=True)
    portable.build(x.shape)
    portable.set_weights(auto.get_weights())
    np.testing.assert_array_equal(np.asarray(portable(x, training=True)), np.asarray(y))
    assert portable.last_kernel == "portable"
    with pytest.raises(ValueError, match="use_cudnn=True"):
        WeightDropLSTM(5, use_cudnn=True)(x)


def test_torch_picks_its_fused_kernel_unless_told_otherwise():
    out = run_in_backend("torch", """
        import numpy as np
        from tflm.layers import WeightDropLSTM
        x = np.random.default_rng(0).normal(size=(2, 4, 3)).astype("float32")
        kernels = []
        for use_cudnn in ("auto", True, False):
            layer = WeightDropLSTM(5, weight_dropout=0.5, seed=0, use_cudnn=use_cudnn)
            layer(x, training=True)
            kernels.append(layer.last_kernel)
        print(*kernels)
    """)
    assert out.split()[-3:] == ["fused", "fused", "portable"]


def test_torch_inference_reuses_transposed_weights_until_they_are_written():
    # Without autograd the fused kernel keeps W^T and U^T per weight tensor; a write to the
    # weight (an optimizer step, set_weights) must make the next window use the new values,
    # and a freed weight's copy must go with it.
    out = run_in_backend("torch", """
        import gc
        import numpy as np, torch, keras
        from tflm.backends.torch_lstm import TransposeCache, _INFERENCE_TRANSPOSES
        from tflm.layers import WeightDropLSTM
        cache = TransposeCache()
        w = torch.randn(5, 8)
        first = cache.transposed(w)
        assert cache.transposed(w) is first and torch.equal(first, w.T)
        w.add_(1.0)                                   # an in-place write
        assert torch.equal(cache.transposed(w), w.T)
        assert len(cache) == 1
        del w, first
        gc.collect()
        assert len(cache) == 0
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 6, 3)).astype("float32")
        layer = WeightDropLSTM(4, weight_dropout=0.5, return_sequences=True)
        layer.build(x.shape)
        with torch.no_grad():
            before = keras.ops.convert_to_numpy(layer(x))
            new = [rng.normal(size=w.shape).astype("float32") for w in layer.get_weights()]
            layer.set_weights(new)
            after = keras.ops.convert_to_numpy(layer(x))
        fresh = WeightDropLSTM(4, weight_dropout=0.5, return_sequences=True)
        fresh.build(x.shape)
        fresh.set_weights(new)
        with torch.no_grad():
            expected = keras.ops.convert_to_numpy(fresh(x))
        print(float(np.abs(after - expected).max()), float(np.abs(after - before).max()),
              layer.last_kernel)
    """)
    gap, moved, kernel = out.split()[-3:]
    assert kernel == "fused" and float(gap) < 1e-6 and float(moved) > 1e-2
