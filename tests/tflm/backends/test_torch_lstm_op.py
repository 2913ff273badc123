"""`tflm::lstm` (`tflm.backends.torch_lstm_op`): PyTorch's fused LSTM as one operator in a
`torch.compile` graph, with `torch.lstm`'s values and gradients (PyTorch's `opcheck`
included), where PyTorch's own decomposition would unroll the time loop."""

import json

import pytest

from tests.backends import run_in_backend

pytest.importorskip("torch")

_SETUP = """
import json
import numpy as np, torch
from tflm.backends import torch_lstm, torch_lstm_op

B, T, I, N = 3, 5, 4, 6
zero = torch.zeros(4 * N)

def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, T, I), (B, N), (B, N), (4 * N, I), (4 * N, N), (4 * N,)]
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]

def objective(outputs, uses):
    o, h, c = outputs
    w = torch.arange(o.numel(), dtype=torch.float32).reshape(o.shape).sin()
    terms = {"outputs": (o * w).sum(), "h": (h * 2).sum(), "c": (c ** 2).sum()}
    return sum(terms[u] for u in uses)

def gradients(run, seed, uses):
    leaves = inputs(seed)
    value = objective(run(*leaves, zero), uses)
    return [float(value)] + [g.detach().numpy() for g in torch.autograd.grad(value, leaves)]

def reference(*t):
    return torch_lstm_op.run(*t, train=True)

def largest_difference(a, b):
    return max([abs(a[0] - b[0])] + [float(np.abs(x - y).max()) for x, y in zip(a[1:], b[1:])])
"""


def test_values_and_gradients_equal_torch_lstm_eagerly_and_compiled():
    out = run_in_backend("torch", _SETUP + """
compiled = torch.compile(lambda *t: torch_lstm_op.lstm(*t), fullgraph=True,
                         backend="aot_eager")
rows = {}
for seed, uses in [(0, ["outputs", "h", "c"]), (1, ["h"]), (2, ["outputs"])]:
    expected = gradients(reference, seed, uses)
    rows[str(uses)] = [largest_difference(expected, gradients(torch_lstm_op.lstm, seed, uses)),
                       largest_difference(expected, gradients(compiled, seed, uses))]
torch.library.opcheck(torch_lstm_op.lstm, tuple(inputs(3)) + (zero,))
print("RESULT" + json.dumps(rows))
""")
    rows = json.loads(out.split("RESULT", 1)[1])
    assert len(rows) == 3
    for eager, compiled in rows.values():
        assert eager < 1e-5 and compiled < 1e-5


def test_a_compiled_fused_lstm_holds_the_operator_not_an_unrolled_loop():
    out = run_in_backend("torch", _SETUP + """
targets = []

def capture(gm, example_inputs):
    targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return gm

def window(x, h0, c0, kernel, recurrent_kernel, bias):
    return torch_lstm.fused_lstm(x, h0, c0, kernel, recurrent_kernel, bias)[1]

x, h0, c0, w_ih, w_hh, b = inputs(4)
kernel, recurrent = w_ih.detach().T.contiguous(), w_hh.detach().T.contiguous()
compiled = torch.compile(window, fullgraph=True, backend=capture)
got = compiled(x, h0, c0, kernel.requires_grad_(), recurrent.requires_grad_(), b)
want = window(x, h0, c0, kernel, recurrent, b)
print("RESULT" + json.dumps({"targets": targets,
                             "difference": float((got - want).abs().max())}))
""")
    result = json.loads(out.split("RESULT", 1)[1])
    assert sum("tflm.lstm" in t for t in result["targets"]) == 1
    assert not any("lstm" in t and "tflm" not in t for t in result["targets"])
    assert not any(t.endswith(("mm", "addmm", "sigmoid")) for t in result["targets"])
    assert result["difference"] < 1e-6


def test_inputs_of_any_layout_give_the_layouts_the_graph_is_told():
    out = run_in_backend("torch", _SETUP + """
g = torch.Generator().manual_seed(5)
x = torch.randn(T, B, I, generator=g).transpose(0, 1).requires_grad_()  # strides (I, B I, 1)
rest = inputs(6)[1:]
torch.library.opcheck(torch_lstm_op.lstm, (x, *rest, zero))
# Inductor checks each operator's outputs against the layouts its fake gave
compiled = torch.compile(lambda *t: objective(torch_lstm_op.lstm(*t), ["outputs", "h"]),
                         fullgraph=True, backend="inductor")
grads = torch.autograd.grad(compiled(x, *rest, zero), [x, *rest])
want = torch.autograd.grad(objective(reference(x, *rest, zero), ["outputs", "h"]), [x, *rest])
print("RESULT" + json.dumps({
    "contiguous": x.is_contiguous(),
    "difference": max(float((a - b).abs().max()) for a, b in zip(grads, want))}))
""")
    result = json.loads(out.split("RESULT", 1)[1])
    assert result["contiguous"] is False and result["difference"] < 1e-5
