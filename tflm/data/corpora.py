"""Every corpus by name or directory, at both levels: `load_corpus`.

Word-level corpora (PTB, WikiText-2, a directory) are `tflm.data.corpus`'s; the
character-level PTB, derived from the word-level files, is `tflm.data.characters`'s; text8
(characters, Mikolov's 90M / 5M / 5M split) is `tflm.data.text8`'s.
"""

from tflm.data import characters, text8
from tflm.data.corpus import SPLITS, check_splits, load_word_corpus


def load_corpus(name_or_path, data_dir=None, *, splits=SPLITS, download=True):
    """Loads a corpus by name or from a directory.

    Names: "ptb" (aliases "penn", "penn-treebank"), "wikitext-2" ("wt2") and "ptb-char"
    (character-level PTB: `tflm.data.characters`, derived from the word-level files when
    `pennchar/` is absent; its corpus has `level == "char"`) and "text8" (`tflm.data.text8`:
    27 characters, no `<eos>`, the standard 90M / 5M / 5M split, `level == "char"`; for its
    options, `verify=False` and `split_sizes=` for a miniature, call
    `tflm.data.text8.load_text8`). They are looked
    up in the data directory (`data_dir`, else `$TFLM_DATA_DIR`, else `$XDG_CACHE_HOME/tflm/data`
    or `~/.cache/tflm/data`) under any of these layouts, per split:

        PTB:         penn/train.txt, penn/ptb.train.txt, ptb.train.txt
        WikiText-2:  wikitext-2/train.txt, wikitext-2/wiki.train.tokens, wiki.train.tokens
        WikiText-103 ("wikitext-103", "wt103"): wikitext-103/train.txt,
                     wikitext-103/wiki.train.tokens (never downloaded: 181 MB zipped;
                     unzip wikitext-103-v1.zip into the data directory)

    A missing required split is downloaded from its public source into
    `<data_dir>/penn/` or `<data_dir>/wikitext-2/` (checksum verified, written atomically);
    if that fails, `CorpusNotFoundError` says where to put the files.

    Anything else is a directory holding `train.txt`, `valid.txt`, `test.txt` (or the
    `ptb.*.txt` / `wiki.*.tokens` names). If that directory has a `vocab.txt` (one token per
    line, as written by `Vocabulary.save`), the vocabulary is fixed to it: ids follow the file,
    an unknown word is an error, and `<eos>` is appended to lines only if `vocab.txt` contains
    `<eos>` (this is how `tflm.data.synthetic` writes corpora that round-trip exactly). Known
    names take precedence; write "./ptb" for a directory called "ptb".

    Args:
        name_or_path: a corpus name or a directory path.
        data_dir: data directory for names (ignored for a path). Default: see above.
        splits: the splits that must be present. Other splits are loaded too when their
            files exist (so ids always match the full vocabulary), otherwise left None.
            E.g. `splits=("valid", "test")` loads WikiText-2 without its training file.
            Default: all three.
        download: try to download missing required splits of a named corpus. Default True.

    Returns:
        A `Corpus`.

    Raises:
        CorpusNotFoundError: required files are missing and could not be downloaded.
        tflm.data.download.ChecksumError: a downloaded file had the wrong checksum.

    Example:

    >>> ptb = load_corpus("ptb", "/data")                       # doctest: +SKIP
    >>> len(ptb.vocabulary), len(ptb.train)                     # doctest: +SKIP
    (10000, 929589)
    """
    splits = check_splits(splits)
    if isinstance(name_or_path, str) and name_or_path.lower() in characters.NAMES:
        return characters.load_char_corpus(data_dir)
    if isinstance(name_or_path, str) and name_or_path.lower() in text8.NAMES:
        return text8.load_text8(data_dir, download=download)
    return load_word_corpus(name_or_path, data_dir, splits=splits, download=download)
