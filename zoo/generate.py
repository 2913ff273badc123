"""Sample text from a trained language model, one word at a time.

    w_1 .. w_P = the prompt (or one start word);   for i = 1 .. N:
        log p_i = model's log-probabilities after w_1 .. w_{P+i-1}   (one row of Q_theta)
        w_{P+i} ~ softmax(log p_i / temperature), restricted to its top_k words when given

Every output head returns log-probabilities (docs/design.md, contract 1), so sampling works
with every head alike. The LSTM state is carried from word to word (batch 1, evaluation
mode: no dropout), exactly as one forward pass over the whole text would carry it: each
generated word is fed back as a one-token window with the state the previous window left
(`model.generate`'s steps, `tflm.generation.sample_steps`: the model's compiled predict
function with the state carried). The prompt, whitespace-split, is fed first as one window;
without a prompt the text starts from `<eos>` when the vocabulary has it (a sentence
start), else from id 0. Neither the prompt nor the start word is part of the
output.

Sampling uses NumPy's `Generator(PCG64(seed))`, one uniform number per word drawn against
the cumulative distribution in id order, so a seed gives the same text on every Keras
backend (the model itself is deterministic in evaluation mode; a word can differ only where
a uniform number falls within float rounding of a boundary between two words).

CLI (`RUN_DIR|MODEL.keras`: see `zoo.runs.saved_run`; the run's `vocab.txt` gives the words):

    python -m zoo.generate RUN_DIR --words 100 [--temperature 1.0] [--seed 1111]
        [--prompt "the company said"] [--top-k K] [--corpus NAME] [--data-dir DIR]
        [--out FILE]

The words are printed separated by spaces, with a line break in place of each `<eos>`.

Reference: the `generate.py` of salesforce/awd-lstm-lm (and of PyTorch's
word_language_model example, which it follows): sample `--words` words at `--temperature`
from the model's output, one word fed back at a time. Differences: that script starts from a
uniformly random word, has no prompt or top-k, and writes `<eos>` literally with a line break
after every 20th word.
"""

import argparse
import contextlib
import math
import pathlib
import sys

import numpy as np

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.user_errors import one_line_errors

EOS = "<eos>"
UNK = "<unk>"
DEFAULT_SEED = 1111  # the reference script's
PROGRESS_MIN_WORDS = 200  # a progress bar (to stderr) above this many words, into --out


def check_options(num_words, temperature=1.0, top_k=None, vocab_size=None):
    """Raise `UserError` unless num_words >= 1, temperature is a finite number > 0 and
    top_k is None or an integer in [1, vocab_size]."""
    if isinstance(num_words, bool) or not isinstance(num_words, (int, np.integer)) \
            or num_words < 1:
        raise UserError(f"the number of words must be an integer >= 1; got {num_words!r}.")
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        t = float("nan")
    if not (math.isfinite(t) and t > 0):
        raise UserError(f"temperature must be a number > 0 (1 samples the model's own "
                        f"distribution, lower is more conservative); got {temperature!r}.")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise UserError(f"top-k must be an integer >= 1 (or none: every word); "
                            f"got {top_k!r}.")
        if vocab_size is not None and top_k > vocab_size:
            raise UserError(f"top-k must be at most the vocabulary size {vocab_size}; "
                            f"got {top_k}.")


def sampler_for(temperature=1.0, top_k=None):
    """The `tflm.samplers` sampler of these options: top-k at `temperature`, or every word."""
    from tflm import samplers  # deferred: a command's frameworks import after start_command

    return (samplers.TopKSampler(int(top_k), temperature) if top_k is not None
            else samplers.RandomSampler(temperature))


def sample_next(log_probs, rng, temperature=1.0, top_k=None):
    """One word id drawn from a row of log-probabilities (V,):

        p(w) proportional to exp(log_probs[w] / temperature)   on the top_k most likely words
                                                               (all words when None)

    one `rng.random()` against the cumulative distribution in id order; ties at the top-k
    boundary keep the lower ids; `-inf` entries are never drawn (`tflm.samplers`)."""
    return sampler_for(temperature, top_k).draw(np.asarray(log_probs, np.float64).reshape(-1),
                                                rng)


def prompt_ids(prompt, vocabulary):
    """The ids of the prompt's words (`tflm.generation.prompt_ids`): a word not in
    `vocabulary` becomes `<unk>` when the vocabulary has it, else `UserError` names it."""
    from tflm import generation  # deferred: a command's frameworks import after start_command

    try:
        return generation.prompt_ids(prompt, list(vocabulary))
    except ValueError as err:
        raise UserError(str(err)) from None


def sample_stream(model, vocabulary, num_words, temperature=1.0, seed=None, prompt=None,
                  top_k=None, eos=EOS):
    """`generate`, one word at a time: yields `(word, id, log_probs)` per generated word,
    `log_probs` being the model's row (float64, (V,)) the word was drawn from. Arguments as
    `generate`; they are checked before anything is computed."""
    vocabulary = list(vocabulary)
    size = int(getattr(model, "vocab_size", None) or len(vocabulary))
    if len(vocabulary) != size:
        raise UserError(f"the model predicts {size} words but the vocabulary has "
                        f"{len(vocabulary)}; use the model's own vocab.txt.")
    check_options(num_words, temperature, top_k, size)
    ids = prompt_ids(prompt, vocabulary) if prompt is not None else []
    if not ids:
        ids = [vocabulary.index(eos) if eos is not None and eos in vocabulary else 0]
    return _stream(model, vocabulary, ids, num_words, float(temperature), seed, top_k)


def _stream(model, vocabulary, ids, num_words, temperature, seed, top_k):
    from tflm import generation  # deferred: a command's frameworks import after start_command

    rng = np.random.Generator(np.random.PCG64(seed))
    steps = generation.sample_steps(model, [ids], num_words, sampler_for(temperature, top_k),
                                    rng)
    for i in range(num_words):
        try:
            drawn, rows = next(steps)
        except ValueError as err:  # rows that are not finite
            raise UserError(f"the model's log-probabilities for word {i + 1} are not finite "
                            "(NaN weights?); the model is broken.") from err
        yield vocabulary[int(drawn[0])], int(drawn[0]), rows[0]


def generate(model, vocabulary, num_words, temperature=1.0, seed=None, prompt=None,
             top_k=None, eos=EOS):
    """Sample `num_words` words from a language model, the state carried word to word.

    Args:
        model: a `tflm.LanguageModel` (e.g. a loaded `zoo.AWDLSTM`), any head.
        vocabulary: the model's words in id order (a run's `vocab.txt`).
        num_words: how many words to generate (>= 1).
        temperature: > 0; log-probabilities are divided by it (1: the model's distribution;
            towards 0: greedy decoding). Default 1.
        seed: the seed of `numpy.random.Generator(PCG64(seed))`; the same seed gives the
            same words. None: fresh randomness.
        prompt: None, or text (split at whitespace) or a list of words to continue; unknown
            words become `<unk>` when the vocabulary has it, else `UserError`.
        top_k: None, or sample from the k most likely words only (1: greedy).
        eos: the end-of-sentence word the text starts from when there is no prompt (id 0
            when the vocabulary lacks it, or when None).

    Returns: the generated words (a list of str; the prompt not included).

    Raises `UserError` for a bad argument or a vocabulary that is not the model's size.

    Example:
        >>> run = zoo.runs.saved_run.open_run("runs/ptb", need_corpus=False)
        >>> generate(run.model, run.vocabulary, 20, temperature=0.8, seed=1, prompt="the")
    """
    return [word for word, _, _ in sample_stream(model, vocabulary, num_words, temperature,
                                                 seed, prompt, top_k, eos)]


def format_text(words, eos=EOS):
    """The words separated by spaces, a line break in place of each `eos`; ends with a line
    break."""
    lines, line = [], []
    for word in words:
        if eos is not None and word == eos:
            lines.append(" ".join(line))
            line = []
        else:
            line.append(word)
    if line:
        lines.append(" ".join(line))
    return "".join(text + "\n" for text in lines)


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m zoo.generate",
        description="Sample text from a trained language model (any output head).")
    p.add_argument("target", metavar="RUN_DIR|MODEL.keras",
                   help="a run directory of `python -m zoo.train` (its best.keras) or a "
                        ".keras file with its vocab.txt beside it")
    p.add_argument("--words", type=int, default=1000,
                   help="how many words to generate (default 1000)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="> 0; higher is more diverse, towards 0 greedy (default 1)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"random seed; the same seed gives the same text (default "
                        f"{DEFAULT_SEED})")
    p.add_argument("--prompt", help="text to continue (whitespace-separated words; unknown "
                                    f"words become {UNK} when the vocabulary has it)")
    p.add_argument("--top-k", type=int, help="sample only from the K most likely words")
    p.add_argument("--corpus", help="the corpus whose vocabulary to use when no vocab.txt "
                                    "lies beside the model (ptb, wikitext-2, a directory)")
    p.add_argument("--data-dir", help="where named corpora live (default $TFLM_DATA_DIR)")
    p.add_argument("--out", help="write the text to this file instead of stdout")
    return p


@one_line_errors("zoo.generate")
def main(argv=None):
    start_command()
    args = _parser().parse_args(argv)
    imports_done()
    _run(args)  # a UserError is one line (one_line_errors)
    return 0


def _run(args):
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.saved_run import open_run, vocabulary_note

    check_options(args.words, args.temperature, args.top_k)
    out = None
    if args.out is not None:
        out = pathlib.Path(args.out)
        if not out.parent.is_dir():
            raise UserError(f"cannot write {out}: no directory {out.parent}.")
        if out.is_dir():
            raise UserError(f"cannot write {out}: it is a directory; name a file.")
    run = open_run(args.target, corpus=args.corpus, data_dir=args.data_dir,
                   need_corpus=False)
    note = vocabulary_note(run, "zoo.generate")
    if note:
        print(note, file=sys.stderr)
    stream = sample_stream(run.model, run.vocabulary, args.words, args.temperature,
                           args.seed, args.prompt, args.top_k)
    bar = None
    if out is not None and args.words > PROGRESS_MIN_WORDS:
        # deferred: a command's frameworks import after start_command (zoo.runtime.command)
        import keras
        bar = keras.utils.Progbar(args.words, unit_name="word")
    words = []
    for word, _, _ in stream:
        words.append(word)
        if bar is not None:
            with contextlib.redirect_stdout(sys.stderr):  # Progbar writes to stdout
                bar.update(len(words))
    text = format_text(words)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        atomic_files.write_text(out, text)
    except OSError as err:
        sys.stdout.write(text)  # the words are not lost with the file
        sys.stdout.flush()
        raise atomic_files.write_failed(out, err, "the text is printed above; an earlier file "
                                        "of that name is whole") from None


if __name__ == "__main__":
    run_command(main)
