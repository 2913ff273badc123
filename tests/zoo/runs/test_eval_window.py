"""`zoo.runs.eval_window`: evaluation at long windows gives the bptt windows' perplexity, and the
window "auto" picks stays within the memory of a training step."""

import json

import numpy as np
import pytest
import keras

import zoo
from tflm import data
from zoo.runs.eval_window import LOGITS_BUDGET, evaluation_window

V = 30
DROPOUTS = dict(dropout=0.4, dropout_h=0.3, dropout_i=0.5, dropout_e=0.1, weight_dropout=0.5)


def test_auto_window_arithmetic():
    # The throughput bench's shape: batch 20 x bptt 35 = 700 training tokens, V = 10,000.
    assert evaluation_window("auto", 35, 1, 700, 10_000) == 700       # batch-1 test
    assert evaluation_window("auto", 35, 10, 700, 10_000) == 70       # batch-10 validation
    assert evaluation_window("auto", 70, 80, 1400, 10_000) == 70      # never below bptt
    # A large vocabulary: the [tokens, V] log-probabilities stay within LOGITS_BUDGET.
    big = 793_471
    window = evaluation_window("auto", 20, 1, 128 * 20, big)
    assert window == LOGITS_BUDGET // big and window * big <= LOGITS_BUDGET
    assert evaluation_window("auto", 35, 1, 700, 10_000, carries_state=False) == 35
    assert evaluation_window("bptt", 35, 1, 700, 10_000) == 35
    assert evaluation_window(300, 35, 1, 700, 10_000, carries_state=False) == 300
    for bad in (0, -3, "long", 2.5, True, None):
        with pytest.raises(ValueError, match="training.eval_window must be"):
            evaluation_window(bad, 35, 1, 700, 10_000)


def _perplexity(model, ids, batch, window):
    return model.evaluate(data.lm_dataset(ids, batch, window, train=False), verbose=0,
                          return_dict=True)["perplexity"]


@pytest.mark.parametrize("kind,head", [("awd_lstm", {"type": "softmax"}),
                                       ("awd_lstm", {"type": "mos", "num_experts": 3}),
                                       ("awd_lstm", {"type": "doc",
                                                     "num_components_per_layer": [2, 3]}),
                                       ("zaremba", {"type": "softmax"})])
def test_long_windows_give_the_bptt_windows_perplexity(kind, head):
    """Dropouts are on in the model and off in evaluation; the state carries across the
    cut, so every window length gives the same perplexity. Without the carry it differs
    (the cut is then the context), which shows the check can fail."""
    ids = np.random.default_rng(4).integers(0, V, 3 * 47 + 2)  # ragged last windows
    cls = zoo.AWDLSTM if kind == "awd_lstm" else zoo.ZarembaLSTM
    extra = DROPOUTS if kind == "awd_lstm" else dict(dropout=0.5)
    sizes = dict(embed_dim=8) if kind == "awd_lstm" else {}
    model = cls(V, hidden_dim=12, num_layers=2, seed=2, bptt=5, head=head, **sizes, **extra)
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    model.build()
    rng = np.random.default_rng(5)  # weights far from an untrained model's near-uniform
    for w in model.weights:
        w.assign(rng.normal(0, 0.6, w.shape).astype(w.dtype))
    for batch in (1, 3):
        short = _perplexity(model, ids, batch, 5)
        for window in (7, 46, 200):
            assert _perplexity(model, ids, batch, window) == pytest.approx(short, rel=1e-5)
    model.carry_state = False
    assert _perplexity(model, ids, 1, 5) != pytest.approx(short, rel=1e-3)


def test_zoo_train_records_its_windows_and_evaluate_reproduces_them(tiny_run):
    """The tiny run trains at batch 8 x bptt 10 (80 tokens) and tests at batch 10 (the
    synthetic preset's), so its windows are 10 (validation, batch 10) and test: 80 // 10."""
    from zoo import evaluate as ev
    from zoo.runs.saved_run import open_run
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    protocol = metrics["evaluation"]
    batch = protocol["test_batch_size"]
    assert protocol["windows"]["test"] == max(10, 80 // batch)
    run = open_run(tiny_run)
    one = ev.evaluate(run, "test")  # batch 1: window 80
    assert (one["bptt"], one["window"]) == (10, 80)
    bptt_windows = ev.evaluate(run, "test", window="bptt")
    assert bptt_windows["window"] == 10
    assert one["perplexity"] == pytest.approx(bptt_windows["perplexity"], rel=1e-6)
