"""`LanguageModel` on the JAX backend: `model.fit` with carried state, and a train step equal
to TensorFlow's (PyTorch's too: both pick the targets' log-probabilities in training)."""

import importlib.util

import numpy as np
import pytest

from tests.backends import run_in_backend

KERAS_BACKENDS = [b for b in ("tensorflow", "jax", "torch")
                  if importlib.util.find_spec(b) is not None]


# Slow tier (16 s); in CI: the JAX step [mos] here, test_without_tensorflow[jax],
# test_evaluate[jax].
@pytest.mark.slow
@pytest.mark.skipif("jax" not in KERAS_BACKENDS, reason="jax is not installed")
def test_jax_fit_carries_state_evaluates_predicts_and_saves(tmp_path):
    out = run_in_backend("jax", f"""
        import numpy as np, keras
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
        m = AWDLSTM(20, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=5)
        m.compile(optimizer=keras.optimizers.SGD(2.0))
        m.build()
        pattern = np.random.default_rng(0).integers(0, 20, 7)     # learnable, period 7
        data = np.stack([np.tile(pattern, 30)[:200], np.tile(pattern, 30)[3:203]]).astype("int32")
        # windows in stream order: rows 2k, 2k+1 of x are the two streams at window k
        x = np.stack([data[:, i:i+5] for i in range(0, 190, 5)]).reshape(-1, 5)
        y = np.stack([data[:, i+1:i+6] for i in range(0, 190, 5)]).reshape(-1, 5)
        n_weights = len(m.get_weights())
        h = m.fit(x, y, batch_size=2, shuffle=False, epochs=3, verbose=0,
                  validation_data=(x, y))
        # The carried state is in the jitted step's state but not a weight.
        assert len(m.get_weights()) == n_weights, (len(m.get_weights()), n_weights)
        names = [v.name for v in m.non_trainable_variables if "stream_state" in v.name]
        assert len(names) == 8, names   # (h, c) x 2 layers x (train, eval)
        ev = m.evaluate(x, y, batch_size=2, verbose=0, return_dict=True)
        # A generator: its first batch tells the batch size, and the pass still sees it.
        gen = ((x[i:i+2], y[i:i+2]) for i in range(0, len(x), 2))
        ev_gen = m.evaluate(gen, verbose=0, return_dict=True)
        assert abs(ev_gen["perplexity"] - ev["perplexity"]) < 1e-4 * ev["perplexity"], (
            ev_gen, ev)
        # The same pass by hand on the eager path, carrying the state (and not carrying it).
        m.reset_states()
        with m.streaming():
            carried = np.concatenate([keras.ops.convert_to_numpy(m(x[i:i+2]))
                                      for i in range(0, len(x), 2)])
        fresh = np.concatenate([keras.ops.convert_to_numpy(m.forward_with_state(x[i:i+2])[0])
                                for i in range(0, len(x), 2)])
        nll = -np.take_along_axis(carried, y[:, :, None], -1).mean()
        pred = m.predict(x, batch_size=2, verbose=0, stream=True)  # jitted, carried
        path = "{tmp_path}/m.keras"
        m.save(path)
        m2 = keras.saving.load_model(path)
        same = all(np.array_equal(a, b) for a, b in zip(m.get_weights(), m2.get_weights()))
        print(h.history["perplexity"][0], h.history["perplexity"][-1],
              h.history["val_perplexity"][-1], ev["perplexity"], float(np.exp(nll)),
              np.abs(pred - carried).max(), np.abs(fresh - carried).max(), same)
    """)
    first, last, val, ev, by_hand, pred_gap, fresh_gap, same = out.split()[-8:]
    assert float(last) < float(first)
    assert float(ev) == pytest.approx(float(by_hand), rel=2e-5)
    assert float(val) == pytest.approx(float(ev), rel=2e-5)
    assert float(pred_gap) < 1e-5 < 1e-3 < float(fresh_gap)  # carried, and it matters
    assert same == "True"


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("head", ["mos", pytest.param("softmax", marks=pytest.mark.slow),
                                  pytest.param("moc", marks=pytest.mark.slow)])
def test_picking_train_step_equals_tensorflow_with_clipping_decay_and_window_scaling(
        tmp_path, backend, head):
    """The JAX and PyTorch steps apply the same update as the TensorFlow step: a window
    shorter than bptt (T/bptt scaling), clipping active, L2 decay, AR/TAR, two steps (state
    carried). With each head their steps compute the targets' log-probabilities alone
    (JAX: `tflm.backends.jax_target_log_probs`, the softmax's and MoC's,
    `jax_mixture_target_log_probs`, MoS'; PyTorch: `Backend.target_log_probs` and
    `mixture_target_log_probs`), TensorFlow's the full distribution."""
    if backend not in KERAS_BACKENDS or "tensorflow" not in KERAS_BACKENDS:
        pytest.skip(f"needs {backend} and tensorflow")
    code = """
        import numpy as np, keras
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
        from tflm.optimizers import SGD
        keras.utils.set_random_seed(0)
        m = AWDLSTM(15, embed_dim=4, hidden_dim=6, num_layers=2, dropout=0, dropout_h=0,
                    dropout_i=0, dropout_e=0, weight_dropout=0, bptt=8, clip_norm=0.05,
                    weight_decay=0.01, head=HEAD)
        m.build()
        assert m.picks_targets_in_training == (keras.backend.backend() in ("jax", "torch"))
        w = np.load("%s/w.npz")
        m.set_weights([w[f"a{i}"] for i in range(len(w.files))])
        m.compile(optimizer=SGD(3.0))
        rng = np.random.default_rng(0)
        x = rng.integers(0, 15, (3, 12)).astype("int32"); y = np.roll(x, -1, 1)
        logs = [m.train_on_batch(x[:, :6], y[:, :6], return_dict=True),
                m.train_on_batch(x[:, 6:], y[:, 6:], return_dict=True)]
        np.savez("%s/out_" + keras.backend.backend() + ".npz", *m.get_weights())
        print(logs[0]["loss"], logs[1]["loss"], logs[0]["grad_norm"])
    """ % (tmp_path, tmp_path)
    spec = {"type": head, "num_experts": 2} if head != "softmax" else {"type": "softmax"}
    code = code.replace("HEAD", repr(spec))
    run_in_backend("tensorflow", f"""
        import numpy as np
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
        m = AWDLSTM(15, embed_dim=4, hidden_dim=6, num_layers=2, last_dim=4,
                    head={spec!r}); m.build()
        np.savez("{tmp_path}/w.npz", **{{f"a{{i}}": v for i, v in enumerate(m.get_weights())}})
    """)
    tf_out = run_in_backend("tensorflow", code).split()[-3:]
    out = run_in_backend(backend, code).split()[-3:]
    np.testing.assert_allclose([float(v) for v in out], [float(v) for v in tf_out],
                               rtol=1e-5)
    assert float(tf_out[2]) > 0.05  # the clip was active
    a = np.load(tmp_path / "out_tensorflow.npz")
    b = np.load(tmp_path / f"out_{backend}.npz")
    for key in a.files:
        np.testing.assert_allclose(b[key], a[key], atol=1e-6, err_msg=key)
