"""Output heads under the JAX and PyTorch backends, plus helpers shared by the head tests.

One subprocess per backend builds every head, runs it forward (inference and training mode),
and saves weights and outputs; this process (TensorFlow) loads the same weights into the same
layers and must reproduce the outputs.
"""

import numpy as np
import pytest

import keras
import tflm
from tests.backends import run_in_backend

# ----------------------------------------------------------------------------------------
# Helpers used by tests/tflm/layers/test_activations_gss.py, test_plif.py, test_mos.py, test_mixtape.py,
# test_doc.py (names do not start with "test" so pytest does not collect them twice).
# ----------------------------------------------------------------------------------------


def np_log_softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def np_logsumexp(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(x - m).sum(axis=axis))


def np_softmax(x, axis=-1):
    return np.exp(np_log_softmax(x, axis))


def np_softplus(x):
    return np.logaddexp(0.0, np.asarray(x, np.float64))


def assert_log_probs(out, shape=None, atol=2e-5):
    """float32, finite, rows logsumexp to 0."""
    out = np.asarray(out)
    assert out.dtype == np.float32, out.dtype
    if shape is not None:
        assert out.shape == tuple(shape), out.shape
    assert np.all(np.isfinite(out))
    lse = np_logsumexp(out.astype(np.float64), -1)
    np.testing.assert_allclose(lse, 0.0, atol=atol)


def assert_close_log_probs(actual, expected, rtol=1e-5, atol=None):
    """|actual - expected| <= atol + rtol * |expected| elementwise (float32 vs float64 ref).

    atol defaults to rtol: errors are relative to max(1, |value|)-ish magnitudes."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = (rtol if atol is None else atol) + rtol * np.abs(expected)
    err = np.abs(actual - expected)
    assert np.all(err <= tol), f"max abs err {err.max():.3g}, worst ratio {(err / tol).max():.3g}"


def roundtrip_exact(model, inputs, tmp_path):
    """Save `model` as .keras, load it, and require bit-identical outputs."""
    before = np.asarray(model(inputs, training=False))
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    after = np.asarray(loaded(inputs, training=False))
    np.testing.assert_array_equal(before, after)
    return loaded


def check_mixed_precision(make_layer, inputs):
    """Under mixed_bfloat16: variables float32, output float32 log-probabilities."""
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        layer = make_layer()
        out = layer(inputs)
        assert layer.compute_dtype == "bfloat16"
        assert layer.weights, "layer has no weights to check"
        for v in layer.weights:
            assert v.dtype == "float32", (v.path, v.dtype)
        assert_log_probs(out, atol=1e-4)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    return out


def check_training_step(model, x, y, lr=0.5):
    """One model.fit step with tflm.losses.NLL and SGD: finite loss, every trainable weight moves."""
    model.compile(loss=tflm.losses.NLL(), optimizer=keras.optimizers.SGD(lr))
    before = [np.array(v) for v in model.trainable_variables]
    assert before, "model has no trainable variables"
    hist = model.fit(x, y, batch_size=len(y), epochs=1, verbose=0, shuffle=False)
    loss = hist.history["loss"][0]
    assert np.isfinite(loss), loss
    unchanged = [v.path for v, b in zip(model.trainable_variables, before)
                 if np.array_equal(np.array(v), b)]
    assert not unchanged, f"weights did not change: {unchanged}"
    return loss


def gradients_finite(fn, variables):
    """Gradients of sum(fn()) w.r.t. `variables` under TensorFlow: all finite and not all zero."""
    import tensorflow as tf
    variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
    with tf.GradientTape() as tape:
        tape.watch(variables)
        loss = tf.reduce_sum(fn())
    grads = tape.gradient(loss, variables)
    for g in grads:
        assert g is not None
        g = tf.convert_to_tensor(g).numpy()
        assert np.all(np.isfinite(g))
    assert any(np.any(tf.convert_to_tensor(g).numpy() != 0) for g in grads)
    return grads


# ----------------------------------------------------------------------------------------
# Cross-backend forward test
# ----------------------------------------------------------------------------------------

HEADS_SRC = '''
import numpy as np
from tflm.layers import (DOCLayer, GSSActivation, GSSHead, MixtapeLayer, MoCLayer, MoSLayer,
                         PLIFHead, PLIFLayer, SigSoftmax, SoftmaxLayer, TiedEmbedding)

def make_heads():
    V, D, G = 40, 8, 12
    rng = np.random.default_rng(0)
    g = rng.normal(size=(2, 3, G)).astype("float32")
    h = rng.normal(size=(2, 3, D)).astype("float32")
    l = (3.0 * rng.normal(size=(2, 3, V))).astype("float32")
    g2 = rng.normal(size=(2, 3, 10)).astype("float32")
    rank = rng.permutation(V)
    emb = lambda: TiedEmbedding(V, D)
    return {
        "softmax": (SoftmaxLayer(embedding=emb()), h),
        "gss": (GSSActivation(-1.5, 2.5, trainable_params=True), l),
        "sigsoftmax": (SigSoftmax(), l),
        "gss_head": (GSSHead(vocab_size=V, c=-1.5, k=3.0), h),
        "plif": (PLIFLayer(num_intervals=64, bound=5.0, init_scale=0.5, seed=1), l),
        "plif_head": (PLIFHead(embedding=emb(), num_intervals=64, bound=5.0, init_scale=0.5), h),
        "mos": (MoSLayer(3, embedding=emb(), latent_dropout=0.3, seed=2), g),
        "mos_sequential": (MoSLayer(3, embedding=emb(), latent_dropout=0.3, seed=2,
                                    mixture="sequential"), g),
        "moc": (MoCLayer(3, embedding=emb(), latent_dropout=0.3, seed=3), g),
        "mixtape": (MixtapeLayer(4, gate_dim=5, shared_gate_rank=15, embedding=emb(),
                                 token_frequency_rank=rank, latent_dropout=0.2, seed=4), g),
        "doc": (DOCLayer((2, 3), embedding=emb(), latent_dropout=0.2, seed=5), [g2, g]),
    }
'''

SNIPPET = HEADS_SRC + '''
import sys
import keras
out = {}
for name, (layer, x) in make_heads().items():
    y = keras.ops.convert_to_numpy(layer(x))
    assert y.dtype == np.float32 and y.shape[:2] == (2, 3), (name, y.dtype, y.shape)
    assert np.all(np.isfinite(y)), name
    assert np.allclose(np.log(np.exp(y.astype(np.float64)).sum(-1)), 0.0, atol=2e-5), name
    # training mode (locked dropout through keras.random) for the heads that have dropout
    yt = keras.ops.convert_to_numpy(layer(x, training=True)) if name in (
        "mos", "mos_sequential", "moc", "mixtape", "doc") else y
    assert np.all(np.isfinite(yt)), name
    assert np.allclose(np.log(np.exp(yt.astype(np.float64)).sum(-1)), 0.0, atol=2e-5), name
    out[name + "/out"] = y
    for i, w in enumerate(layer.get_weights()):
        out[f"{name}/w{i}"] = w
np.savez(sys.argv[1] if len(sys.argv) > 1 else "heads.npz", **out)
print("BACKEND", keras.backend.backend(), "HEADS", len(make_heads()))
'''


BACKENDS = ("jax", "torch")


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    """Run the snippet under every backend at once (two processes in parallel)."""
    from concurrent.futures import ThreadPoolExecutor
    folder = tmp_path_factory.mktemp("heads_backends")

    def run(backend):
        target = folder / f"{backend}.npz"
        code = f"import sys; sys.argv = ['x', {str(target)!r}]\n" + SNIPPET
        return run_in_backend(backend, code), target

    with ThreadPoolExecutor(len(BACKENDS)) as pool:
        futures = {b: pool.submit(run, b) for b in BACKENDS}
    return futures


@pytest.mark.parametrize("backend", BACKENDS)
def test_heads_forward_match_tensorflow(backend, backend_runs):
    stdout, target = backend_runs[backend].result()    # re-raises a skip or failure
    assert f"BACKEND {backend} HEADS 11" in stdout
    saved = np.load(target)
    scope = {}
    exec(HEADS_SRC, scope)
    heads = scope["make_heads"]()
    assert len(heads) == 11
    for name, (layer, x) in heads.items():
        layer(x)                                   # build
        n = len(layer.get_weights())
        assert n > 0 or name == "sigsoftmax"
        layer.set_weights([saved[f"{name}/w{i}"] for i in range(n)])
        np.testing.assert_allclose(np.asarray(layer(x)), saved[f"{name}/out"],
                                   rtol=1e-5, atol=2e-5, err_msg=f"{name} under {backend}")
