"""`tflm.backends.torch_linear`: the tied output layer's GEMMs on oneDNN (PyTorch, x86 CPU),
values and gradients against NumPy, and when the route is taken."""

import platform

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tflm.backends import torch_linear  # noqa: E402

X86 = platform.machine().lower() in ("x86_64", "amd64")
needs_onednn = pytest.mark.skipif(not (X86 and torch.backends.mkldnn.is_available()),
                                  reason="oneDNN is used on x86 CPUs only")


def _value_and_grads(x, w, b, g):
    leaves = [torch.tensor(a, requires_grad=True) if a is not None else None for a in (x, w, b)]
    y = torch_linear.linear(*leaves)
    y.backward(torch.tensor(g))
    return [y.detach().numpy()] + [t.grad.numpy() for t in leaves if t is not None]


@needs_onednn
@pytest.mark.parametrize("shape", [(6, 4), (3, 5, 4), (2, 3, 5, 4)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_onednn_linear_values_and_gradients_equal_numpy(shape, with_bias):
    rng = np.random.default_rng(len(shape) + with_bias)
    x = rng.normal(size=shape).astype("float32")
    w = rng.normal(size=(7, 4)).astype("float32")
    b = rng.normal(size=(7,)).astype("float32") if with_bias else None
    g = rng.normal(size=shape[:-1] + (7,)).astype("float32")
    assert torch_linear.uses_onednn(torch.tensor(x), torch.tensor(w),
                                    None if b is None else torch.tensor(b))
    got = _value_and_grads(x, w, b, g)
    rows, grads = x.reshape(-1, 4), g.reshape(-1, 7)
    want = [x @ w.T + (0 if b is None else b), g @ w, grads.T @ rows]
    if with_bias:
        want.append(grads.sum(0))
    assert len(got) == len(want)
    for a, e in zip(got, want):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_linear_takes_non_contiguous_inputs_and_runs_without_autograd():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(4, 9, 3)).astype("float32")).transpose(1, 2)  # (4, 3, 9)
    w = torch.tensor(rng.normal(size=(9, 5)).astype("float32")).T  # (5, 9), a view
    assert not x.is_contiguous() and not w.is_contiguous()
    with torch.no_grad():
        y = torch_linear.linear(x, w)
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w.numpy().T, rtol=1e-5, atol=1e-5)


def test_other_dtypes_autocast_and_empty_inputs_take_pytorch_linear():
    x, w = torch.ones(2, 3, dtype=torch.float64), torch.ones(4, 3, dtype=torch.float64)
    assert not torch_linear.uses_onednn(x, w)
    x32, w32 = torch.ones(2, 3), torch.ones(4, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not torch_linear.uses_onednn(x32, w32)
        assert torch_linear.linear(x32, w32).dtype == torch.bfloat16  # as F.linear's
    assert not torch_linear.uses_onednn(torch.ones(0, 3), w32)
    assert torch_linear.linear(torch.ones(0, 3), w32).shape == (0, 4)
    np.testing.assert_array_equal(torch_linear.linear(x, w).numpy(), np.full((2, 4), 3.0))


@needs_onednn
def test_a_frozen_weight_gets_no_gradient_and_the_input_its_own():
    x = torch.ones(2, 3, requires_grad=True)
    weight = torch.full((4, 3), 2.0)
    assert torch_linear.uses_onednn(x, weight)
    torch_linear.linear(x, weight).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 8.0))
    assert weight.grad is None


def test_under_torch_compile_it_is_pytorch_linear_in_one_graph():
    """`torch.compile` traces tensors without storage, which oneDNN's opaque layout needs
    ("Cannot access storage of OpaqueTensorImpl" in a compiled Keras train step on a CPU):
    there the route is PyTorch's linear, traced whole (`fullgraph`), the same numbers."""
    rng = np.random.default_rng(9)
    x, w, b = (rng.normal(size=s).astype("float32") for s in ((2, 3, 4), (5, 4), (5,)))
    seen = []

    def loss(x, w, b):
        seen.append(torch_linear.uses_onednn(x, w, b))
        return torch_linear.linear(x, w, b).square().sum()

    leaves = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)(*leaves)
    compiled.backward()
    plain = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    want = torch.nn.functional.linear(*plain).square().sum()
    want.backward()
    assert seen == [False]  # the traced call; the compiled graph runs no Python
    np.testing.assert_allclose(compiled.item(), want.item(), rtol=1e-5)
    for got, expected in zip(leaves, plain):
        np.testing.assert_allclose(got.grad.numpy(), expected.grad.numpy(), rtol=1e-5,
                                   atol=1e-5)
