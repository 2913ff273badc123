"""A saved model and a corpus belong together only with the same words in the same order.

A run writes its vocabulary as `vocab.txt` (one word per line, in id order) beside
`best.keras` / `final.keras`. A corpus with the model's vocabulary size but another order
gives finite, plausible-looking and wrong figures (every id means another word), so every
tool that pairs a saved model with a corpus compares the words, not only their number.
"""

import pathlib

from zoo.errors import UserError

VOCAB_FILE = "vocab.txt"


class VocabularyMismatchError(UserError):
    """The corpus vocabulary is not the one the model was trained with."""


def saved_vocabulary(model_path):
    """The words of the `vocab.txt` beside `model_path`, or None when there is none."""
    path = pathlib.Path(model_path).parent / VOCAB_FILE
    if not path.exists():
        return None
    return path.read_text(encoding="utf-8").splitlines()


def check_model_vocabulary(model_path, model_vocab_size, vocabulary):
    """Raise `VocabularyMismatchError` unless `vocabulary` (the corpus' words in id order) is
    the model's: its size always, its words when a `vocab.txt` lies beside `model_path`.

    Returns "words" when the words were compared, "size" when only the size could be.
    """
    words = list(vocabulary)
    if int(model_vocab_size) != len(words):
        raise VocabularyMismatchError(
            f"{model_path} predicts {int(model_vocab_size)} words but the corpus vocabulary "
            f"has {len(words)}; use the corpus the model was trained on.")
    saved = saved_vocabulary(model_path)
    if saved is None:
        return "size"
    if saved != words:
        if len(saved) != len(words):
            detail = f"{VOCAB_FILE} there lists {len(saved)} words"
        else:
            i = next(i for i, (a, b) in enumerate(zip(saved, words)) if a != b)
            detail = (f"first difference at id {i}: the model's word is {saved[i]!r}, the "
                      f"corpus' {words[i]!r}")
        raise VocabularyMismatchError(
            f"{model_path}: the corpus vocabulary has the model's size but not the words "
            f"of the {VOCAB_FILE} beside it ({detail}); use the corpus (and vocabulary "
            "order) the model was trained on.")
    return "words"
