"""NeuralODELogits (Andonov 2019 §4.3, §7.3.2): the formula against SciPy, invariants,
gradients (adjoint = backpropagation), NFE in the logs, saving, other backends."""

import json
import os
import tempfile

import keras
import numpy as np
import pytest
import scipy.integrate
import scipy.special
import tensorflow as tf

from tests.backends import run_in_backend
from tflm.layers import NeuralODELogits, SoftmaxLayer, TiedEmbedding
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

RNG = np.random.default_rng(7)


def _head(vocab=30, dim=5, scale=0.3, seed=0, **kwargs):
    """A tied head with random W_f and a non-zero W (W starts at zero otherwise)."""
    emb = TiedEmbedding(vocab, dim)
    emb.build()
    rng = np.random.default_rng(seed + 100)
    emb.embeddings.assign(rng.normal(size=(vocab, dim)).astype("float32") * 0.5)
    emb.output_bias.assign(rng.normal(size=vocab).astype("float32"))
    head = NeuralODELogits(embedding=emb, **kwargs)
    head.build((None, None, dim))
    rng = np.random.default_rng(seed)
    head.w_f.assign(rng.normal(size=head.w_f.shape).astype("float32") * scale)
    head.w.assign(rng.normal(size=head.w.shape).astype("float32") * scale)
    return emb, head


def _reference_log_probs(h, emb, head, t1=1.0):
    """log_softmax(l(t1)) with l' = W softplus(W_f^T [l; t]) solved by SciPy (float64)."""
    e = np.asarray(emb.embeddings, np.float64)
    bias = np.asarray(emb.output_bias, np.float64)
    w_f = np.asarray(head.w_f, np.float64)
    w = np.asarray(head.w, np.float64)
    l0 = h.reshape(-1, h.shape[-1]).astype(np.float64) @ e.T + bias
    v = l0.shape[-1]

    def f(t, y):
        l = y.reshape(-1, v)
        return (np.logaddexp(0.0, l @ w_f[:v] + t * w_f[v]) @ w.T).ravel()

    sol = scipy.integrate.solve_ivp(f, (0.0, t1), l0.ravel(), method="DOP853", rtol=1e-11,
                                    atol=1e-11)
    l1 = sol.y[:, -1].reshape(l0.shape)
    return scipy.special.log_softmax(l1, axis=-1).reshape(h.shape[:-1] + (v,))


@pytest.mark.parametrize("method,extra", [("dopri5", {}), ("rk4", {"step_size": 0.05})])
def test_log_probs_equal_scipy_solution_and_normalize(method, extra):
    for seed in range(3):
        emb, head = _head(seed=seed, method=method, rtol=1e-7, atol=1e-7, **extra)
        h = np.random.default_rng(10 + seed).normal(size=(3, 4, 5)).astype("float32")
        ours = np.asarray(head(h), np.float64)
        np.testing.assert_allclose(ours, _reference_log_probs(h, emb, head), atol=2e-5)
        np.testing.assert_allclose(scipy.special.logsumexp(ours, axis=-1), 0.0, atol=2e-6)
        assert float(head.nfe.numpy()) > 0


def test_starts_as_the_softmax_of_the_projection():
    """W = 0 at initialisation: f = 0, the head equals SoftmaxLayer on the same embedding."""
    emb = TiedEmbedding(40, 6)
    emb.build()
    node, soft = NeuralODELogits(embedding=emb), SoftmaxLayer(embedding=emb)
    h = RNG.normal(size=(2, 5, 6)).astype("float32")
    np.testing.assert_allclose(np.asarray(node(h)), np.asarray(soft(h)), atol=1e-6)
    assert not np.any(np.asarray(node.w)) and np.any(np.asarray(node.w_f))
    assert node.w_f.shape == (41, 6) and node.w.shape == (40, 6)  # k = d by default


def test_breaks_the_rank_bound_of_the_softmax():
    """Softmax Q_theta has rank <= d + 2; the ODE map of the logits is non-linear. Its
    singular values decay fast (s_7..s_10 / s_1 ~ 7e-4..2e-5 here), yet stand far above the
    float32 noise that ends the softmax spectrum (~1e-8 s_1)."""
    emb, head = _head(vocab=60, dim=4, scale=0.5, seed=3)
    h = RNG.normal(size=(1, 300, 4)).astype("float32")
    soft = SoftmaxLayer(embedding=emb)

    def rank(q):
        s = np.linalg.svd(q.astype(np.float64), compute_uv=False)
        return int(np.sum(s > 1e-6 * s[0]))

    q_soft, q_node = np.asarray(soft(h))[0], np.asarray(head(h))[0]
    assert rank(q_soft) <= 4 + 2
    assert rank(q_node) >= 4 + 2 + 3


def test_rank_is_bounded_by_d_plus_bottleneck_plus_two():
    """l(t1) - l(t0) lies in the column space of W (V x k): rank(Q) <= d + k + 2, and a
    generic field reaches the bound."""
    dim, k = 4, 3
    emb, head = _head(vocab=60, dim=dim, scale=0.5, seed=3, bottleneck=k, rtol=1e-7,
                      atol=1e-7)
    h = RNG.normal(size=(1, 300, dim)).astype("float32")
    s = np.linalg.svd(np.asarray(head(h))[0].astype(np.float64), compute_uv=False)
    assert s[dim + k + 2] < 1e-5 * s[0]        # float32 noise beyond the bound
    assert s[dim + k + 1] > 1e-4 * s[0]        # the bound is reached


def test_adjoint_gradients_equal_backpropagation():
    h = RNG.normal(size=(2, 3, 5)).astype("float32")
    y = RNG.integers(0, 30, size=(2, 3))
    grads = {}
    for adjoint in (False, True):
        emb, head = _head(seed=1, adjoint=adjoint, rtol=1e-7, atol=1e-7)
        hv = tf.constant(h)
        with tf.GradientTape() as tape:
            tape.watch(hv)
            lp = head(hv)
            loss = -tf.reduce_mean(tf.gather(lp, y, batch_dims=2))
        variables = [head.w_f, head.w, emb.embeddings]
        grads[adjoint] = [g.numpy() for g in tape.gradient(loss, [hv] + variables)]
    for a, b in zip(grads[False], grads[True]):
        np.testing.assert_allclose(b, a, atol=2e-5 * np.abs(a).max() + 1e-7)
    assert np.abs(grads[True][2]).max() > 0  # W gets a gradient


def test_bottleneck_config_and_bad_arguments():
    emb = TiedEmbedding(20, 4)
    head = NeuralODELogits(embedding=emb, bottleneck=7, method="rk4", step_size=0.25,
                           adjoint=False, init="pytorch")
    head.build((None, None, 4))
    assert head.w_f.shape == (21, 7) and head.w.shape == (20, 7)
    assert np.abs(np.asarray(head.w_f)).max() <= 21 ** -0.5
    clone = NeuralODELogits.from_config(head.get_config())
    assert clone.get_config() == head.get_config()
    with pytest.raises(ValueError, match="bottleneck"):
        NeuralODELogits(embedding=emb, bottleneck=0)
    with pytest.raises(ValueError, match="step_size"):
        NeuralODELogits(embedding=emb, method="rk4")
    with pytest.raises(ValueError, match="init"):
        NeuralODELogits(embedding=emb, init="torch")


def _windows(vocab=40, batch=4, steps=6, bptt=10, seed=0):
    x = np.random.default_rng(seed).integers(0, vocab, size=(batch, steps * bptt + 1))
    xs = np.concatenate([x[:, i:i + bptt] for i in range(0, steps * bptt, bptt)])
    ys = np.concatenate([x[:, i + 1:i + bptt + 1] for i in range(0, steps * bptt, bptt)])
    return xs.astype("int32"), ys.astype("int32")


def test_fit_reports_nfe_and_saves(tmp_path):
    xs, ys = _windows()
    m = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=10,
                head={"type": "node", "rtol": 1e-6, "atol": 1e-6})
    m.compile(optimizer=keras.optimizers.SGD(5.0))
    hist = m.fit(xs, ys, batch_size=4, epochs=2, verbose=0, validation_data=(xs, ys)).history
    assert hist["loss"][-1] < hist["loss"][0]
    assert all(v >= 8 and (v - 2) % 6 == 0 for v in hist["nfe"] + hist["val_nfe"])  # 2 + 6 n
    assert np.abs(np.asarray(m.head.w)).max() > 0
    path = tmp_path / "m.keras"
    m.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(np.asarray(loaded(xs[:4])), np.asarray(m(xs[:4])))
    assert loaded.head.solver == m.head.solver


BACKEND_SNIPPET = """
import json, os, tempfile, numpy as np, keras
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
x = np.random.default_rng(0).integers(0, 40, size=(4, 61))
xs = np.concatenate([x[:, i:i + 10] for i in range(0, 60, 10)]).astype("int32")
ys = np.concatenate([x[:, i + 1:i + 11] for i in range(0, 60, 10)]).astype("int32")
out = {}
for adjoint in (True, False):
    m = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=10,
                head={"type": "node", "adjoint": adjoint})
    m.compile(optimizer=keras.optimizers.SGD(5.0))
    h = m.fit(xs, ys, batch_size=4, epochs=2, verbose=0).history
    path = os.path.join(tempfile.mkdtemp(), "m.keras"); m.save(path)
    loaded = keras.saving.load_model(path)
    same = np.array_equal(keras.ops.convert_to_numpy(m(xs[:4])),
                          keras.ops.convert_to_numpy(loaded(xs[:4])))
    out[str(adjoint)] = {"loss": h["loss"], "nfe": h["nfe"], "reload_equal": bool(same),
                         "w": float(np.abs(keras.ops.convert_to_numpy(m.head.w)).max())}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["jax", pytest.param("torch", marks=pytest.mark.slow)])
def test_fit_and_reload_on_other_backends(backend):
    """JAX: backpropagation runs through the bounded scan, the adjoint through while loops."""
    stdout = run_in_backend(backend, BACKEND_SNIPPET)
    result = json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    for adjoint, r in result.items():
        assert all(np.isfinite(r["loss"])) and r["loss"][-1] < r["loss"][0], (adjoint, r)
        assert all(n >= 8 for n in r["nfe"]) and r["w"] > 0 and r["reload_equal"], (adjoint, r)
