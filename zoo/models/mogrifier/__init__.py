"""The Mogrifier LSTM family (Melis et al. 2020) as deepmind/lamb trains it:
`mogrifier_backbone.MogrifierBackbone` (embedding, dropouts, Mogrifier LSTMs with lamb's skip
connections) and `mogrifier_lm.MogrifierLM` (the task: time-summed loss, `model.kind`
"mogrifier")."""
