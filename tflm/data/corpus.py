"""Word-level corpora (Penn Treebank, WikiText-2, any train/valid/test directory).

Tokenization follows the language-model references exactly: every line of a split file is
split on whitespace and `<eos>` is appended, blank lines included
(`words = line.split() + ["<eos>"]`). Word ids are given in order of first appearance over
train, then valid, then test. `<unk>` is an ordinary word. With this rule the Penn Treebank has
10,000 words and 929,589 / 73,760 / 82,430 tokens; WikiText-2 has 33,278 words and
2,088,628 / 217,646 / 245,569 tokens.

Reference:
    Mikolov et al. 2010 (PTB preprocessing); Merity et al. 2017, "Pointer Sentinel Mixture
    Models" (WikiText); Merity et al. 2018, AWD-LSTM (salesforce/awd-lstm-lm data.py).
"""

import os
import pathlib

import numpy as np

from tflm.data import download as _download
from tflm.data.vocabulary import EOS, Vocabulary, not_utf8_error

SPLITS = ("train", "valid", "test")
_SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "val": "valid",
                  "test": "test"}

_NAMES = {"ptb": "ptb", "penn": "ptb", "penn-treebank": "ptb", "penn_treebank": "ptb",
          "wikitext-2": "wikitext-2", "wikitext2": "wikitext-2", "wt2": "wikitext-2",
          "wikitext-103": "wikitext-103", "wikitext103": "wikitext-103", "wt103": "wikitext-103"}
_TITLES = {"ptb": "Penn Treebank", "wikitext-2": "WikiText-2", "wikitext-103": "WikiText-103"}

# Where each split of a named corpus may live, relative to the data directory, in order.
_LAYOUTS = {
    "ptb": ("penn/{s}.txt", "penn/ptb.{s}.txt", "ptb.{s}.txt"),
    "wikitext-2": ("wikitext-2/{s}.txt", "wikitext-2/wiki.{s}.tokens", "wiki.{s}.tokens"),
    "wikitext-103": ("wikitext-103/{s}.txt", "wikitext-103/wiki.{s}.tokens"),
}
# Named corpora without a built-in download (WikiText-103: 181 MB zipped, 0.5 GB of text).
_GET = {"wikitext-103": "https://s3.amazonaws.com/research.metamind.io/wikitext/"
                        "wikitext-103-v1.zip"}
# File names accepted inside a plain corpus directory.
_DIR_LAYOUT = ("{s}.txt", "ptb.{s}.txt", "wiki.{s}.tokens")
VOCAB_FILE = "vocab.txt"


class CorpusNotFoundError(FileNotFoundError):
    """A corpus split file is missing and could not be downloaded.

    Attributes:
        directory: the directory searched.
        expected: the file paths (relative to `directory`) that would have been accepted.
        urls: the download URLs tried (empty if none).
    """

    def __init__(self, message, directory=None, expected=(), urls=()):
        super().__init__(message)
        self.directory = directory
        self.expected = list(expected)
        self.urls = list(urls)

    def __str__(self):
        return self.args[0]


class Corpus:
    """A tokenized corpus: a vocabulary and up to three 1-D int32 id arrays.

    Args:
        vocabulary: the `Vocabulary` the ids refer to.
        train, valid, test: 1-D integer arrays of token ids, or None for a split that was not
            loaded. Stored as int32.
        name: a short name, e.g. "ptb".
        paths: optional dict split -> file the split was read from.

    Example:

    >>> c = Corpus(Vocabulary(["a", "<eos>"]), train=[0, 1], valid=[0, 1], test=[1], name="toy")
    >>> c.split("valid").tolist(), c.splits
    ([0, 1], ('train', 'valid', 'test'))
    """

    level = "word"  # "char" for a character-level corpus (`tflm.data.characters`)

    def __init__(self, vocabulary, train=None, valid=None, test=None, name="corpus", paths=None):
        self.vocabulary = vocabulary
        self.name = name
        self.paths = dict(paths or {})
        self.train = self._check(train, "train")
        self.valid = self._check(valid, "valid")
        self.test = self._check(test, "test")

    def _check(self, ids, split):
        if ids is None:
            return None
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"Corpus split {split!r} must be a 1-D integer array of token ids, "
                             f"got dtype {ids.dtype} and shape {ids.shape}.")
        ids = ids.astype(np.int32, copy=False)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.vocabulary)):
            raise ValueError(
                f"Corpus split {split!r} has ids in [{ids.min()}, {ids.max()}] but the "
                f"vocabulary has {len(self.vocabulary)} words (ids 0..{len(self.vocabulary) - 1}).")
        return ids

    @property
    def splits(self):
        """Names of the loaded splits, in train/valid/test order."""
        return tuple(s for s in SPLITS if getattr(self, s) is not None)

    def split(self, name):
        """The id array of split `name` ("train", "valid"/"validation"/"val", "test")."""
        key = _SPLIT_ALIASES.get(str(name).lower()) if isinstance(name, str) else None
        if key is None:
            raise ValueError(f"Unknown split {name!r}; use one of {list(SPLITS)}.")
        ids = getattr(self, key)
        if ids is None:
            raise ValueError(
                f"Corpus {self.name!r} has no {key!r} split loaded (it has {list(self.splits)}). "
                f"Provide the {key} file and load the corpus again.")
        return ids

    def __repr__(self):
        sizes = ", ".join(f"{s}={len(getattr(self, s)):,}" for s in self.splits)
        return f"Corpus(name={self.name!r}, vocabulary={len(self.vocabulary):,}, {sizes})"


def default_data_dir():
    """$TFLM_DATA_DIR, else $XDG_CACHE_HOME/tflm/data, else ~/.cache/tflm/data."""
    env = os.environ.get("TFLM_DATA_DIR")
    if env:
        return pathlib.Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(cache).expanduser() if cache else pathlib.Path.home() / ".cache"
    return base / "tflm" / "data"


def read_split(path, word_ids=None, *, add_eos=True, fixed=False):
    """Reads one split file into an int32 id array, growing `word_ids` unless `fixed`.

    Args:
        path: a UTF-8 text file.
        word_ids: dict token -> id, updated in place with new words (first appearance order)
            unless `fixed`. Default: a new dict.
        add_eos: append `<eos>` to every line (blank lines included). Default True.
        fixed: the vocabulary is fixed; an unknown word raises `ValueError`.

    Returns:
        1-D int32 array of ids.

    Raises:
        ValueError: a byte that is not UTF-8, or an unknown word with `fixed`; the message
            names the file and the line.
    """
    if word_ids is None:
        word_ids = {}
    ids = []
    try:
        _read_lines(path, word_ids, ids, add_eos, fixed)
    except UnicodeDecodeError:
        raise not_utf8_error(path) from None
    return np.array(ids, dtype=np.int32)


def _read_lines(path, word_ids, ids, add_eos, fixed):
    """`read_split`'s loop: append the ids of every line of `path` to `ids`."""
    with open(path, "r", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            words = line.split()
            if add_eos:
                words.append(EOS)
            if fixed:
                try:
                    ids.extend([word_ids[w] for w in words])
                except KeyError as error:
                    raise ValueError(
                        f"{path}, line {number}: word {error.args[0]!r} is not in the fixed "
                        f"vocabulary ({len(word_ids)} words). Add it to {VOCAB_FILE} or remove "
                        f"{VOCAB_FILE} to build the vocabulary from the text.") from None
            else:
                setdefault = word_ids.setdefault
                ids.extend([setdefault(w, len(word_ids)) for w in words])


def read_corpus(files, *, name="corpus", vocabulary=None):
    """Builds a `Corpus` from split files.

    Args:
        files: dict split -> path (any subset of train/valid/test).
        name: the corpus name.
        vocabulary: a fixed `Vocabulary`; `<eos>` is appended to lines only if it contains
            `<eos>`. Default None: build it in order of first appearance over train, valid,
            test, appending `<eos>` to every line.

    Returns:
        A `Corpus`.
    """
    fixed = vocabulary is not None
    word_ids = {t: i for i, t in enumerate(vocabulary)} if fixed else {}
    add_eos = (EOS in word_ids) if fixed else True
    arrays = {}
    for split in SPLITS:
        if split in files:
            arrays[split] = read_split(files[split], word_ids, add_eos=add_eos, fixed=fixed)
    if not fixed:
        vocabulary = Vocabulary(word_ids)
    return Corpus(vocabulary, name=name, paths={s: pathlib.Path(p) for s, p in files.items()},
                  **arrays)


def _find(directory, patterns, split):
    for pattern in patterns:
        path = directory / pattern.format(s=split)
        if path.is_file():
            return path
    return None


def check_splits(splits):
    """`splits` as a non-empty tuple of split names (one name may come as a string)."""
    splits = (splits,) if isinstance(splits, str) else tuple(splits)
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise ValueError(f"splits must be a non-empty subset of {SPLITS}, got {splits!r}.")
    return splits


def load_word_corpus(name_or_path, data_dir=None, *, splits=SPLITS, download=True):
    """`tflm.data.load_corpus` for a word-level corpus: "ptb", "wikitext-2", "wikitext-103"
    (and their aliases) or a directory. The arguments, the layouts looked up, the downloads and the
    errors are `load_corpus`'s (see there)."""
    splits = check_splits(splits)
    key = _NAMES.get(name_or_path.lower()) if isinstance(name_or_path, str) else None
    if key is None:
        return _load_directory(pathlib.Path(name_or_path).expanduser(), splits)
    directory = pathlib.Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    files = {s: _find(directory, _LAYOUTS[key], s) for s in SPLITS}
    missing = [s for s in splits if files[s] is None]
    if missing:
        urls = _download.urls_for(key, missing) if download and key not in _GET else []
        reason = "downloading was disabled (download=False)"
        if key in _GET:
            reason = (f"{_TITLES[key]} has no built-in download (get {_GET[key]} and "
                      f"unzip it into {directory})")
        elif download:
            try:
                got = _download.download_corpus(key, directory, missing)
            except _download.DownloadError as error:
                reason = f"the download failed: {error}"
            else:
                files.update(got)
                missing = []
        if missing:
            present = [s for s in SPLITS if files[s] is not None]
            raise _not_found(key, directory, missing, urls, reason, present)
    files = {s: p for s, p in files.items() if p is not None}
    return read_corpus(files, name=key)


def _not_found(key, directory, missing, urls, reason, present):
    layouts = _LAYOUTS[key]
    expected = [p.format(s=s) for s in missing for p in layouts]
    looked = "; ".join(" or ".join(p.format(s=s) for p in layouts) for s in missing)
    sub = layouts[0].split("/")[0]
    tried = (f"Download source: {', '.join(urls)}; {reason}." if urls
             else f"Not downloaded: {reason}.")
    message = (
        f"{_TITLES[key]} ({key}) not found: missing split(s) {', '.join(missing)} in data "
        f"directory {directory}. Looked for {looked}. {tried} To provide the corpus, put "
        f"train.txt, valid.txt and test.txt in {directory / sub}, or set TFLM_DATA_DIR (or pass "
        f"data_dir=) to a directory laid out as <dir>/{sub}/train.txt, <dir>/{sub}/valid.txt, "
        f"<dir>/{sub}/test.txt.")
    if missing == ["train"] and present:
        message += (f" The {', '.join(present)} split(s) are there: to load only those, pass "
                    f"splits={tuple(present)!r} (the vocabulary is then built from them).")
    return CorpusNotFoundError(message, directory=directory, expected=expected, urls=urls)


def _load_directory(directory, splits):
    names = ", ".join(sorted(set(_NAMES) | {"ptb-char", "text8", "lm1b"}))
    if not directory.is_dir():
        raise CorpusNotFoundError(
            f"{str(directory)!r} is neither a known corpus name ({names}) nor a directory. "
            f"Pass a corpus name, or a directory holding train.txt, valid.txt and test.txt.",
            directory=directory, expected=[p.format(s=s) for s in splits for p in _DIR_LAYOUT])
    files = {s: _find(directory, _DIR_LAYOUT, s) for s in SPLITS}
    missing = [s for s in splits if files[s] is None]
    if missing:
        expected = [p.format(s=s) for s in missing for p in _DIR_LAYOUT]
        looked = "; ".join(" or ".join(p.format(s=s) for p in _DIR_LAYOUT) for s in missing)
        hint = ""
        for sub, key in (("penn", "ptb"), ("wikitext-2", "wikitext-2")):
            if (directory / sub).is_dir():
                hint += (f" It has a {sub}/ folder: did you mean "
                         f"load_corpus({key!r}, {str(directory)!r})?")
        raise CorpusNotFoundError(
            f"Corpus directory {directory} is missing split(s) {', '.join(missing)}: looked for "
            f"{looked}. Put the split files there (one sentence per line, tokens separated by "
            f"spaces), or pass splits= to name the splits you have.{hint}",
            directory=directory, expected=expected)
    files = {s: p for s, p in files.items() if p is not None}
    vocab_path = directory / VOCAB_FILE
    vocabulary = Vocabulary.load(vocab_path) if vocab_path.is_file() else None
    return read_corpus(files, name=directory.resolve().name, vocabulary=vocabulary)
