"""The MoS mixture's recomputing gradient (tflm.layers.mos_recompute, `mixture="sequential"`):
value and gradient equal the batched mixture's autodiff on TensorFlow, JAX and PyTorch, for
tied, untied and factorized decoders, and with a frozen embedding."""

import pytest

from tests.backends import run_in_backend

SNIPPET = '''
import numpy as np
import keras
import tflm.layers.mos as mos
from tflm.layers import MoSLayer, TiedEmbedding

calls = []
recomputed = mos.recomputed_mixture_log_probs
mos.recomputed_mixture_log_probs = lambda *a: calls.append(1) or recomputed(*a)

V, D, G = 60, 8, 12
backend = keras.backend.backend()
g = np.random.default_rng(0).normal(size=(3, 4, G)).astype("float32")
w = np.random.default_rng(1).normal(size=(3, 4, V)).astype("float32")


def make(mixture, decoder):
    if decoder == "tied" or decoder == "frozen":
        layer = MoSLayer(4, embedding=TiedEmbedding(V, D), mixture=mixture)
    elif decoder == "untied":
        layer = MoSLayer(4, vocab_size=V, latent_dim=6, mixture=mixture)
    else:
        layer = MoSLayer(4, vocab_size=V, latent_dim=6, output_rank=3, mixture=mixture)
    layer(g)
    rng = np.random.default_rng(2)
    for v in layer.weights:
        v.assign(rng.normal(scale=0.5, size=v.shape).astype("float32"))
    if decoder == "frozen":
        layer.embedding.trainable = False
    return layer


def value_and_grads(layer):
    """log-probs, d sum(out * w) / d (trainable weights, input)."""
    if backend == "tensorflow":
        import tensorflow as tf
        x = tf.constant(g)
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x)
            loss = tf.reduce_sum(out * w)
        grads = tape.gradient(loss, layer.trainable_weights + [x])
        return np.asarray(out), [np.asarray(a) for a in grads]
    if backend == "jax":
        import jax
        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]

        def loss(trainable, x):
            out, _ = layer.stateless_call(trainable, frozen, x)
            return (out * w).sum(), out

        (_, out), (gw, gx) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            trainable, g)
        return np.asarray(out), [np.asarray(a) for a in list(gw) + [gx]]
    import torch
    x = torch.tensor(g, requires_grad=True)
    out = layer(x)
    (out * torch.tensor(w)).sum().backward()
    grads = [v.value.grad for v in layer.trainable_variables] + [x.grad]
    return out.detach().numpy(), [a.numpy() for a in grads]


for decoder in ("tied", "untied", "factorized", "frozen"):
    (ref, ref_grads), (out, grads) = (value_and_grads(make(m, decoder))
                                      for m in ("batched", "sequential"))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(ref_grads), decoder
    for a, b in zip(grads, ref_grads):
        assert np.abs(b).max() > 0, decoder
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=decoder)
    assert calls, "the sequential mixture did not take the recomputing path"
    calls.clear()
    print(decoder, "ok")
mos.recomputed_mixture_log_probs = recomputed
'''


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_recomputed_mixture_equals_batched_autodiff(backend, capsys):
    if backend == "tensorflow":  # this process's backend: no subprocess to start
        exec(compile(SNIPPET, "mos_recompute_snippet", "exec"), {})
        out = capsys.readouterr().out
    else:
        out = run_in_backend(backend, SNIPPET)
    assert out.split() == ["tied", "ok", "untied", "ok", "factorized", "ok", "frozen", "ok"]
