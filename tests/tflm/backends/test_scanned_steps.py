"""`tflm.backends.scanned_steps`: `steps_per_execution` k on JAX trains k windows in one
compiled scan, with the updates of k single steps; the groups' padding and stacking."""

import json

import numpy as np
import pytest

from tests.backends import run_in_backend
from tflm.backends.compiled_lengths import CompiledLengths
from tflm.backends.scanned_steps import next_groups


def _batch(length, value, batch=2):
    x = np.full((batch, length), value, "int32")
    return x, x + 1


def test_a_group_is_padded_to_one_length_and_its_empty_slots_hold_pad_windows():
    lengths = CompiledLengths(shortest=8)
    batches = iter([_batch(6, 3), _batch(8, 4), _batch(5, 5)])
    [((x, y), count, (key, length, compiles))] = next_groups(batches, 4, lengths, pad_id=0)
    assert count == 3 and key == ("steps", 4, 2) and (length, compiles) == (8, True)
    assert x.shape == y.shape == (4, 2, 8)
    assert x[0, :, :6].tolist() == [[3] * 6] * 2 and x[0, :, 6:].tolist() == [[0] * 2] * 2
    assert y[0, :, 6:].tolist() == [[0] * 2] * 2  # padded targets: 0, masked by the model
    assert x[1].tolist() == [[4] * 8] * 2 and x[2, :, :5].tolist() == [[5] * 5] * 2
    assert x[3].tolist() == [[0] * 8] * 2 and y[3].tolist() == [[0] * 8] * 2  # empty slot
    assert next_groups(batches, 4, lengths, pad_id=0) == []  # spent: the epoch ends


def test_a_longer_window_pads_its_group_to_its_own_length():
    lengths = CompiledLengths(shortest=8)
    [((x, _), count, (_, length, compiles))] = next_groups(
        iter([_batch(6, 3), _batch(11, 4)]), 2, lengths, pad_id=0)
    assert (count, length, compiles) == (2, 11, True) and x.shape == (2, 2, 11)


def test_a_change_of_batch_size_splits_the_group_into_two_programs():
    """An epoch's last, smaller batch (arrays whose row count is no multiple of the batch
    size) runs in a program of its own shape, as a single step would."""
    batches, lengths = iter([_batch(4, 1), _batch(4, 2), _batch(4, 3, batch=1)]), \
        CompiledLengths()
    first, second = next_groups(batches, 4, lengths, pad_id=0)
    assert (first[0][0].shape, first[1], first[2][0]) == ((4, 2, 4), 2, ("steps", 4, 2))
    assert (second[0][0].shape, second[1], second[2][0]) == ((4, 1, 4), 1, ("steps", 4, 1))
    assert second[0][0][0].tolist() == [[3] * 4] and second[0][0][1:].max() == 0
    assert next_groups(batches, 4, lengths, pad_id=0) == []


def test_batches_that_are_not_token_windows_are_refused_with_what_to_do():
    floats = (np.zeros((2, 4), "float32"), np.zeros((2, 4), "float32"))
    with pytest.raises(ValueError, match="steps_per_execution=1 for other data"):
        next_groups(iter([floats]), 2, CompiledLengths(), 0)


def test_k_windows_in_one_scan_train_and_evaluate_as_k_single_steps():
    """A tiny AWD-LSTM (every dropout on, random window lengths) trained two epochs of 11
    and 12 windows with steps_per_execution 5 (groups of 5, 5 and 1 or 2: the last with
    empty slots) and with 1: the same weights and logs, one trace of the train step each,
    a batch-end hook per group; evaluation at 5 (Keras' loop) gives the same loss."""
    out = run_in_backend("jax", """
        import json
        import keras, numpy as np
        from tflm import data
        from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

        ids = np.random.default_rng(0).integers(0, 50, 4 * 12 * 11).astype("int32")
        valid = np.random.default_rng(1).integers(0, 50, 4 * 12 * 7).astype("int32")

        def train(k):
            keras.utils.set_random_seed(5)
            model = AWDLSTM(vocab_size=50, embed_dim=8, hidden_dim=16, num_layers=2, bptt=12,
                            dropout=0.3, dropout_h=0.2, dropout_i=0.3, dropout_e=0.1,
                            weight_dropout=0.4, seed=5)
            model.compile(optimizer=keras.optimizers.SGD(1.0), steps_per_execution=k)
            model.pad_to_compiled_lengths = True
            model.shortest_compiled_length = data.padded_length(data.covering_length(12), 4)
            ends, history, lengths = [], [], []
            hook = keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: ends.append(batch))
            for epoch in range(2):
                train = data.lm_batches(ids, 4, 12, train=True, seed=1, epoch=epoch,
                                        pad_to_multiple=4)
                lengths.append([int(train[i][0].shape[1]) for i in range(len(train))])
                history.append(model.fit(train, epochs=1, verbose=0,
                                         callbacks=[hook]).history)
            evaluation = model.evaluate(data.lm_batches(valid, 4, 12, train=False), verbose=0,
                                        return_dict=True)
            weights = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
            return dict(model=model, history=history, lengths=lengths, ends=ends,
                        evaluation=evaluation, weights=weights,
                        function=model.train_function.__module__,
                        traces=dict(model.traced_steps))

        one, five = train(1), train(5)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(one["weights"],
                                                                five["weights"]))
        print(json.dumps({name: {k: v for k, v in run.items() if k not in ("model", "weights")}
                          for name, run in (("one", one), ("five", five))} | {"diff": diff}))
    """)
    result = json.loads(out.strip().splitlines()[-1])
    one, five = result["one"], result["five"]
    assert [len(epoch) for epoch in one["lengths"]] == [11, 12]  # last groups: 1 and 2
    assert len({n for epoch in one["lengths"] for n in epoch}) > 1  # random window lengths
    assert five["function"] == "tflm.backends.scanned_steps"
    assert one["function"] != five["function"]
    assert five["ends"] == [4, 9, 14] * 2
    assert one["ends"] == list(range(11)) + list(range(12))
    assert five["traces"]["train"] == one["traces"]["train"] == 1
    assert result["diff"] < 1e-6
    for a, b in zip(one["history"], five["history"]):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name] == pytest.approx(b[name], rel=1e-6), name
    assert five["evaluation"]["nll"] == pytest.approx(one["evaluation"]["nll"], rel=1e-6)
