"""`tflm.backends.jax_mixture_target_log_probs`: a mixture of softmaxes' log-probabilities of
the targets alone, chunk by chunk up to a window's extent, and their written backward pass,
against NumPy; every backend's `Backend.mixture_target_log_probs`; and `MoSLayer`'s
training objective through it. (The JAX train step of an MoS model against TensorFlow's
full mixture: tests/tflm/backends/test_jax_backend.py.)"""

import json

import numpy as np
import pytest

from tests.backends import run_in_backend
from tests.tflm.backends.test_jax_target_log_probs import CHUNKED_CASES

REFERENCE = r"""
import numpy as np

def logsumexp(x, axis):
    top = x.max(axis, keepdims=True)
    return (top + np.log(np.exp(x - top).sum(axis, keepdims=True))).squeeze(axis)

def mixture_inputs(rng, B, T, K, V, d, with_bias):
    '''h (B, T, K, d), log pi (B, T, K), W (V, d), b (V,) or None and targets y (B, T),
    float64 / int, drawn from `rng` in that order.'''
    h = rng.normal(size=(B, T, K, d))
    prior = rng.normal(size=(B, T, K))
    W = rng.normal(size=(V, d))
    b = rng.normal(size=V) if with_bias else None
    return h, prior - logsumexp(prior, -1)[..., None], W, b, rng.integers(0, V, (B, T))

def reference(h, log_prior, W, b, y, g):
    '''log P(y) = logsumexp_k(log pi_k + log_softmax(h_k W^T + b)_y) and its gradients for
    the cotangent g: d h, d log pi, d W, d b.'''
    logits = h @ W.T + (0 if b is None else b)                     # (B, T, K, V)
    log_p = logits - logsumexp(logits, -1)[..., None]
    picked = np.take_along_axis(log_p, np.broadcast_to(y[..., None, None],
                                                       log_p.shape[:-1] + (1,)), -1)[..., 0]
    a = log_prior + picked
    value = logsumexp(a, -1)
    rho = np.exp(a - value[..., None])
    d_logits = (g[..., None] * rho)[..., None] * (np.eye(W.shape[0])[y][:, :, None] -
                                                  np.exp(log_p))
    d_b = None if b is None else d_logits.sum((0, 1, 2))
    return (value, d_logits @ W, g[..., None] * rho, np.einsum("btkv,btkd->vd", d_logits, h),
            d_b)
"""

CHECK = CHUNKED_CASES + REFERENCE + r"""
import json
import jax
from tflm.backends import jax_mixture_target_log_probs as picks

rng = np.random.default_rng(5)
K, V, d = 3, 23, 5
result = {}
for name, (B, T, lengths, with_bias) in WINDOWS.items():
    h, log_prior, W, b, y = mixture_inputs(rng, B, T, K, V, d, with_bias)
    mask = padding_mask(B, T, lengths)
    real = np.ones((B, T), bool) if mask is None else mask
    args = [jnp.asarray(a, jnp.float32) for a in (h, log_prior, W)] + [
        None if b is None else jnp.asarray(b, jnp.float32)]

    def run(h, log_prior, W, b, g):
        picked, vjp = jax.vjp(lambda h, log_prior, W, b: picks.mixture_target_log_probs(
            h, log_prior, W, b, jnp.asarray(y), None if mask is None else jnp.asarray(mask)),
            h, log_prior, W, b)
        return picked, vjp(g)

    errors = errors_over_cotangents(rng, mask, real, lambda g: jax.jit(run)(*args, g),
                                    lambda g: reference(h, log_prior, W, b, y, g))
    result.update({f"{name}, {kind}": error for kind, error in errors.items()})
print(json.dumps(result))
"""


def test_mixture_target_log_probs_and_gradients_against_numpy():
    result = json.loads(run_in_backend("jax", CHECK).strip().splitlines()[-1])
    assert len(result) == 15
    for name, error in result.items():
        assert error < 2e-5, (name, error)


BACKEND = REFERENCE + r"""
import json
from keras import ops
from tflm import backends

rng = np.random.default_rng(2)
B, T, K, V, d = 2, 4, 3, 11, 5
h, prior, W, b = (rng.normal(size=s) for s in ((B, T, K, d), (B, T, K), (V, d), (V,)))
log_prior = prior - logsumexp(prior, -1)[..., None]
y = rng.integers(0, V, (B, T))
tensor = lambda a: ops.convert_to_tensor(np.asarray(a, "float32"))
got = backends.current().mixture_target_log_probs(
    tensor(h), tensor(log_prior), tensor(W), tensor(b), ops.convert_to_tensor(y.astype("int32")))
want = reference(h, log_prior, W, b, y, np.ones((B, T)))[0]
print(json.dumps(float(np.abs(ops.convert_to_numpy(got) - want).max())))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_every_backend_gives_the_mixture_at_the_targets(backend):
    """The default (TensorFlow, PyTorch: each component's log-softmax at the target, then
    their log-sum-exp with the prior) and JAX's chunked one, against NumPy."""
    error = json.loads(run_in_backend(backend, BACKEND).strip().splitlines()[-1])
    assert error < 1e-5


LAYER = r"""
import json
import numpy as np
import pytest
from keras import ops
from tflm.layers import MoCLayer, MoSLayer, TiedEmbedding

rng = np.random.default_rng(0)
g = rng.normal(size=(2, 5, 6)).astype("float32")
y = rng.integers(0, 9, (2, 5)).astype("int32")
errors = []
for head in (MoSLayer(3, embedding=TiedEmbedding(9, 4)), MoSLayer(3, vocab_size=9),
             MoSLayer(3, vocab_size=9, latent_dim=5, prior_bias=True),
             MoCLayer(3, embedding=TiedEmbedding(9, 4)), MoCLayer(3, vocab_size=9)):
    assert head.picks_targets
    full = ops.convert_to_numpy(head(g, training=True))  # no latent dropout: no draws
    picked = ops.convert_to_numpy(head.target_log_probs(g, y))
    errors.append(float(np.abs(picked - np.take_along_axis(full, y[..., None], -1)[..., 0]).max()))
refused = []
for head in (MoSLayer(3, vocab_size=9, mixture="sequential"),
             MoSLayer(3, vocab_size=9, adversarial_alpha=0.005),
             MoSLayer(3, vocab_size=9, output_rank=2), MoCLayer(3, vocab_size=9, output_rank=2)):
    refused.append(not head.picks_targets)
    with pytest.raises(ValueError, match="plain projection"):
        head.target_log_probs(g, y)
print(json.dumps({"errors": errors, "refused": refused}))
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_mixture_layers_target_log_probs_equal_their_log_probs_picked(backend):
    """`MoSLayer.target_log_probs`, tied, untied and with a prior bias, and `MoCLayer`'s
    (the softmax's over the mixed contexts), against the layers' own log-probabilities at
    the targets; heads they do not compute refuse."""
    out = json.loads(run_in_backend(backend, LAYER).strip().splitlines()[-1])
    assert max(out["errors"]) < 1e-5
    assert out["refused"] == [True, True, True, True]


SHAPES = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jax.extend import core
from tflm.backends import extent_loop
from tflm.backends.jax_mixture_target_log_probs import mixture_target_log_probs
from tflm.layers.mos import mixture_log_probs

extent_loop.ROWS = 8
B, T, K, L, V = 2, 9, 3, 4, 13
rng = np.random.default_rng(0)
h, prior, W, b = (jnp.asarray(rng.normal(size=s), jnp.float32)
                  for s in ((B, T, K, L), (B, T, K), (V, L), (V,)))
y = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)

def shapes(jaxpr, found):
    for eqn in jaxpr.eqns:
        found.update(tuple(v.aval.shape) for v in eqn.outvars)
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (list, tuple)) else [param]):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, core.Jaxpr):
                    shapes(inner, found)
    return found

def loss_targets(h, prior, W, b):
    return -jnp.mean(mixture_target_log_probs(h, jax.nn.log_softmax(prior), W, b, y))

def loss_batched(h, prior, W, b):
    full = mixture_log_probs(h @ W.T + b, jax.nn.log_softmax(prior))
    return -jnp.mean(jnp.take_along_axis(full, y[..., None], -1)[..., 0])

out = {}
for name, loss in (("targets", loss_targets), ("batched", loss_batched)):
    program = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(h, prior, W, b)
    found = shapes(program.jaxpr, set())
    out[name] = [(B, T, K, V) in found, max(int(np.prod(s)) for s in found if s)]
print(json.dumps(out))
"""


def test_the_training_loss_forms_no_tensor_of_every_component_over_the_vocabulary():
    """The README's claim: the JAX train step's MoS objective and its gradient hold no
    `(batch, time, K, V)` value anywhere in the program (the chunks' are `(batch, chunk,
    K, V)`), where the batched mixture holds one."""
    out = json.loads(run_in_backend("jax", SHAPES).strip().splitlines()[-1])
    assert out["batched"][0] is True
    assert out["targets"][0] is False
    assert out["targets"][1] < out["batched"][1]
