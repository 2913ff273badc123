"""Character-level Penn Treebank, derived from the word-level files as the standard
`ptb.char.*.txt` files are (Mikolov's `simple-examples`, salesforce `getdata.sh` ->
`data/pennchar`).

Derivation, line by line (the word-level preprocessing kept: 10,000 words, `<unk>`, `N`):

    words = line.split()
    char_line = " _ ".join(" ".join(word) for word in words)

so every character of a word is a token, `_` marks the boundary between two words (none at
the line's ends), and `<unk>` becomes the five tokens `< u n k >`. The language-model
references read these files with the word rule (`line.split() + ["<eos>"]`), so every line
ends with `<eos>` as at word level. Example, the first training line:

    aer banknote berlitz ...    ->    a e r _ b a n k n o t e _ b e r l i t z ...

Removing the spaces and turning `_` back into spaces gives the word-level text back exactly
(tested), and the token counts are
    characters + boundaries + lines = sum(len(w)) + sum(len(line) - 1) + lines
per split.

`load_char_corpus(data_dir)` reads `<data_dir>/pennchar/{train,valid,test}.txt` when present
(the standard files) and otherwise derives them in memory from the word-level PTB found as
`load_corpus("ptb")` finds it; `write_char_files(word_dir, out_dir)` writes the derived
files for other tools. The corpus has `level == "char"`: evaluation reports bits per
character, bpc = NLL / ln 2.

Reference: Mikolov et al. 2012 (the char-level PTB files); Merity et al. 2018, "An Analysis
of Neural Language Modeling at Multiple Scales" (salesforce/awd-lstm-lm, `data/pennchar`);
Andonov 2019 §7.4 (Tables 7.9, 7.10).
"""

import pathlib

import numpy as np

from tflm.data.corpus import SPLITS, Corpus, default_data_dir, load_word_corpus
from tflm.data.vocabulary import EOS, Vocabulary

BOUNDARY = "_"
CHAR_DIR = "pennchar"
NAMES = ("ptb-char", "ptb_char", "pennchar", "penn-char")


def char_line(line):
    """The character-level form of one word-level line (no `<eos>`)."""
    return f" {BOUNDARY} ".join(" ".join(word) for word in line.split())


def words_of(char_text_line):
    """The inverse of `char_line`: the word-level line (words separated by one space)."""
    return "".join(char_text_line.split()).replace(BOUNDARY, " ")


def _word_files(data_dir):
    ptb = load_word_corpus("ptb", data_dir)
    return {s: ptb.paths[s] for s in SPLITS}


def write_char_files(word_files, out_dir):
    """Write the derived `train.txt`, `valid.txt`, `test.txt` into `out_dir` from the
    word-level split files `word_files` ({split: path}); returns {split: path}."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, path in word_files.items():
        lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
        target = out_dir / f"{split}.txt"
        target.write_text("".join(f" {char_line(line)}\n" for line in lines),
                          encoding="utf-8")
        written[split] = target
    return written


def load_char_corpus(data_dir=None):
    """The character-level PTB as a `Corpus` with `level == "char"` (ids in order of first
    appearance over train, valid, test, as at word level)."""
    directory = (pathlib.Path(data_dir).expanduser() if data_dir is not None
                 else default_data_dir())
    if all((directory / CHAR_DIR / f"{s}.txt").is_file()
                                     for s in SPLITS):
        sources = {s: (directory / CHAR_DIR / f"{s}.txt", False) for s in SPLITS}
    else:
        sources = {s: (p, True) for s, p in _word_files(data_dir).items()}
    token_ids, arrays = {}, {}
    for split in SPLITS:
        path, derive = sources[split]
        ids = []
        with open(path, "r", encoding="utf-8") as f:
            for line in f:
                tokens = (char_line(line) if derive else line).split() + [EOS]
                ids.extend(token_ids.setdefault(t, len(token_ids)) for t in tokens)
        arrays[split] = np.asarray(ids, dtype=np.int32)
    corpus = Corpus(Vocabulary(token_ids), name="ptb-char",
                    paths={s: pathlib.Path(p) for s, (p, _) in sources.items()}, **arrays)
    corpus.level = "char"
    return corpus
