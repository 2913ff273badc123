"""AdvSoft (adversarial softmax): the closed-form perturbation against NumPy and against a
PyTorch transcription of the reference code; softmax and MoS heads; training only; every
regularizer under model.fit, .keras round trips and the JAX / PyTorch backends."""

import numpy as np
import pytest

import keras
import tensorflow as tf

from tests.backends import run_in_backend
from tests.tflm.layers.test_heads_backends import np_log_softmax, np_logsumexp
from tflm.layers import MoSLayer, SoftmaxLayer, TiedEmbedding
from tflm.layers.advsoft import adversarial_target_shift
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

def np_shift(h, e, alpha):
    """Per-position h . delta (thesis eq. 3.23 as the reference computes delta)."""
    n_h = np.sqrt((h ** 2).sum(-1, keepdims=True) + 1e-8)
    n_w = np.sqrt((e ** 2).sum(-1, keepdims=True) + 1e-8)
    cos = (h * e).sum(-1, keepdims=True) / (n_h * n_w)
    delta = -alpha * n_w * (cos > 0) * h / n_h
    return (h * delta).sum(-1), delta


def torch_reference_adv_logits(h, weight, bias, targets, alpha):
    """lmkit `AdvSmax.forward` / the AdvSoft `model.py` block, transcribed to PyTorch:
    the perturbation is scattered into a V x d buffer by target id and gathered back."""
    import torch
    h = torch.tensor(h, dtype=torch.float64)
    weight = torch.tensor(weight, dtype=torch.float64)
    targets = torch.tensor(targets, dtype=torch.long)
    logits = h @ weight.T + torch.tensor(bias, dtype=torch.float64)
    noise = torch.zeros_like(weight)
    neg_h = -h / torch.sqrt((h ** 2).sum(1, keepdim=True) + 1e-8)
    n_out = torch.sqrt((h ** 2).sum(1, keepdim=True) + 1e-8)
    e = weight[targets]
    n_w = torch.sqrt((e ** 2).sum(1, keepdim=True) + 1e-8)
    cos = (h * e).sum(1, keepdim=True) / n_out / n_w
    sigma = alpha * n_w * (cos > 0).to(h.dtype)
    noise[targets] = sigma * neg_h
    logits[torch.arange(len(targets)), targets] += (h * noise[targets]).sum(1)
    return torch.log_softmax(logits, -1).numpy()


def _tied_softmax(rng, vocab=12, dim=5, alpha=0.3):
    """A tied softmax head with AdvSoft, its weights drawn from the test's own `rng` (not
    Keras' global generator: the same weights whichever tests ran before)."""
    emb = TiedEmbedding(vocab, dim)
    emb.build()
    emb.embeddings.assign(rng.normal(size=(vocab, dim)).astype("float32") * 0.1)
    emb.output_bias.assign(rng.normal(size=vocab).astype("float32") * 0.1)
    return emb, SoftmaxLayer(embedding=emb, adversarial_alpha=alpha)


def test_shift_formula_and_its_gradient_is_delta():
    rng = np.random.default_rng(1)
    h = rng.normal(size=(3, 4, 6)).astype("float32")
    e = rng.normal(size=(3, 4, 6)).astype("float32")
    shift, delta = np_shift(h.astype(np.float64), e.astype(np.float64), 0.2)
    assert (shift < 0).any() and (shift == 0).any()  # the cos > 0 indicator acts both ways
    hv = tf.Variable(h)
    with tf.GradientTape() as tape:
        out = adversarial_target_shift(hv, e, 0.2)
        total = tf.reduce_sum(out)
    np.testing.assert_allclose(out.numpy(), shift, rtol=1e-5, atol=1e-7)
    # delta is a constant: d(h . delta)/dh = delta
    np.testing.assert_allclose(tape.gradient(total, hv).numpy(), delta,
                               rtol=1e-5, atol=1e-7)


def test_softmax_head_equals_the_reference_code_on_distinct_targets():
    rng = np.random.default_rng(2)
    emb, head = _tied_softmax(rng)
    h = rng.normal(size=(1, 8, 5)).astype("float32")
    targets = rng.permutation(12)[:8].reshape(1, 8)
    ours = np.asarray(head(h, training=True, targets=targets))
    weight, bias = np.asarray(emb.embeddings), np.asarray(emb.output_bias)
    ref = torch_reference_adv_logits(h[0], weight, bias, targets[0], 0.3)
    np.testing.assert_allclose(ours[0], ref, atol=2e-5)
    plain = np_log_softmax(h[0].astype(np.float64) @ weight.T + bias)
    assert np.abs(ref - plain).max() > 1e-3  # the perturbation is visible


def test_repeated_targets_get_their_own_delta_not_the_buffers_last():
    """The documented departure: the reference's V x d buffer gives every position with the
    same target the delta written last; ours is per position (eq. 3.23)."""
    rng = np.random.default_rng(3)
    emb, head = _tied_softmax(rng, alpha=0.5)
    h = rng.normal(size=(1, 6, 5)).astype("float32")
    targets = np.array([[3, 3, 3, 4, 4, 7]])
    weight, bias = np.asarray(emb.embeddings, np.float64), np.asarray(emb.output_bias)
    logits = h[0].astype(np.float64) @ weight.T + bias
    shift, _ = np_shift(h[0].astype(np.float64), weight[targets[0]], 0.5)
    logits[np.arange(6), targets[0]] += shift
    ours = np.asarray(head(h, training=True, targets=targets))[0]
    np.testing.assert_allclose(ours, np_log_softmax(logits), atol=2e-5)
    ref = torch_reference_adv_logits(h[0], weight, bias, targets[0], 0.5)
    np.testing.assert_allclose(ours[5], ref[5], atol=2e-5)  # a target seen once: the same


def test_only_the_target_logit_moves_and_only_in_training():
    rng = np.random.default_rng(4)
    emb, head = _tied_softmax(rng)
    h = rng.normal(size=(2, 5, 5)).astype("float32")
    targets = rng.integers(0, 12, size=(2, 5))
    targets[1, 2] = -1  # padding: no target
    plain = np.asarray(head(h, training=True)).astype(np.float64)
    adv = np.asarray(head(h, training=True, targets=targets)).astype(np.float64)
    np.testing.assert_allclose(np_logsumexp(adv, -1), 0.0, atol=2e-5)
    weight = np.asarray(emb.embeddings, np.float64)
    shift, _ = np_shift(h.astype(np.float64), weight[np.maximum(targets, 0)], 0.3)
    # log P' - log P = -log(Z'/Z) on every word but the target, which gets the shift too
    for b in range(2):
        for t in range(5):
            diff, z = adv[b, t] - plain[b, t], targets[b, t]
            if z < 0:
                np.testing.assert_allclose(diff, 0.0, atol=1e-6)
                continue
            others = np.delete(diff, z)
            np.testing.assert_allclose(others, others[0], atol=1e-5)
            assert diff[z] - others[0] == pytest.approx(shift[b, t], abs=2e-5)
    np.testing.assert_array_equal(np.asarray(head(h, training=False, targets=targets)),
                                  np.asarray(head(h, training=False)))


@pytest.mark.parametrize("mixture", ["batched", "sequential"])
def test_mos_perturbs_every_component_with_its_own_latent(mixture):
    rng = np.random.default_rng(5)
    emb = TiedEmbedding(10, 4)
    emb.build()
    head = MoSLayer(3, embedding=emb, adversarial_alpha=0.4, mixture=mixture)
    g = rng.normal(size=(2, 3, 7)).astype("float32")
    targets = rng.integers(0, 10, size=(2, 3))
    ours = np.asarray(head(g, training=True, targets=targets)).astype(np.float64)
    latent = np.tanh(g @ np.asarray(head.latent_kernel) + np.asarray(head.latent_bias))
    latent = latent.reshape(2, 3, 3, 4).astype(np.float64)
    weight = np.asarray(emb.embeddings, np.float64)
    logits = latent @ weight.T + np.asarray(emb.output_bias)          # (B, T, K, V)
    e = weight[targets][:, :, None, :]
    shift, _ = np_shift(latent, np.broadcast_to(e, latent.shape), 0.4)
    b, t = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    for k in range(3):
        logits[b, t, k, targets] += shift[:, :, k]
    log_prior = np_log_softmax(g @ np.asarray(head.prior_kernel))
    expected = np_logsumexp(log_prior[..., None] + np_log_softmax(logits), 2)
    np.testing.assert_allclose(ours, expected, atol=3e-5)


def test_model_passes_targets_in_training_and_evaluation_is_unchanged():
    rng = np.random.default_rng(6)
    kw = dict(embed_dim=6, hidden_dim=8, num_layers=2, dropout=0, dropout_h=0, dropout_i=0,
              dropout_e=0, weight_dropout=0, alpha=0, beta=0, seed=2)
    plain = AWDLSTM(30, **kw)
    plain.build()
    adv = AWDLSTM(30, head={"type": "softmax", "adversarial_alpha": 0.5}, **kw)
    adv.build()
    adv.set_weights(plain.get_weights())
    assert adv.uses_targets and not plain.uses_targets
    x = rng.integers(0, 30, size=(4, 7)).astype("int32")
    y = rng.integers(0, 30, size=(4, 7)).astype("int32")
    for m in (plain, adv):
        m.compile(optimizer=keras.optimizers.SGD(0.0))
    ev = [m.evaluate(x, y, batch_size=4, verbose=0, return_dict=True) for m in (plain, adv)]
    assert ev[1]["perplexity"] == pytest.approx(ev[0]["perplexity"], rel=1e-6)
    tr = [m.train_on_batch(x, y, return_dict=True) for m in (plain, adv)]
    assert tr[1]["loss"] > tr[0]["loss"] + 1e-4  # the adversary raises the training loss
    direct = adv(x, training=True, targets=y)
    nll = -np.take_along_axis(np.asarray(direct), y[..., None], -1).mean()
    assert tr[1]["nll"] == pytest.approx(nll, rel=1e-5)


BACKEND_SNIPPET = """
import json, tempfile, os, numpy as np, keras
from tflm.layers import SoftmaxLayer, TiedEmbedding
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
rng = np.random.default_rng(0)
out = {}
emb = TiedEmbedding(12, 5); emb.build()
emb.embeddings.assign(np.asarray(__WEIGHT__, "float32"))
head = SoftmaxLayer(embedding=emb, adversarial_alpha=0.3)
out["head"] = np.asarray(keras.ops.convert_to_numpy(
    head(np.asarray(__H__, "float32"), training=True, targets=np.asarray(__T__)))).tolist()
x = rng.integers(0, 40, size=(4, 61)).astype("int32")
xs, ys = x[:, :-1].reshape(4, 6, 10).transpose(1, 0, 2), x[:, 1:].reshape(4, 6, 10).transpose(1, 0, 2)
for name, kw in [("adv_mos_noise_cos", dict(head={"type": "mos", "num_experts": 2,
                                                   "adversarial_alpha": 0.005},
                                             embedding_noise=0.15, cosine_regularization=0.5)),
                 ("adv_softmax_sc", dict(head={"type": "softmax", "adversarial_alpha": 0.005},
                                         spectrum_control=True))]:
    m = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=10, **kw)
    m.compile(optimizer=keras.optimizers.SGD(5.0))
    h = m.fit(np.concatenate(xs), np.concatenate(ys), batch_size=4, epochs=3, verbose=0)
    path = os.path.join(tempfile.mkdtemp(), "m.keras"); m.save(path)
    loaded = keras.saving.load_model(path)
    same = np.array_equal(keras.ops.convert_to_numpy(m(xs[0])),
                          keras.ops.convert_to_numpy(loaded(xs[0])))
    out[name] = {"loss": h.history["loss"], "reload_equal": bool(same)}
print("RESULT " + json.dumps(out))
"""


# JAX in CI: the one default-run check of README's "a head that reads targets gets them ...
# on JAX" (the sampled and PDR heads' JAX variants are slow).
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_regularizers_train_and_reload_on_other_backends(backend):
    rng = np.random.default_rng(7)
    import json
    emb, head = _tied_softmax(rng, alpha=0.3)
    weight = np.asarray(emb.embeddings)
    emb2 = TiedEmbedding(12, 5)
    emb2.build()
    emb2.embeddings.assign(weight)
    ref_head = SoftmaxLayer(embedding=emb2, adversarial_alpha=0.3)
    h = rng.normal(size=(2, 4, 5)).astype("float32")
    t = rng.integers(0, 12, size=(2, 4))
    expected = np.asarray(ref_head(h, training=True, targets=t))
    code = (BACKEND_SNIPPET.replace("__WEIGHT__", repr(weight.tolist()))
            .replace("__H__", repr(h.tolist())).replace("__T__", repr(t.tolist())))
    stdout = run_in_backend(backend, code)
    result = json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    np.testing.assert_allclose(np.asarray(result["head"]), expected, atol=2e-5)
    for name in ("adv_mos_noise_cos", "adv_softmax_sc"):
        losses = result[name]["loss"]
        assert all(np.isfinite(losses)) and losses[-1] < losses[0], (name, losses)
        assert result[name]["reload_equal"], name
