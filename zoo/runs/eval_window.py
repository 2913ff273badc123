"""The window length a validation or test pass computes with (`training.eval_window`).

Evaluation cuts each stream into windows of the protocol's bptt and hands the recurrent
state from one window to the next (`tflm.LanguageModel.carry_state`). Without dropout and
without backpropagation, the cut changes nothing: every token gets the same log-probability
whatever the window length, and perplexity is token-weighted (`tflm.metrics.Perplexity`):

    PPL = exp( sum_t -log P(y_t | y_<t) / number of tokens ),

the same sum for any windowing, up to float rounding. DOC's published evaluation
(`cal_ppl.py`, Takase et al. 2018) relies on this: batch 1, bptt 5000.

What long windows save is the cost paid once per window: the framework's layer calls and
state hand-over, and an output-layer matmul of only B x bptt rows. At the references' test
protocol, batch 1 and bptt 35 or 70, PTB test is 1,178-2,355 windows of a few milliseconds
of such overhead each. `"auto"` widens the window to

    window = max(bptt, min(B_train x bptt_train, LOGITS_BUDGET // V) // B_eval)

tokens: never more tokens than one training step holds (with its gradients), and never a
[tokens, V] log-probability tensor of more than `LOGITS_BUDGET` elements (256 MiB in
float32; a sampled-softmax run trains on few logits but evaluates on all V). A model that
does not carry state keeps the protocol's windows, where the cut is the context.
"""

LOGITS_BUDGET = 2 ** 26


def check_setting(setting):
    """Raise `ValueError` unless `setting` is "auto", "bptt" or a positive integer."""
    if setting in ("auto", "bptt"):
        return setting
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        return setting
    raise ValueError(f'training.eval_window must be "auto", "bptt" or a positive integer; '
                     f"got {setting!r}.")


def evaluation_window(setting, bptt, batch, train_tokens, vocab_size, carries_state=True):
    """The window length of an evaluation pass at `batch` streams whose protocol is `bptt`.

    setting: "auto" (the widest window the budget above allows), "bptt" (the protocol's
        windows) or a positive integer (that window).
    train_tokens: B_train x bptt_train, the tokens of one training step.
    carries_state: False for a model that starts every window from zero state; then the
        window is the context, so any setting but an explicit integer gives `bptt`.
    """
    setting = check_setting(setting)
    if setting != "auto":
        return bptt if setting == "bptt" else setting
    if not carries_state:
        return bptt
    tokens = min(int(train_tokens), LOGITS_BUDGET // max(int(vocab_size), 1))
    return max(int(bptt), tokens // max(int(batch), 1))


def window_for_run(training, bptt, batch, vocab_size, carries_state=True, setting=None):
    """`evaluation_window` for a run's `TrainingSettings` (`zoo.runs.settings`): `setting`,
    else its eval_window ("auto" by default); the training step's tokens from its
    batch_size x bptt."""
    if setting is None:
        setting = training.eval_window
    return evaluation_window(setting, bptt, batch, training.batch_size * training.bptt,
                             vocab_size, carries_state)
