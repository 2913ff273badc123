"""`tflm.backends.torch_mixture_target_log_probs`: a mixture of softmaxes' log-probabilities of
the targets alone, chunk by chunk under PyTorch's checkpointing, and their gradients for any
cotangent, against NumPy; what autograd keeps of it for the backward pass; and
`TorchBackend.mixture_target_log_probs`, which runs it past its size threshold only."""

import json

import pytest

from tests.backends import run_in_backend
from tests.tflm.backends.test_jax_mixture_target_log_probs import REFERENCE

CHECK = REFERENCE + r"""
import json
import keras
import torch
from tflm import backends
from tflm.backends import torch_mixture_target_log_probs as picks

picks.ROWS = 4  # 21 rows: five whole chunks and one of a single row
rng = np.random.default_rng(3)
K, V, d = 3, 23, 5
result = {}
for name, (B, T, with_bias) in {"bias": (3, 7, True), "no bias": (2, 5, False)}.items():
    h, log_prior, W, b, y = mixture_inputs(rng, B, T, K, V, d, with_bias)
    g = rng.normal(size=(B, T))
    leaves = [None if a is None else torch.tensor(a, dtype=torch.float32, requires_grad=True)
              for a in (h, log_prior, W, b)]
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: sizes.append(t.numel()) or t, lambda t: t):
        picked = picks.mixture_target_log_probs(*leaves, torch.tensor(y))
    grads = torch.autograd.grad(picked, [t for t in leaves if t is not None],
                                torch.tensor(g, dtype=torch.float32))
    expected = reference(h, log_prior, W, b, y, g)
    ours = [picked] + list(grads)
    theirs = [e for e in expected if e is not None]
    result[name] = {
        "errors": [float(np.abs(o.detach().numpy() - t).max()) for o, t in zip(ours, theirs)],
        "largest saved": max(sizes), "chunk logits": picks.ROWS * K * V,
        "window logits": B * T * K * V}
    with torch.no_grad():
        again = picks.mixture_target_log_probs(*leaves, torch.tensor(y))
    result[name]["no_grad equal"] = bool(torch.equal(again, picked.detach()))

# the backend's pick: the whole window up to the threshold, chunks past it, the same values
def backend_pick():
    args = [torch.tensor(a, dtype=torch.float32, requires_grad=True)
            for a in (h, log_prior, W)] + [None, torch.tensor(y)]
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: sizes.append(t.numel()) or t, lambda t: t):
        picked = backends.current().mixture_target_log_probs(*args)
    return picked.detach(), max(sizes)

whole, whole_saved = backend_pick()
picks.WHOLE_WINDOW_ELEMENTS = 0
chunked, chunked_saved = backend_pick()
result["backend"] = {"difference": float((whole - chunked).abs().max()),
                     "saved": [whole_saved, chunked_saved], "window logits": B * T * K * V,
                     "chunk logits": picks.ROWS * K * V}
print(json.dumps(result))
"""


def test_chunked_mixture_pick_and_its_gradients_against_numpy():
    result = json.loads(run_in_backend("torch", CHECK).strip().splitlines()[-1])
    for name in ("bias", "no bias"):
        case = result[name]
        assert len(case["errors"]) == (5 if name == "bias" else 4)
        assert max(case["errors"]) < 2e-5, (name, case["errors"])
        # autograd keeps the chunks' inputs, not their logits
        assert case["largest saved"] < case["chunk logits"] < case["window logits"], case
        assert case["no_grad equal"]
    backend = result["backend"]
    assert backend["difference"] < 1e-5
    whole_saved, chunked_saved = backend["saved"]
    assert chunked_saved < backend["chunk logits"] < backend["window logits"] <= whole_saved


@pytest.mark.parametrize("size, chunked", [((12, 70, 15, 10_000), False),
                                           ((12, 70, 15, 33_278), True)])
def test_the_backend_chunks_past_one_gib_of_logits(size, chunked):
    """The MoS PTB preset's head (a 481 MiB tensor) is picked whole; the same head over
    WikiText-2's vocabulary (1.6 GiB) in chunks."""
    torch = pytest.importorskip("torch")
    from tflm.backends import torch_mixture_target_log_probs as picks
    b, t, k, v = size
    h, weight = torch.empty((b, t, k, 8), device="meta"), torch.empty((v, 8), device="meta")
    assert picks.runs_in_chunks(h, weight) is chunked
