"""Parity with the reference code (tflm/testing/reference_peer.py, PyTorch) from identical weights.

AWD-LSTM, MoS and DOC bodies built as the presets build them (`init="pytorch"`,
`lstm_biases=2`), every dropout off: log-probs over three carried windows, the weights after
three SGD steps of different window lengths, and the raw and averaged weights after the
switch to averaged SGD (three more windows, where torch.optim.ASGD's one-window-late step
size shows) agree with the reference's loop: log-probs to 2e-6, weights to 3e-5. At lr 20
one step moves a weight by up to lr * T / bptt * clip ~ 6, and float32 rounding of the two
frameworks' gradients then leaves ~1e-5 (it does not grow over the six steps); a step with
the wrong size is off by > 1e-3 (the last test). The windows take two lengths only (each
length is one more trace of the train step), which still makes every lagged ASGD step differ
from an unlagged one.

The TensorFlow session runs the log-prob tests (every head) and the steps test of MoS (the
head with the most parts) again under the JAX and PyTorch backends, in a subprocess each (a
Keras backend is fixed per process; the other heads' steps share every line of the step).
"""


import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tflm.testing.reference_peer import (ReferenceLoop, ReferenceRNNModel,  # noqa: E402
                                         load_keras_weights, peer_weights_as_keras)
from tflm.optimizers import AveragedSGD, averaged_weights  # noqa: E402
from tests.backends import run_tests_in_backend  # noqa: E402

V, E, H, B, BPTT, LR = 40, 8, 12, 3, 6, 20.0
HEADS = {"softmax": ({"type": "softmax"}, E, {}),
         "mos": ({"type": "mos", "num_experts": 3}, 10, {"n_experts": 3}),
         "doc": ({"type": "doc", "num_components_per_layer": [0, 2, 3],
                  "cv_regularization": 0.01}, 10, {"components": [0, 2, 3], "var": 0.01})}
NO_DROPOUT = dict(dropout=0.0, dropout_h=0.0, dropout_i=0.0, dropout_e=0.0,
                  weight_dropout=0.0)


def _pair(head):
    spec, last, peer_kwargs = HEADS[head]
    keras.utils.set_random_seed(3)
    model = __import__("zoo").AWDLSTM(
        V, embed_dim=E, hidden_dim=H, num_layers=3, last_dim=last, head=spec, alpha=2.0,
        beta=1.0, init="pytorch", lstm_biases=2, bptt=BPTT, clip_norm=0.25,
        weight_decay=1.2e-6, **NO_DROPOUT)
    model.compile(optimizer=AveragedSGD(LR))
    model.build((None, None))
    peer = ReferenceRNNModel(V, E, H, last, 3, head=head, alpha=2.0, beta=1.0, **peer_kwargs)
    load_keras_weights(peer, model)
    return model, peer


def _windows(lengths, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, V, size=(B, sum(lengths) + 1)).astype("int32")
    start = 0
    for n in lengths:
        yield data[:, start:start + n], data[:, start + 1:start + n + 1]
        start += n


def _time_major(a):
    return torch.as_tensor(np.ascontiguousarray(a.T), dtype=torch.long)


def _assert_weights_equal(model, expected, atol):
    keras_values = {v.path.split("/", 1)[1]: keras.ops.convert_to_numpy(v) for v in model.weights}
    for suffix, value in expected.items():
        [ours] = [k for k in keras_values if k.endswith(suffix)]
        np.testing.assert_allclose(keras_values[ours], value, atol=atol, rtol=1e-5,
                                   err_msg=suffix)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_log_probs_over_three_carried_windows(head):
    model, peer = _pair(head)
    states, hidden = None, peer.init_hidden(B)
    peer.eval()
    for x, _ in _windows([5, 7, 4]):
        ours, states = model.forward_with_state(x, states, training=False)
        with torch.no_grad():
            theirs, hidden, _ = peer(_time_major(x), hidden)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours),
                                   theirs.numpy().transpose(1, 0, 2),
                                   atol=2e-6)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_sgd_then_averaged_sgd_steps_equal_the_reference_loop(head):
    model, peer = _pair(head)
    loop = ReferenceLoop(peer, LR, BPTT, clip=0.25, wdecay=1.2e-6)
    windows = list(_windows([7, 5, 7, 5, 7, 5], seed=1))
    for x, y in windows[:3]:
        model.train_on_batch(x, y)
        loop.step(_time_major(x), _time_major(y))
    _assert_weights_equal(model, peer_weights_as_keras(peer), atol=3e-5)

    model.optimizer.start_averaging_now()
    loop.switch_to_asgd()
    for x, y in windows[3:]:  # lengths 5, 7, 5: the lagged step sizes are 1, 5/6, 7/6
        model.train_on_batch(x, y)
        loop.step(_time_major(x), _time_major(y))
    _assert_weights_equal(model, peer_weights_as_keras(peer), atol=3e-5)
    with averaged_weights(model):
        _assert_weights_equal(model, peer_weights_as_keras(peer, loop.averaged_parameters()),
                              atol=3e-5)


def test_without_the_lag_the_averaged_steps_would_differ():
    """The ASGD check above can fail: the same windows with T / bptt (no lag) move the
    weights measurably away from the reference's."""
    model, peer = _pair("softmax")
    loop = ReferenceLoop(peer, LR, BPTT, clip=0.25, wdecay=1.2e-6)
    model.optimizer.start_averaging_now()
    loop.switch_to_asgd()
    for x, y in _windows([5, 7], seed=2):
        loop.step(_time_major(x), _time_major(y))
    lagged = peer_weights_as_keras(peer)
    model2, peer2 = _pair("softmax")
    sgd = ReferenceLoop(peer2, LR, BPTT, clip=0.25, wdecay=1.2e-6)  # SGD: no lag
    for x, y in _windows([5, 7], seed=2):
        sgd.step(_time_major(x), _time_major(y))
    unlagged = peer_weights_as_keras(peer2)
    gap = max(np.abs(lagged[k] - unlagged[k]).max() for k in lagged)
    assert gap > 1e-3


@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_parity_holds_on_the_other_keras_backends(backend):
    out = run_tests_in_backend(backend, __file__,
                               "log_probs or steps_equal_the_reference_loop and mos")
    assert " passed" in out and "skipped" not in out, out[-2000:]
