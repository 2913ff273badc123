"""LanguageModel.parameter_count: every weight but the bookkeeping (a sampler's proposal,
reported counters), as papers count parameters; zoo.train's metrics.json reports it."""

from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM

V = 40


def _model(head):
    model = AWDLSTM(V, embed_dim=6, hidden_dim=10, num_layers=2, seed=0, head=head)
    model.build()
    return model


def test_parameter_count_leaves_out_the_sampler_and_the_counters():
    plain = _model({"type": "softmax"})
    assert plain.parameter_count() == plain.count_params()
    sampled = _model({"type": "softmax", "num_samples": 5})
    assert sampled.count_params() == plain.count_params() + 2 * V  # the proposal's weights
    assert sampled.parameter_count() == plain.parameter_count()
    node = _model({"type": "node"})
    assert node.parameter_count() == node.count_params() - 1      # its nfe counter
    trainable = sum(int(w.numpy().size) for w in node.trainable_weights)
    assert node.parameter_count() == trainable


def test_the_trainable_count_leaves_out_a_frozen_plifs_slopes():
    """Parthiban 2020 Table 5.16 counts LMS-PLIF dagger's trainable weights: Softmax's."""
    frozen = _model({"type": "plif", "num_intervals": 50, "frozen": True})
    trained = _model({"type": "plif", "num_intervals": 50})
    assert frozen.parameter_count() == trained.parameter_count()
    assert trained.trainable_parameter_count() == trained.parameter_count()
    assert frozen.trainable_parameter_count() == frozen.parameter_count() - 50
    assert frozen.trainable_parameter_count() == sum(
        int(w.numpy().size) for w in frozen.trainable_weights)
