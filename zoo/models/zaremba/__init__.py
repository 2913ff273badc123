"""Zaremba et al. 2014's LSTM as TensorFlow's PTB tutorial trains it:
`zaremba_backbone.ZarembaBackbone` (embedding + LSTMs, dropout between layers) and
`zaremba_lm.ZarembaLSTM` (the task: time-summed loss, `model.kind` "zaremba")."""
