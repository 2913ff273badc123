"""Keras on PyTorch with `jit_compile=True` (`tflm.backends.torch_compiled_step`): the train
step's forward pass and loss are one `torch.compile`d graph, which trains the weights the
eager step trains (dropouts off: the masks are drawn from another generator under
compilation), draws masks at their rates and gives the eager loss's distribution under
dropout, checks or masks padded windows, and compiles once more for new window lengths.

The tests compile with dynamo's "eager" and "aot_eager" backends (the same graph capture,
and with "aot_eager" the compiled backward, without Inductor's code generation, which takes
a minute on this CPU); the slow test runs Inductor."""

import pytest

from tests.tflm.backends.test_torch_seeds import run_counted

pytest.importorskip("torch")

NO_DROPOUT = ["model.dropout=0", "model.dropout_h=0", "model.dropout_i=0", "model.dropout_e=0",
              "model.weight_dropout=0"]
TINY = ["model.embed_dim=6", "model.hidden_dim=7", "training.bptt=6", "training.batch_size=4"]

_TRAIN = """
import json
import keras, numpy as np, torch
from torch._dynamo.utils import counters
from tflm.backends import torch_compiled_step
from tools.frameworks.keras_runner import PresetFit
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings

torch_compiled_step.BACKEND = BACKEND

def train(jit, sets):
    keras.utils.set_random_seed(3)
    sets = sets + [f"training.jit_compile={str(jit).lower()}"]
    fit = PresetFit(RunSettings.from_config(resolve_config("awd_lstm_ptb", sets)), 40, 12)
    assert fit.model.jit_compile is jit
    assert fit.model.padded_windows is False  # zoo.train's builder, on PyTorch
    fit(3)
    fit(3)  # the state carried from the first fit's windows
    return fit.model, [np.asarray(v.value.detach()) for v in fit.model.weights]
"""


# aot_eager (the compiled backward) is slow-marked: the Inductor test covers that path too
@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_the_compiled_forward_trains_the_eager_weights_in_one_graph(backend):
    result = run_counted(f"BACKEND, SETS = {backend!r}, {TINY + NO_DROPOUT!r}\n" + _TRAIN + """
eager_model, eager = train(False, SETS)
model, compiled = train(True, SETS)
print("RESULT" + json.dumps({
    "difference": max(float(np.abs(a - b).max()) for a, b in zip(eager, compiled)),
    "trained": max(float(np.abs(a).max()) for a in compiled),
    "breaks": sum(counters["graph_break"].values()),
    "graphs": counters["stats"]["unique_graphs"],
    "jit_compile": model.jit_compile,
    "step_compiled_by_keras": hasattr(model.train_function, "_torchdynamo_orig_callable")}))
""")
    assert result["difference"] < 1e-5 < result["trained"]
    assert result["breaks"] == 0
    # one graph: the state exists before the first window (`EagerStreamState.ensure`)
    assert result["graphs"] == 1
    assert result["jit_compile"] and not result["step_compiled_by_keras"]


def test_new_window_lengths_share_one_graph_and_train_the_eager_weights():
    """The first new length compiles a graph with a symbolic time axis (torch.compile's
    automatic dynamic shapes), which serves every later length: nothing in the forward
    fixes the length (the LSTM is one operator, `tflm::lstm`; the targets are picked with
    `torch.gather`)."""
    sets = TINY + NO_DROPOUT
    result = run_counted(f"BACKEND, SETS = 'eager', {sets!r}\n" + _TRAIN + """
def lengths(jit):
    keras.utils.set_random_seed(3)
    fit = PresetFit(RunSettings.from_config(resolve_config("awd_lstm_ptb", SETS)), 40, 40)
    fit.model.jit_compile = jit
    fit.model.padded_windows = False
    fit(2)
    graphs = [counters["stats"]["unique_graphs"]]
    for bptt in (3, 5, 3, 7, 5):
        x = np.random.default_rng(bptt).integers(0, 40, (4, bptt + 1)).astype("int32")
        fit.model.fit(x[:, :-1], x[:, 1:], batch_size=4, epochs=1, verbose=0, shuffle=False)
        graphs.append(counters["stats"]["unique_graphs"])
    return graphs, [np.asarray(v.value.detach()) for v in fit.model.weights]

_, eager = lengths(False)
graphs, compiled = lengths(True)
print("RESULT" + json.dumps({
    "graphs": graphs, "breaks": sum(counters["graph_break"].values()),
    "difference": max(float(np.abs(a - b).max()) for a, b in zip(eager, compiled))}))
""")
    assert result["breaks"] == 0 and result["difference"] < 1e-5
    # lengths 3, 5, 3, 7, 5 after the fixed windows of 6
    assert result["graphs"] == [1, 2, 2, 2, 2, 2]


def test_dropout_masks_drawn_in_the_graph_keep_their_rate_and_change_per_step():
    result = run_counted("""
import json
import keras, numpy as np, torch
from tflm import backends
from tflm.layers import LockedDropout

layer = LockedDropout(0.4, seed=1)
x = torch.ones(200, 5, 100)
layer(x, training=True)  # built
seed = keras.random.SeedGenerator(2)
draw = torch.compile(lambda: backends.current().uniform((400, 250), seed), fullgraph=True,
                     backend="eager")
normal = torch.compile(lambda: backends.current().normal((400, 250), seed), fullgraph=True,
                       backend="eager")
dropped = torch.compile(lambda x: layer(x, training=True), fullgraph=True, backend="eager")

torch.manual_seed(7)
a, b, n = draw(), draw(), normal()
torch.manual_seed(7)
again = draw()
y, z = dropped(x), dropped(x)
zeros = (y == 0).float()
print("RESULT" + json.dumps({
    "mean": float(a.mean()), "low": float(a.min()), "high": float(a.max()),
    "differ": bool((a != b).any()), "reproduced": bool((a == again).all()),
    "normal": [float(n.mean()), float(n.std())],
    "zero_share": float(zeros.mean()),
    "locked": bool((zeros == zeros[:, :1]).all()),
    "kept": sorted({round(float(v), 5) for v in y.unique()}),
    "masks_differ": bool(((y == 0) != (z == 0)).any())}))
""")
    # 100,000 uniform draws: sd of the mean 0.0009; 20,000 Bernoulli(0.4) masks: sd 0.0035
    assert abs(result["mean"] - 0.5) < 0.005
    assert 0.0 <= result["low"] and result["high"] < 1.0
    assert result["differ"] and result["reproduced"]
    assert abs(result["normal"][0]) < 0.02 and abs(result["normal"][1] - 1.0) < 0.02
    assert abs(result["zero_share"] - 0.4) < 0.02
    assert result["locked"] and result["masks_differ"]
    assert result["kept"] == [0.0, round(1 / 0.6, 5)]


def test_padded_windows_fail_the_promise_or_keep_their_mask():
    result = run_counted(f"SETS = {TINY + NO_DROPOUT!r}\n" + """
import json
import keras, numpy as np, torch
from tflm.backends import torch_compiled_step
from tflm.data.pad_id import PAD_ID
from tools.frameworks.keras_runner import PresetFit
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings

torch_compiled_step.BACKEND = "eager"
keras.utils.set_random_seed(3)
model = PresetFit(RunSettings.from_config(resolve_config("awd_lstm_ptb", SETS)), 40, 4).model
rng = np.random.default_rng(0)
x = torch.tensor(rng.integers(0, 40, (4, 6)), dtype=torch.int32)
x[1, 4:] = PAD_ID
y = torch.tensor(rng.integers(0, 40, (4, 6)), dtype=torch.int32)
y[1, 4:] = 0

model.padded_windows = True
eager = torch_compiled_step.forward_and_loss(model, x, y, None)
compiled = torch_compiled_step.compiled_forward_and_loss(model, x, y, None)
model.padded_windows = False
torch._dynamo.reset()
try:
    torch_compiled_step.compiled_forward_and_loss(model, x, y, None)
    error = None
except RuntimeError as e:
    error = str(e)
print("RESULT" + json.dumps({
    "eager": [float(t) for t in eager], "compiled": [float(t) for t in compiled],
    "error": error}))
""")
    assert result["compiled"] == pytest.approx(result["eager"], rel=1e-6)
    assert result["eager"][2] == 22  # the 24 positions less the two padded ones
    assert "padded_windows is False but a training window holds padding" in result["error"]


@pytest.mark.slow
def test_inductor_trains_the_eager_weights():
    result = run_counted(f"BACKEND, SETS = 'inductor', {TINY + NO_DROPOUT!r}\n" + _TRAIN + """
_, eager = train(False, SETS)
_, compiled = train(True, SETS)
print("RESULT" + json.dumps({
    "difference": max(float(np.abs(a - b).max()) for a, b in zip(eager, compiled)),
    "breaks": sum(counters["graph_break"].values())}))
""")
    assert result["difference"] < 1e-4 and result["breaks"] == 0


def test_the_loss_under_dropout_has_the_eager_distribution():
    """Every dropout at 0.5 and weights large enough for the masks to move the loss: the
    compiled forward's losses over 150 windows of draws have the eager ones' mean and
    spread (the masks come from another generator, not another distribution)."""
    sets = ["model.embed_dim=6", "model.hidden_dim=7", "training.bptt=6",
            "training.batch_size=4", "model.dropout=0.5", "model.dropout_h=0.5",
            "model.dropout_i=0.5", "model.dropout_e=0.5", "model.weight_dropout=0.5"]
    result = run_counted(f"SETS = {sets!r}\n" + """
import json, statistics
import keras, numpy as np, torch
from tflm.backends import torch_compiled_step
from tools.frameworks.keras_runner import PresetFit
from zoo.runs.config import resolve_config
from zoo.runs.settings import RunSettings

torch_compiled_step.BACKEND = "eager"
keras.utils.set_random_seed(3)
model = PresetFit(RunSettings.from_config(resolve_config("awd_lstm_ptb", SETS)), 40, 4).model
rng = np.random.default_rng(0)
for v in model.weights:
    v.assign(rng.normal(0.0, 0.7, v.shape).astype("float32"))
x = torch.tensor(rng.integers(0, 40, (4, 6)), dtype=torch.int32)
y = torch.tensor(rng.integers(0, 40, (4, 6)), dtype=torch.int32)
n = 150
compiled = [float(torch_compiled_step.compiled_forward_and_loss(model, x, y, None)[0])
            for _ in range(n)]
eager = [float(torch_compiled_step.forward_and_loss(model, x, y, None)[0]) for _ in range(n)]
print("RESULT" + json.dumps({
    "means": [statistics.mean(compiled), statistics.mean(eager)],
    "sds": [statistics.stdev(compiled), statistics.stdev(eager)], "n": n}))
""")
    (c_mean, e_mean), (c_sd, e_sd), n = result["means"], result["sds"], result["n"]
    assert e_sd > 0.05 * e_mean  # the masks move the loss
    assert abs(c_mean - e_mean) < 4 * ((c_sd ** 2 + e_sd ** 2) / n) ** 0.5
    assert 0.7 < c_sd / e_sd < 1.43  # the sd of a sample sd is about sd / sqrt(2 n)
