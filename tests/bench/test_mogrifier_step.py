"""bench.training.mogrifier_step: the parameter counts it pairs the models by are the models'
own, and the AWD-LSTM it picks is the nearest in size."""

import keras

from bench.training import mogrifier_step as ms
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
from zoo.models.mogrifier.mogrifier_lm import MogrifierLM


def test_counts_are_the_models_and_the_pair_is_the_nearest():
    keras.utils.set_random_seed(0)
    for rounds, rank in ((5, 3), (4, 0)):
        model = MogrifierLM(50, embed_dim=12, hidden_dim=12, rounds=rounds, rank=rank)
        model.build()
        assert model.count_params() == ms.mogrifier_count(50, 12, rounds, rank)
    awd = AWDLSTM(50, embed_dim=14, hidden_dim=14, num_layers=2)
    awd.build()
    assert awd.count_params() == ms.awd_count(50, 14)
    target = ms.mogrifier_count(10000, 912, 5, 84)
    hidden = ms.matching_awd_hidden(10000, 912, 5, 84)
    assert hidden == 951
    assert all(abs(ms.awd_count(10000, h) - target) >= abs(ms.awd_count(10000, hidden) - target)
               for h in (hidden - 1, hidden + 1))
