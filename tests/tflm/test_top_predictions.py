"""`tflm.tensorboard.TopPredictionsText`: each fixed context's top next words, from the
backend's compiled forward, as the model's own forward pass gives them."""

import keras
import numpy as np

from tflm.tensorboard import TopPredictionsText
from zoo import AWDLSTM


def test_table_rows_are_each_contexts_top_words_from_the_forward_pass(tmp_path):
    keras.utils.set_random_seed(0)
    model = AWDLSTM(vocab_size=30, embed_dim=8, hidden_dim=12, num_layers=2, seed=0)
    model.compile(optimizer="sgd")
    model.build((None, None))
    rng = np.random.default_rng(1)
    contexts = [rng.integers(0, 30, n) for n in (5, 8, 5)]  # two lengths: two windows
    vocabulary = [f"w{i}" for i in range(30)]
    callback = TopPredictionsText(tmp_path, contexts, vocabulary, k=3)
    callback.set_model(model)
    rows = callback.table().splitlines()[2:]
    assert len(rows) == 3
    for ids, row in zip(contexts, rows):
        log_probs, _ = model.forward_with_state(ids[None, :].astype("int32"), None)
        last = np.asarray(keras.ops.convert_to_numpy(log_probs))[0, -1]
        top = np.argsort(-last)[:3]
        assert row.split(" | ")[1].rstrip(" |") == ", ".join(
            f"w{i} ({np.exp(last[i]):.3f})" for i in top)
        assert row.startswith("| ... " + " ".join(f"w{i}" for i in ids[-12:]))
