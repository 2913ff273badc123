"""Vocabulary: a fixed, ordered mapping between word tokens and integer ids."""

import os

import numpy as np

UNK = "<unk>"
EOS = "<eos>"


def not_utf8_error(path):
    """A `ValueError` naming the file, line and column of the first byte of `path` that is
    not UTF-8 (for a `UnicodeDecodeError`, whose offset counts from the decoded chunk, not
    from the start of the file)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        return ValueError(f"{path}, line {line}, column {column}: byte "
                          f"0x{raw[error.start]:02x} is not UTF-8 ({error.reason}); corpus "
                          "and vocabulary files must be UTF-8 text.")
    return ValueError(f"{path} is not UTF-8 text; corpus and vocabulary files must be.")


class Vocabulary:
    """An ordered word <-> id mapping; ids are positions in `tokens`.

    The language-model references number words in order of first appearance
    (train, then valid, then test), so `Vocabulary.from_sequences` does exactly that.
    `<unk>` and `<eos>` are ordinary tokens: they get an id where they first appear.

    Args:
        tokens: iterable of distinct strings, in id order. Default: empty.

    Example:

    >>> vocab = Vocabulary.from_sequences([["a", "b", "<eos>"], ["b", "c", "<eos>"]])
    >>> vocab.tokens
    ['a', 'b', '<eos>', 'c']
    >>> vocab.token_to_id("c"), vocab.id_to_token(1), len(vocab)
    (3, 'b', 4)

    Reference:
        Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models"
        (salesforce/awd-lstm-lm, data.py: Dictionary).
    """

    def __init__(self, tokens=()):
        self._tokens = []
        self._ids = {}
        for token in tokens:
            if token in self._ids:
                raise ValueError(
                    f"Vocabulary tokens must be distinct, but {token!r} appears twice "
                    f"(ids {self._ids[token]} and {len(self._tokens)}). Remove the duplicate.")
            self.add(token)

    @classmethod
    def from_sequences(cls, sequences):
        """Builds a vocabulary from token sequences, in order of first appearance.

        Args:
            sequences: iterable of iterables of string tokens.

        Returns:
            A `Vocabulary`.
        """
        vocab = cls()
        for sequence in sequences:
            for token in sequence:
                vocab.add(token)
        return vocab

    def add(self, token):
        """Adds `token` if new and returns its id."""
        if not isinstance(token, str) or not token:
            raise TypeError(f"Vocabulary tokens must be non-empty strings, got {token!r}.")
        index = self._ids.get(token)
        if index is None:
            index = len(self._tokens)
            self._ids[token] = index
            self._tokens.append(token)
        return index

    @property
    def tokens(self):
        """The tokens in id order (a copy)."""
        return list(self._tokens)

    def __len__(self):
        return len(self._tokens)

    def __iter__(self):
        return iter(self._tokens)

    def __contains__(self, token):
        return token in self._ids

    def __eq__(self, other):
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._tokens == other._tokens

    __hash__ = None  # mutable (see `add`), so not hashable

    def __repr__(self):
        head = ", ".join(repr(t) for t in self._tokens[:5])
        more = ", ..." if len(self._tokens) > 5 else ""
        return f"Vocabulary(size={len(self)}, tokens=[{head}{more}])"

    def token_to_id(self, token):
        """The id of `token`; raises `KeyError` with an explanation if it is unknown."""
        index = self._ids.get(token)
        if index is None:
            if UNK in self._ids:
                hint = (f"The vocabulary has {UNK!r} (id {self._ids[UNK]}); map "
                        f"out-of-vocabulary words to it before looking them up.")
            else:
                hint = (f"The vocabulary has no {UNK!r} token either, so out-of-vocabulary "
                        f"words cannot be represented; rebuild it from text that contains them.")
            raise KeyError(
                f"The vocabulary ({len(self)} words) has no such word: {token!r}. {hint}")
        return index

    def id_to_token(self, index):
        """The token with id `index`; raises `IndexError` if out of range."""
        index = int(index)
        if not 0 <= index < len(self._tokens):
            raise IndexError(
                f"Token id {index} is out of range for a vocabulary of {len(self)} words "
                f"(valid ids are 0..{len(self) - 1}).")
        return self._tokens[index]

    def encode(self, tokens):
        """Maps a sequence of tokens to an int32 array of ids."""
        return np.array([self.token_to_id(t) for t in tokens], dtype=np.int32)

    def decode(self, ids):
        """Maps a sequence of ids to a list of tokens."""
        return [self.id_to_token(i) for i in np.asarray(ids).reshape(-1)]

    def save(self, path):
        """Writes one token per line (UTF-8, `\\n` line ends), in id order."""
        for token in self._tokens:
            if "\n" in token or "\r" in token:
                raise ValueError(
                    f"Cannot save token {token!r}: it contains a line break and the file "
                    f"format is one token per line.")
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for token in self._tokens:
                f.write(token + "\n")

    @classmethod
    def load(cls, path):
        """Reads a file written by `save` (one token per line, UTF-8)."""
        path = os.fspath(path)
        try:
            with open(path, "r", encoding="utf-8", newline="") as f:
                lines = f.read().split("\n")
        except UnicodeDecodeError:
            raise not_utf8_error(path) from None
        if lines and lines[-1] == "":
            lines.pop()
        tokens = []
        for number, line in enumerate(lines, start=1):
            line = line.rstrip("\r")
            if not line:
                raise ValueError(
                    f"{path}, line {number}: empty line. A vocabulary file holds exactly one "
                    f"non-empty token per line.")
            tokens.append(line)
        return cls(tokens)
