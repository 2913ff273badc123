"""CNFHead and ConditionalCNFHead (Andonov 2019 §6.3-6.6): the trace formulas against a
brute-force Jacobian and Hutchinson's mean, the heads against a SciPy solve, rank bounds,
adjoint = backpropagation, sampled vs full, fit / reload on TF, JAX and PyTorch."""

import json

import keras
import numpy as np
import pytest
import scipy.integrate
import scipy.special
import tensorflow as tf
from keras import ops

from tests.backends import run_in_backend
from tflm.layers import (CNFHead, ConditionalCNFHead, MoSLayer, SoftmaxLayer,
                         TiedEmbedding)
from tflm.layers import flow_field

RNG = np.random.default_rng(11)


def _flow_weights(d, k, rng, scale=0.6):
    return [rng.normal(size=(d, k)) * scale, rng.normal(size=k) * scale,
            rng.normal(size=k) * scale, rng.normal(size=(k, d)) * scale,
            rng.normal(size=d) * scale]


def test_traces_equal_the_brute_force_jacobian_and_hutchinsons_mean():
    d, k = 5, 7
    w_z, w_t, b_in, w_out, b_out = _flow_weights(d, k, RNG)
    z, t = RNG.normal(size=(3, d)), 0.4

    def f(zz):
        a = flow_field.pre_activation(t, tf.constant(zz), w_z, w_t, b_in)
        return flow_field.field_value(a, w_out, b_out).numpy()

    step = 1e-6
    jac = np.stack([(f(z + step * np.eye(d)[j]) - f(z - step * np.eye(d)[j])) / (2 * step)
                    for j in range(d)], axis=-1)  # (3, d, d): d f_i / d z_j
    a = flow_field.pre_activation(t, tf.constant(z), w_z, w_t, b_in)
    np.testing.assert_allclose(flow_field.exact_trace(a, w_z, w_out).numpy(),
                               np.trace(jac, axis1=1, axis2=2), rtol=1e-6)
    eps = RNG.normal(size=(3, d))
    np.testing.assert_allclose(flow_field.hutchinson_trace(a, eps, w_z, w_out).numpy(),
                               np.einsum("bi,bij,bj->b", eps, jac, eps), rtol=1e-6)
    draws = 40_000
    for noise in (RNG.normal(size=(draws, d)), RNG.choice([-1.0, 1.0], size=(draws, d))):
        a_rep = tf.repeat(a[:1], draws, axis=0)
        est = flow_field.hutchinson_trace(a_rep, noise, w_z, w_out).numpy()
        exact = np.trace(jac[0])
        assert abs(est.mean() - exact) < 4 * est.std() / np.sqrt(draws)


def _tied(vocab, dim, rng):
    emb = TiedEmbedding(vocab, dim)
    emb.build()
    emb.embeddings.assign(rng.normal(size=(vocab, dim)).astype("float32") * 0.5)
    emb.output_bias.assign(rng.normal(size=vocab).astype("float32"))
    return emb


def _randomize(head, rng, scale=0.5):
    for v in head.trainable_variables:
        if any(v is w for w in head.flow_params()) or v.name in ("w_h", "b_h"):
            v.assign(rng.normal(size=v.shape).astype("float32") * scale)


def _scipy_delta(z0, weights, context=None, t1=1.0):
    """Delta = int Tr(df/dz) dt along z(t) for every row of z0, by DOP853 in float64."""
    w_z, w_t, b_in, w_out, b_out = [np.asarray(w, np.float64) for w in weights]
    n, d = z0.shape
    ctx = 0.0 if context is None else context

    def rhs(t, y):
        z = y[:n * d].reshape(n, d)
        a = z @ w_z + t * w_t + b_in + ctx
        trace = scipy.special.expit(a) @ np.sum(w_z * w_out.T, axis=0)
        return np.concatenate([(np.logaddexp(0, a) @ w_out + b_out).ravel(), trace])

    sol = scipy.integrate.solve_ivp(rhs, (0, t1), np.concatenate([z0.ravel(), np.zeros(n)]),
                                    method="DOP853", rtol=1e-11, atol=1e-11)
    return sol.y[n * d:, -1]


def test_cnf_head_equals_scipy_and_starts_at_its_base():
    rng = np.random.default_rng(1)
    emb = _tied(25, 4, rng)
    base = SoftmaxLayer(embedding=emb)
    head = CNFHead(base, embedding=emb, trace="exact", rtol=1e-7, atol=1e-7)
    h = rng.normal(size=(2, 3, 4)).astype("float32")
    np.testing.assert_allclose(head(h).numpy(), base(h).numpy(), atol=1e-6)  # W_out = 0
    _randomize(head, rng)
    got = head(h).numpy()
    delta = _scipy_delta(emb.embeddings.numpy().astype(np.float64),
                         [w.numpy() for w in head.flow_params()])
    want = scipy.special.log_softmax(base(h).numpy().astype(np.float64) - delta, axis=-1)
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(scipy.special.logsumexp(got, axis=-1), 0.0, atol=1e-5)
    assert float(head.nfe.numpy()) >= 8


def test_conditional_head_equals_scipy_per_context_and_normalizes():
    rng = np.random.default_rng(2)
    emb = _tied(12, 3, rng)
    head = ConditionalCNFHead(embedding=emb, trace="exact", rtol=1e-7, atol=1e-7)
    h = rng.normal(size=(1, 2, 3)).astype("float32")
    head(h)
    _randomize(head, rng)
    got = head(h).numpy()
    weights = [w.numpy() for w in head.flow_params()]
    logits = h[0].astype(np.float64) @ emb.embeddings.numpy().T + emb.output_bias.numpy()
    for t in range(2):
        ctx = h[0, t] @ head.w_h.numpy() + head.b_h.numpy()
        delta = _scipy_delta(emb.embeddings.numpy().astype(np.float64), weights, ctx)
        want = scipy.special.log_softmax(logits[t] - delta)
        np.testing.assert_allclose(got[0, t], want, atol=2e-5)


def _rank(q):
    s = np.linalg.svd(q.astype(np.float64), compute_uv=False)
    return int(np.sum(s > 1e-5 * s[0]))


def test_basic_flow_stays_within_its_base_rank_and_the_conditional_flow_does_not():
    """Basic CNF: Q = base - 1 Delta^T - lse: rank <= rank(base) + 1 (thesis §6.3), for a
    softmax (<= d + 2) and an MoS base; the context-conditioned flow passes d + 2 (§6.4)."""
    rng = np.random.default_rng(3)
    d, vocab = 3, 40
    emb = _tied(vocab, d, rng)
    h = rng.normal(size=(1, 120, d)).astype("float32")
    for base in (SoftmaxLayer(embedding=emb), MoSLayer(embedding=emb, num_experts=2)):
        head = CNFHead(base, embedding=emb, trace="exact")
        head(h)
        _randomize(head, rng)
        q_base, q_flow = base(h).numpy()[0], head(h).numpy()[0]
        assert np.abs(q_flow - q_base).max() > 0.05
        assert _rank(q_flow) <= _rank(q_base) + 1
    cond = ConditionalCNFHead(embedding=emb, trace="exact")
    cond(h)
    _randomize(cond, rng)
    q_soft, q_cond = SoftmaxLayer(embedding=emb)(h).numpy()[0], cond(h).numpy()[0]
    assert _rank(q_soft) <= d + 2 < d + 2 + 4 <= _rank(q_cond)


def test_adjoint_gradients_equal_backpropagation():
    rng = np.random.default_rng(4)
    h = rng.normal(size=(2, 3, 4)).astype("float32")
    y = rng.integers(0, 15, size=(2, 3))
    for make in (lambda e, **kw: CNFHead(SoftmaxLayer(embedding=e), embedding=e, **kw),
                 lambda e, **kw: ConditionalCNFHead(embedding=e, **kw)):
        grads = {}
        for adjoint in (False, True):
            emb = _tied(15, 4, np.random.default_rng(5))
            head = make(emb, trace="exact", adjoint=adjoint, rtol=1e-7, atol=1e-7)
            head(h)
            _randomize(head, np.random.default_rng(6))
            hv = tf.constant(h)
            with tf.GradientTape() as tape:
                tape.watch(hv)
                loss = -tf.reduce_mean(tf.gather(head(hv), y, batch_dims=2))
            variables = [hv, emb.embeddings] + list(head.flow_params())
            grads[adjoint] = [tf.convert_to_tensor(g).numpy()
                              for g in tape.gradient(loss, variables)]
        for a, b in zip(grads[False], grads[True]):
            np.testing.assert_allclose(b, a, atol=1e-4 * np.abs(a).max() + 1e-7)
        assert np.abs(grads[True][-2]).max() > 0  # W_out gets a gradient


def test_hutchinson_in_training_exact_in_evaluation():
    """Training draws fresh noise each call (Hutchinson); evaluation is exact and equals
    the mean of many Hutchinson evaluations' Delta."""
    rng = np.random.default_rng(7)
    emb = _tied(10, 3, rng)
    head = CNFHead(SoftmaxLayer(embedding=emb), embedding=emb, seed=1)
    h = rng.normal(size=(1, 2, 3)).astype("float32")
    head(h)
    _randomize(head, rng)
    a, b = head(h, training=True).numpy(), head(h, training=True).numpy()
    assert np.abs(a - b).max() > 1e-3
    np.testing.assert_array_equal(head(h).numpy(), head(h).numpy())
    exact = head.word_bias(training=False)[0].numpy()
    draw = tf.function(lambda: head.word_bias(training=True)[0])  # a quarter of eager's time
    draws = np.stack([draw().numpy() for _ in range(300)])
    assert np.all(np.abs(draws.mean(0) - exact) < 5 * draws.std(0) / np.sqrt(300) + 1e-6)


def test_conditional_sampled_training_uses_the_same_flow_as_evaluation():
    """The sampled path's log-densities of the candidates equal the full path's entries
    (exact trace); chunked evaluation equals one solve to the tolerance."""
    rng = np.random.default_rng(8)
    emb = _tied(20, 3, rng)
    head = ConditionalCNFHead(embedding=emb, num_samples=6, trace="exact", rtol=1e-7,
                              atol=1e-7, sampling_seed=3)
    h = rng.normal(size=(2, 3, 3)).astype("float32")
    y = rng.integers(0, 20, (2, 3)).astype("int32")
    full = head(h).numpy()
    _randomize(head, rng)
    full = head(h).numpy()
    ids, log_q = (t.numpy() for t in head.sampler(y))
    density, _ = head.flowed_log_density(h, ids)
    lse = scipy.special.logsumexp(
        head.flowed_log_density(h, head._all_words(h, 0, 20))[0].numpy(), axis=-1)
    np.testing.assert_allclose(density.numpy() - lse[..., None],
                               np.take_along_axis(full, ids, -1), atol=2e-5)
    sampled = head(h, training=True, targets=y).numpy()
    assert sampled.shape == (2, 3, 7)
    np.testing.assert_allclose(np.exp(sampled).sum(-1), 1.0, atol=1e-5)
    head.vocab_chunk = 6
    np.testing.assert_allclose(head(h).numpy(), full, atol=2e-5)
    with pytest.raises(ValueError, match="vocab_chunk"):
        ConditionalCNFHead(vocab_size=5, vocab_chunk=0)
    with pytest.raises(ValueError, match="trace must be one of"):
        CNFHead(SoftmaxLayer(vocab_size=5), vocab_size=5, trace="brute")
    with pytest.raises(ValueError, match="same vocabulary projection"):
        CNFHead(SoftmaxLayer(vocab_size=5), embedding=emb)


BACKEND_SNIPPET = """
import json, os, tempfile, numpy as np, keras
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
x = np.random.default_rng(0).integers(0, 30, size=(4, 17))
xs = np.concatenate([x[:, i:i + 8] for i in range(0, 16, 8)]).astype("int32")
ys = np.concatenate([x[:, i + 1:i + 9] for i in range(0, 16, 8)]).astype("int32")
out = {}
tol = {"rtol": 1e-4, "atol": 1e-4}
for name, head in (("cnf_mos", dict(type="cnf", base={"type": "mos", "num_experts": 2}, **tol)),
                   ("ccnf", dict(type="ccnf", num_samples=4, vocab_chunk=16, **tol))):
    m = AWDLSTM(30, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=8, head=head)
    m.compile(optimizer=keras.optimizers.SGD(5.0))
    h = m.fit(xs, ys, batch_size=4, epochs=2, verbose=0, validation_data=(xs, ys)).history
    path = os.path.join(tempfile.mkdtemp(), "m.keras"); m.save(path)
    loaded = keras.saving.load_model(path)
    diff = np.abs(keras.ops.convert_to_numpy(m(xs[:4])) -
                  keras.ops.convert_to_numpy(loaded(xs[:4]))).max()
    out[name] = {"loss": h["loss"], "val": h["val_perplexity"], "nfe": h["nfe"],
                 "val_nfe": h["val_nfe"], "reload": float(diff),
                 "w_out": float(np.abs(keras.ops.convert_to_numpy(m.head.w_out)).max())}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.slow),
                                     "torch"])
def test_flow_heads_fit_and_reload(backend):
    """A CNF on an MoS base and a sampled conditional CNF train under model.fit (the
    flow's weights move), report NFE, evaluate in full, and reload exactly."""
    stdout = run_in_backend(backend, BACKEND_SNIPPET)
    result = json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    for name, r in result.items():
        assert all(np.isfinite(r["loss"])) and all(np.isfinite(r["val"])), (name, r)
        assert r["val"][-1] < 30 and r["w_out"] > 0 and r["reload"] < 1e-5, (name, r)
        assert min(r["nfe"]) >= 8 and min(r["val_nfe"]) >= 8, (name, r)


def test_presets_of_every_published_flow_row():
    """Tables 7.4-7.7 and 7.10 of the thesis: one preset per row, each on its base preset,
    with the published figures (spot checks of the rows the thesis highlights)."""
    from zoo.presets import list_presets, load_preset
    counts = {}
    for name in list_presets():
        table = load_preset(name).get("reproduces", "")
        for t in ("7.4", "7.5", "7.6", "7.7", "7.10"):
            if f"Table {t} row" in table:
                counts[t] = counts.get(t, 0) + 1
                assert load_preset(name)["base"]["preset"] in list_presets(), name
    assert counts == {"7.4": 8, "7.5": 8, "7.6": 10, "7.7": 8, "7.10": 5}
    best_mos = load_preset("cnf_mos_ptb_pre_frozen_lr01")
    assert (best_mos["published"]["valid"], best_mos["published"]["test"]) == (56.50, 54.42)
    assert best_mos["model"]["head"]["base"]["type"] == "mos" and best_mos["model"]["freeze_base"]
    ccnf = load_preset("ccnf_ptb_raw_full_lr001")
    assert ccnf["model"]["head"]["num_samples"] == 20
    assert ccnf["corpus"]["max_test_tokens"] == 401 and ccnf["published"]["test"] == 51.09
    char = load_preset("ccnf_ptb_char_full_lr00001")
    assert char["published"]["test_bpc"] == 1.182 and "num_samples" not in char["model"]["head"]
    assert char["training"]["optimizer"] == "adam" and char["training"]["lr"] == 1e-4
