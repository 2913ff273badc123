"""The AWD-LSTM family (Merity et al. 2018): `awd_lstm_backbone.AWDLSTMBackbone` (embedding and
weight-dropped LSTMs -> every layer's hidden states) and `awd_lstm_lm.AWDLSTM` (the language
model: backbone + output head, AR/TAR)."""
