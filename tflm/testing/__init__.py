"""PyTorch peers of the reference implementations, used by the tests to show parity.

    tflm.testing.reference_peer   salesforce/awd-lstm-lm, zihangdai/mos, nttcslab-nlp/doc_lm:
                                  the model, main.py's loop, dynamiceval.py
    tflm.testing.zaremba_peer     TensorFlow's PTB tutorial (Zaremba et al. 2014): model, step

Each re-states a reference's model and training step in plain PyTorch with its conventions
and copies a zoo model's weights into itself, so a test can compare log-probabilities and
weights after steps from identical weights (tests/zoo/runs/test_reference_parity.py,
tests/zoo/models/test_zaremba.py) and bench/reproductions/parity.py can train both side by side.
torch is imported by these modules only: `import tflm` does not import this package.
"""
