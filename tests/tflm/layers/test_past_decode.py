"""Past Decode Regularization (Brahma 2019): the loss against a NumPy transcription of its
equations (values, gradients by finite differences), the heads it takes and refuses, training
only, its exact share of zoo.AWDLSTM's training loss, evaluation unchanged, .keras round
trips, and short fits under JAX and PyTorch."""

import json

import numpy as np
import pytest

import keras
import tensorflow as tf

from tests.backends import run_in_backend
from tests.numeric_grad import numeric_grad
from tests.tflm.layers.test_heads_backends import np_log_softmax
from tflm.layers import (DOCLayer, GSSHead, MoCLayer, MoSLayer, PastDecode, SoftmaxLayer,
                         TiedEmbedding)
from tflm.layers.past_decode import past_decode_loss
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

RNG = np.random.default_rng(11)


def np_past_decode_loss(log_probs, tokens, embeddings, kernel, bias, decoder, decoder_bias):
    """The paper's equations, in float64: e~ = E^T p, h~ = tanh(W e~ + b_PDR),
    P_PDR = softmax(D h~ + b), L = mean over real positions of -log P_PDR(w_t)."""
    p = np.exp(np.asarray(log_probs, np.float64))
    expected = p @ np.asarray(embeddings, np.float64)
    hidden = np.tanh(expected @ np.asarray(kernel, np.float64) + np.asarray(bias, np.float64))
    logits = hidden @ np.asarray(decoder, np.float64).T + np.asarray(decoder_bias, np.float64)
    log_past = np_log_softmax(logits)
    tokens = np.asarray(tokens)
    real = tokens >= 0
    nll = -np.take_along_axis(log_past, np.maximum(tokens, 0)[..., None], -1)[..., 0]
    return float((nll * real).sum() / real.sum())


def _problem(batch=2, time=4, vocab=9, d_e=5, d_d=5):
    logits = RNG.normal(size=(batch, time, vocab)) * 2.0
    tokens = RNG.integers(0, vocab, size=(batch, time))
    tokens[-1, 0] = -1  # a padded position: no weight
    return dict(logits=logits, tokens=tokens, embeddings=RNG.normal(size=(vocab, d_e)),
                kernel=RNG.normal(size=(d_e, d_d)), bias=RNG.normal(size=d_d) * 0.1,
                decoder=RNG.normal(size=(vocab, d_d)), decoder_bias=RNG.normal(size=vocab) * 0.1)


def _ours(q, logits=None, kernel=None):
    logits = q["logits"] if logits is None else logits
    kernel = q["kernel"] if kernel is None else kernel
    decoder = tf.constant(q["decoder"], tf.float32)
    decoder_bias = tf.constant(q["decoder_bias"], tf.float32)
    return past_decode_loss(tf.nn.log_softmax(logits), q["tokens"], q["embeddings"], kernel,
                            q["bias"], lambda h: tf.matmul(h, decoder, transpose_b=True)
                            + decoder_bias)


@pytest.mark.parametrize("d_d", [5, 3])  # tied sizes, and an untied decoder of another size
def test_loss_equals_the_papers_equations(d_d):
    q = _problem(d_d=d_d)
    expected = np_past_decode_loss(np_log_softmax(q["logits"]), q["tokens"], q["embeddings"],
                                   q["kernel"], q["bias"], q["decoder"], q["decoder_bias"])
    assert float(_ours(q)) == pytest.approx(expected, rel=1e-5)
    # the padded position is left out: changing its token changes nothing
    q2 = dict(q, tokens=q["tokens"].copy())
    q2["tokens"][-1, 0] = -7
    assert float(_ours(q2)) == pytest.approx(expected, rel=1e-5)
    q2["tokens"][-1, 0] = 3  # a real position there moves the loss
    assert abs(float(_ours(q2)) - expected) > 1e-4


def test_gradients_reach_the_prediction_and_the_stateless_layer():
    """d L_PDR / d (next-word logits) and d L_PDR / d W_PDR against finite differences of
    the NumPy transcription: the prediction itself is regularized (nothing is stopped)."""
    q = _problem(batch=1, time=3, vocab=6, d_e=4, d_d=4)
    logits = tf.Variable(q["logits"].astype("float32"))
    kernel = tf.Variable(q["kernel"].astype("float32"))
    with tf.GradientTape() as tape:
        loss = _ours(q, logits=logits, kernel=kernel)
    grad_logits, grad_kernel = tape.gradient(loss, [logits, kernel])

    def from_logits(z):
        return np_past_decode_loss(np_log_softmax(z), q["tokens"], q["embeddings"],
                                   q["kernel"], q["bias"], q["decoder"], q["decoder_bias"])

    def from_kernel(w):
        return np_past_decode_loss(np_log_softmax(q["logits"]), q["tokens"], q["embeddings"],
                                   w, q["bias"], q["decoder"], q["decoder_bias"])

    expected_logits = numeric_grad(from_logits, q["logits"])
    assert np.abs(expected_logits).max() > 1e-3
    np.testing.assert_allclose(grad_logits.numpy(), expected_logits, atol=2e-5)
    np.testing.assert_allclose(grad_kernel.numpy(), numeric_grad(from_kernel, q["kernel"]),
                               atol=2e-5)


def _tied(vocab=11, dim=4):
    emb = TiedEmbedding(vocab, dim)
    emb.build()
    emb.output_bias.assign(RNG.normal(size=vocab).astype("float32") * 0.1)
    return emb


@pytest.mark.parametrize("kind", ["softmax", "untied_softmax", "mos", "moc", "untied_mos"])
def test_layer_decodes_with_the_heads_own_decoder(kind):
    emb = _tied()
    tied = not kind.startswith("untied")
    make = {"softmax": SoftmaxLayer, "mos": lambda **kw: MoSLayer(2, **kw),
            "moc": lambda **kw: MoCLayer(2, **kw)}[kind.replace("untied_", "")]
    head = make(embedding=emb) if tied else make(vocab_size=11)
    g = RNG.normal(size=(2, 3, 4 if kind == "softmax" else 7)).astype("float32")
    log_probs = head(g)
    layer = PastDecode(0.3, embedding=emb, head=head)
    tokens = RNG.integers(0, 11, size=(2, 3))
    value = float(layer.loss(log_probs, tokens))
    if tied:
        decoder, decoder_bias = np.asarray(emb.embeddings), np.asarray(emb.output_bias)
    else:
        decoder, decoder_bias = np.asarray(head.kernel).T, np.asarray(head.bias)
    assert layer.kernel.shape == (4, decoder.shape[1])
    expected = np_past_decode_loss(log_probs, tokens, np.asarray(emb.embeddings),
                                   np.asarray(layer.kernel), np.asarray(layer.bias), decoder,
                                   decoder_bias)
    assert value == pytest.approx(expected, rel=1e-5)


def test_training_only_and_the_input_passes_through():
    emb = _tied()
    head = SoftmaxLayer(embedding=emb)
    layer = PastDecode(0.25, embedding=emb, head=head)
    log_probs = head(RNG.normal(size=(2, 3, 4)).astype("float32"))
    tokens = RNG.integers(0, 11, size=(2, 3))
    out = layer(log_probs, tokens, training=False)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(log_probs))
    assert layer.losses == []
    out = layer(log_probs, tokens, training=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(log_probs))
    assert len(layer.losses) == 1
    assert float(layer.losses[0]) == pytest.approx(
        0.25 * float(layer.loss(log_probs, tokens)), rel=1e-6)


def test_unsupported_heads_and_bad_coefficients_are_refused():
    emb = _tied()
    for head in (GSSHead(embedding=emb), DOCLayer([0, 2], embedding=emb)):
        with pytest.raises(ValueError, match="SoftmaxLayer, MoSLayer or MoCLayer"):
            PastDecode(0.1, embedding=emb, head=head)
    with pytest.raises(ValueError, match="num_samples=4"):
        PastDecode(0.1, embedding=emb, head=SoftmaxLayer(embedding=emb, num_samples=4))
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="coefficient"):
            PastDecode(bad, embedding=emb, head=SoftmaxLayer(embedding=emb))
    with pytest.raises(ValueError, match="embedding and head"):
        PastDecode(0.1)
    with pytest.raises(ValueError, match="past_decode"):
        AWDLSTM(20, embed_dim=4, hidden_dim=6, num_layers=1, past_decode=-0.5)
    with pytest.raises(ValueError, match="GSSHead is not supported"):
        AWDLSTM(20, embed_dim=4, hidden_dim=6, num_layers=1, past_decode=0.5, head="gss")


KW = dict(embed_dim=6, hidden_dim=8, num_layers=2, alpha=0, beta=0, seed=1, dropout=0,
          dropout_h=0, dropout_i=0, dropout_e=0, weight_dropout=0)


@pytest.mark.parametrize("head", ["softmax", {"type": "mos", "num_experts": 2}])
def test_model_adds_lambda_times_the_loss_in_training_and_evaluates_unchanged(head, tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 40, size=(3, 5)).astype("int32")
    y = rng.integers(0, 40, size=(3, 5)).astype("int32")
    pdr = AWDLSTM(40, head=head, past_decode=0.7, **KW)
    pdr.build()
    plain = AWDLSTM(40, head=head, **KW)
    plain.build()
    values = {w.path.split("/", 1)[1]: np.asarray(w) for w in pdr.weights}
    shared = [w for w in pdr.weights if "/past_decode/" not in w.path]
    assert len(shared) == len(plain.weights) == len(pdr.weights) - 2  # + W_PDR, b_PDR only
    for source, w in zip(shared, plain.weights):
        w.assign(np.asarray(source))
    assert "past_decode" not in plain.get_config() and pdr.get_config()["past_decode"] == 0.7
    assert not pdr.picks_targets_in_training  # the full distribution, on JAX too
    for m in (pdr, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.0))
    ev = [m.evaluate(x, y, batch_size=3, verbose=0, return_dict=True) for m in (pdr, plain)]
    assert ev[0] == pytest.approx(ev[1], rel=1e-6)
    tr = [m.train_on_batch(x, y, return_dict=True) for m in (pdr, plain)]
    assert tr[0]["nll"] == pytest.approx(tr[1]["nll"], rel=1e-6)
    log_probs = np.asarray(plain(x))  # no dropout: training's distribution
    layer = pdr.past_decode_layer
    expected = np_past_decode_loss(log_probs, x, values["backbone/embedding/embeddings"],
                                   np.asarray(layer.kernel), np.asarray(layer.bias),
                                   values["backbone/embedding/embeddings"],
                                   values["backbone/embedding/output_bias"])
    assert expected > 1.0
    assert tr[0]["loss"] - tr[1]["loss"] == pytest.approx(0.7 * expected, rel=1e-4)
    # .keras: the layer, its weights and its coefficient come back
    path = tmp_path / "pdr.keras"
    pdr.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.past_decode == 0.7 and isinstance(loaded.past_decode_layer, PastDecode)
    assert len(pdr.weights) == len(loaded.weights)
    for a, b in zip(pdr.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(loaded.past_decode_layer.loss(loaded(x), x)) == pytest.approx(expected,
                                                                               rel=1e-5)


def test_padded_windows_leave_padding_out_of_the_pdr_loss():
    from tflm.data import PAD_ID
    rng = np.random.default_rng(4)
    x = rng.integers(0, 30, size=(2, 6)).astype("int32")
    model = AWDLSTM(30, past_decode=1.0, **KW)
    model.build()
    layer = model.past_decode_layer
    padded = x.copy()
    padded[:, 4:] = PAD_ID
    full = float(layer.loss(model(x[:, :4]), x[:, :4]))
    assert float(layer.loss(model(padded), padded)) == pytest.approx(full, rel=1e-5)


BACKEND_SNIPPET = """
import json, os, tempfile, numpy as np, keras
from keras import ops
from tflm.layers.past_decode import past_decode_loss
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
q = json.loads('''__PROBLEM__''')
decoder, decoder_bias = np.asarray(q["decoder"], "float32"), np.asarray(q["decoder_bias"], "float32")
value = past_decode_loss(ops.log_softmax(np.asarray(q["logits"], "float32")),
                         np.asarray(q["tokens"]), np.asarray(q["embeddings"], "float32"),
                         np.asarray(q["kernel"], "float32"), np.asarray(q["bias"], "float32"),
                         lambda h: ops.matmul(h, ops.transpose(decoder)) + decoder_bias)
out = {"value": float(keras.ops.convert_to_numpy(value))}
rng = np.random.default_rng(0)
x = rng.integers(0, 40, size=(4, 61)).astype("int32")
xs = x[:, :-1].reshape(4, 6, 10).transpose(1, 0, 2)
ys = x[:, 1:].reshape(4, 6, 10).transpose(1, 0, 2)
m = AWDLSTM(40, embed_dim=6, hidden_dim=8, num_layers=2, seed=1, bptt=10, past_decode=0.5,
            head="softmax", alpha=0, beta=0, dropout=0, dropout_h=0,
            dropout_i=0, dropout_e=0, weight_dropout=0)
m.compile(optimizer=keras.optimizers.SGD(5.0))
h = m.fit(np.concatenate(xs), np.concatenate(ys), batch_size=4, epochs=2, verbose=0)
ev = m.evaluate(np.concatenate(xs), np.concatenate(ys), batch_size=4, verbose=0,
                return_dict=True)
m.compile(optimizer=keras.optimizers.SGD(0.0))  # one step that moves nothing
m.reset_states()
step = m.train_on_batch(xs[0], ys[0], return_dict=True)
pdr = m.past_decode_layer.loss(m(xs[0]), xs[0])
out.update(step_gap=float(step["loss"]) - float(step["nll"]),
           pdr=float(keras.ops.convert_to_numpy(pdr)))
path = os.path.join(tempfile.mkdtemp(), "m.keras"); m.save(path)
loaded = keras.saving.load_model(path)
same = np.array_equal(keras.ops.convert_to_numpy(m(xs[0])),
                      keras.ops.convert_to_numpy(loaded(xs[0])))
out.update(loss=h.history["loss"], nll=h.history["nll"], eval_loss=ev["loss"],
           eval_nll=ev["nll"], reload_equal=bool(same),
           reloaded_pdr=float(loaded.past_decode) if loaded.past_decode_layer else None)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_pdr_value_fit_and_reload_on_other_backends(backend):
    """The softmax head: on JAX the train step would otherwise ask it for the targets'
    log-probabilities alone (`picks_targets_in_training`); PDR needs the distribution."""
    q = _problem()
    expected = np_past_decode_loss(np_log_softmax(q["logits"]), q["tokens"], q["embeddings"],
                                   q["kernel"], q["bias"], q["decoder"], q["decoder_bias"])
    problem = json.dumps({k: np.asarray(v).tolist() for k, v in q.items()})
    stdout = run_in_backend(backend, BACKEND_SNIPPET.replace("__PROBLEM__", problem))
    result = json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    assert result["value"] == pytest.approx(expected, rel=1e-5)
    losses = result["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    # the training loss is the NLL + lambda L_PDR (no AR / TAR, no dropout here), evaluation
    # the NLL alone
    assert result["pdr"] > 0.5
    assert result["step_gap"] == pytest.approx(0.5 * result["pdr"], rel=1e-4)
    assert all(loss > nll for loss, nll in zip(losses, result["nll"]))
    assert result["eval_loss"] == pytest.approx(result["eval_nll"], rel=1e-6)
    assert result["reload_equal"] and result["reloaded_pdr"] == 0.5
