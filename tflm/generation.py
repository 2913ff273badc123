"""Text generation and scoring on a `tflm.LanguageModel`, with KerasHub's argument
conventions (`CausalLM.generate(inputs, max_length, ...)`, `CausalLM.score(token_ids,
padding_mask, scoring_mode, target_ids)`, samplers by name or object).

`generate`: the prompts are fed as one window (right-padded with `PAD_ID`, whose positions
hold the state), then every drawn word as a one-token window, the LSTM state carried from
window to window in the model's inference streams: the carried state is the cache. Each
window runs the model's compiled predict function (`keras.Model.predict_on_batch`, traced
once per window length: the prompt's and 1), not an eager call per word; the draw is on the
host (`tflm.samplers`), so a seed gives the same words on every backend.

    w_1 .. w_P = the prompt;   for i = 1 .. max_length - P:
        w_{P+i} ~ sampler(log p(. | w_1 .. w_{P+i-1}))      (stops at a stop token)

`score`: log-probabilities of every position from zero state (scoring_mode "logits": our
heads return log-probabilities, which are logits of the same softmax), or the per-token
negative log-likelihood of `target_ids` ("loss"); padded positions score 0.
"""

import numpy as np

from tflm import samplers
from tflm.data.pad_id import PAD_ID

UNK = "<unk>"


def prompt_ids(prompt, vocabulary):
    """The ids of a prompt's words (a string split at whitespace, or a list of words). A
    word outside `vocabulary` becomes `<unk>` when the vocabulary has it, else ValueError."""
    words = prompt.split() if isinstance(prompt, str) else [str(w) for w in prompt]
    index = {word: i for i, word in enumerate(vocabulary)}
    ids = []
    for word in words:
        if word in index:
            ids.append(index[word])
        elif UNK in index:
            ids.append(index[UNK])
        else:
            shown = ", ".join(list(vocabulary)[:5]) + (", ..." if len(vocabulary) > 5 else "")
            raise ValueError(f"the prompt word {word!r} is not in the model's vocabulary "
                             f"({len(vocabulary)} words: {shown}; no {UNK} to stand for "
                             "unknown words); use words of the vocabulary.")
    return ids


def sample_steps(model, prompts, steps, sampler, rng):
    """Yield `(ids, rows)` for `steps` draws: the drawn ids (B,) and the rows (B, V)
    (float64 log-probabilities) they were drawn from. `prompts`: B non-empty lists of ids."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (e.g. the end-of-sentence "
                         "word a text starts after).")
    batch, length = len(prompts), max(len(p) for p in prompts)
    window = np.full((batch, length), PAD_ID, np.int32)
    for i, prompt in enumerate(prompts):
        window[i, :len(prompt)] = prompt
    last = np.array([len(p) - 1 for p in prompts])
    with model.streaming_predictions(batch) as predict:
        rows = np.asarray(predict(window), np.float64)[np.arange(batch), last]
        for step in range(steps):
            ids = sampler(rows, rng)
            yield ids, rows
            if step + 1 < steps:
                rows = np.asarray(predict(ids.astype(np.int32)[:, None]), np.float64)[:, -1]


def generate(model, inputs, max_length, sampler=None, seed=None, stop_token_ids=None,
             strip_prompt=False, vocabulary=None):
    """Continue each prompt of `inputs` up to `max_length` tokens in all.

    Args:
        model: a `tflm.LanguageModel`.
        inputs: a string or a list of strings (words split at whitespace; then `vocabulary`
            or `model.vocabulary` maps them, and strings come back), or token ids: a list
            of id lists or an int array (B, P) (ids come back).
        max_length: the length of prompt + continuation (KerasHub's meaning), per row.
        sampler: a `tflm.samplers.Sampler` or a name ("greedy", "random", "top_k",
            "top_p"); None: "random" (the model's distribution).
        seed: of NumPy's `Generator(PCG64(seed))`; the same seed, the same words.
        stop_token_ids: ids that end a row (not included in the output); for strings
            "auto" or None stop at nothing, as a language model of running text has no end.
        strip_prompt: return the continuation only.
        vocabulary: the words in id order, for string inputs and outputs.

    Returns: strings (words joined by spaces) for string inputs, else a list of id lists
    (a single string for a single string).
    """
    sampler = samplers.get(sampler)
    single = isinstance(inputs, str)
    text = single or (isinstance(inputs, (list, tuple)) and inputs
                      and all(isinstance(x, str) for x in inputs))
    if text:
        vocabulary = vocabulary if vocabulary is not None else getattr(model, "vocabulary",
                                                                       None)
        if vocabulary is None:
            raise ValueError("text prompts need the model's words: pass vocabulary= or load "
                             "the model with from_preset (model.vocabulary).")
        prompts = [prompt_ids(p, vocabulary) for p in ([inputs] if single else inputs)]
    else:
        prompts = [[int(t) for t in np.asarray(row).reshape(-1)] for row in inputs]
    steps = int(max_length) - min(len(p) for p in prompts)
    if steps < 1:
        raise ValueError(f"max_length {max_length} leaves nothing to generate after a "
                         f"prompt of {min(len(p) for p in prompts)} tokens.")
    stops = set() if stop_token_ids in (None, "auto") else {int(t) for t in stop_token_ids}
    rng = np.random.Generator(np.random.PCG64(seed))
    out, done = [list(p) for p in prompts], [False] * len(prompts)
    for ids, _ in sample_steps(model, prompts, steps, sampler, rng):
        for row, token in enumerate(ids):
            if done[row] or len(out[row]) >= max_length:
                continue
            if int(token) in stops:
                done[row] = True
            else:
                out[row].append(int(token))
        if all(done[r] or len(out[r]) >= max_length for r in range(len(out))):
            break
    if strip_prompt:
        out = [row[len(p):] for row, p in zip(out, prompts)]
    if not text:
        return out
    words = [" ".join(vocabulary[i] for i in row) for row in out]
    return words[0] if single else words


def score(model, token_ids, padding_mask=None, scoring_mode="logits", target_ids=None):
    """Score `token_ids` (B, T) from zero state: "logits" gives the log-probabilities
    (B, T, V); "loss" the per-token NLL of `target_ids` (B, T) (0 at padded positions).
    `padding_mask` (B, T): False / 0 where a position is padding."""
    tokens = np.asarray(token_ids, np.int32)
    if tokens.ndim != 2:
        raise ValueError(f"token_ids must be (batch, time); got shape {tokens.shape}.")
    real = np.ones(tokens.shape, bool) if padding_mask is None else np.asarray(padding_mask,
                                                                                 bool)
    log_probs = np.asarray(model.predict_on_batch(np.where(real, tokens, PAD_ID)))
    if scoring_mode == "logits":
        return log_probs
    if scoring_mode != "loss":
        raise ValueError(f"scoring_mode must be 'logits' or 'loss'; got {scoring_mode!r}.")
    if target_ids is None:
        raise ValueError("scoring_mode='loss' needs target_ids (the next token at each "
                         "position).")
    targets = np.asarray(target_ids, np.int64)
    picked = np.take_along_axis(log_probs, np.where(real, targets, 0)[..., None], -1)[..., 0]
    return np.where(real, -picked, 0.0).astype(np.float32)
