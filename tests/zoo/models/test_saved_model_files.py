"""`.keras` files saved by an earlier layout of the code still load and compute the same.

`tests/data/saved_models/` holds three small models (AWD-LSTM with a softmax and a MoS head,
Zaremba's LSTM) saved at commit 1d4ad47, before zoo/ moved into its wings (issue 40), with
their log-probabilities on fixed tokens. Keras finds zoo's and tflm's classes by their
registered names ("zoo>AWDLSTM"), not by the module path written in the file, so moving a
module must not change what a saved file loads into.
"""

import numpy as np
import pytest

from tests.conftest import REPO
from zoo import load_model

SAVED = REPO / "tests" / "data" / "saved_models"
EXPECTED = np.load(SAVED / "expected_log_probs.npz")


@pytest.mark.parametrize("name,cls,head", [("awd_lstm_softmax", "AWDLSTM", "SoftmaxLayer"),
                                           ("awd_lstm_mos", "AWDLSTM", "MoSLayer"),
                                           ("zaremba", "ZarembaLSTM", "SoftmaxLayer")])
def test_a_model_saved_before_the_move_loads_and_computes_the_same(name, cls, head):
    model = load_model(SAVED / f"{name}.keras")
    assert type(model).__name__ == cls
    assert type(model.head).__name__ == head
    got = np.asarray(model(EXPECTED["tokens"], training=False))
    np.testing.assert_allclose(got, EXPECTED[name], rtol=1e-6, atol=1e-6)
