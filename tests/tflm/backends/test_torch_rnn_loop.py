"""`TorchBackend.rnn_loop`: Keras' time loop written out on PyTorch gives what Keras' other
loop gives (outputs, last output, states, gradients) for every mask, direction and output
option, and reads nothing back to the host per step, where Keras' other loop reads its
tensor time counter at every step."""

import pytest

from tests.tflm.backends.test_torch_seeds import run_counted

pytest.importorskip("torch")


def test_the_written_out_loop_equals_keras_loop_and_reads_nothing_back():
    result = run_counted("""
import collections, itertools, json
import numpy as np, torch
from keras import ops
from tflm import backends, compat

rng = np.random.default_rng(0)
x = rng.normal(size=(3, 6, 4)).astype("float32")
u = torch.tensor(rng.normal(size=(5, 5)).astype("float32"), requires_grad=True)
w = torch.tensor(rng.normal(size=(4, 5)).astype("float32"))
h0 = ops.convert_to_tensor(rng.normal(size=(3, 5)).astype("float32"))
mask = ops.convert_to_tensor(np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0],
                                       [1, 1, 1, 1, 1, 0]], bool))

def step(x_t, states):
    (h,) = states
    h = ops.tanh(ops.matmul(x_t, w) + ops.matmul(h, u))
    return h * 2.0, [h]

def run(loop, **options):
    u.grad = None
    last, outputs, (h,) = loop(step, ops.convert_to_tensor(x), [h0], **options)
    (ops.sum(outputs) + ops.sum(last) + ops.sum(h)).backward()
    return [t.detach().numpy() for t in (last, outputs, h, u.grad)]

rows, reads = [], collections.Counter()
for masked, backwards, zero, every in itertools.product([False, True], repeat=4):
    if masked and backwards:
        continue  # Keras' own choice kept there (its written-out loop fails on it)
    options = dict(mask=mask if masked else None, go_backwards=backwards, unroll=False,
                   zero_output_for_mask=zero, return_all_outputs=every)
    counter = Count()
    with counter:
        ours = run(backends.current().rnn_loop, **options)
    reads["ours"] += counter.ops["_local_scalar_dense"]
    counter = Count()
    with counter:
        keras_loop = run(compat.rnn_loop, **options)
    reads["keras"] += counter.ops["_local_scalar_dense"]
    rows.append({"case": [masked, backwards, zero, every],
                 "shapes": [list(a.shape) == list(b.shape) for a, b in zip(ours, keras_loop)],
                 "diff": max(float(np.abs(a - b).max()) for a, b in zip(ours, keras_loop))})
print("RESULT" + json.dumps({"rows": rows, "reads": reads}))
""")
    assert len(result["rows"]) == 12
    for row in result["rows"]:
        assert row["shapes"] == [True] * 4, row
        assert row["diff"] <= 1e-6, row
    assert result["reads"]["ours"] == 0
    assert result["reads"]["keras"] >= 12 * 6  # its counter, read at every step
