"""text8 (Mahoney 2011) as a character-level corpus, with the standard split of Mikolov et
al. 2012: the first 90M characters train, the next 5M valid, the last 5M test.

text8 is the first 10^8 bytes of an English Wikipedia dump (3 March 2006) cleaned by Matt
Mahoney's `wikifil.pl` to lowercase letters `a-z` and single spaces: one line of exactly
100,000,000 characters (no line break, not even at the end), 27 symbols. Yang et al. 2018
(Appendix C.2, Table 12) use it for their "inverse experiment": with 27 symbols the
log-probability matrix has rank at most 27, far below any embedding size, so Softmax has no
bottleneck and MoS should not help (it does not: 1.49 test bpc for both).

Tokens: every character is one token, the space included; the stream is the file read
left to right, the LSTM state carried across word boundaries as at word level. Ids are
fixed, not learnt from the text: 0 is the space, written `_` in the vocabulary (`SPACE`,
as Transformer-XL's `prep_text8.py` writes it, and as `ptb-char` marks a word boundary:
a vocabulary file holds one token per line, so a token cannot be a bare space), 1-26 are
`a`-`z`. So the vocabulary has exactly 27 entries whatever the file holds, and a
miniature file that lacks a letter still trains a 27-way model. There is no `<eos>`: the
file has no lines, and an `<eos>` would never occur as a target; it would only add a 28th
output that the model learns to give probability ~0. (Yang et al.'s Table 12 parameter
count of the Softmax model, 8.42M, is the count with 27 symbols: 8,424,475 for a tied
1024/1024 LSTM; with a 28th symbol it would be 8,425,500 = 8.43M.)

Evaluation: the corpus has `level == "char"`, so `zoo.train` and `zoo.evaluate` report
bits per character, bpc = mean NLL / ln 2 = log2(perplexity), every character (spaces
included) a prediction.

Split (`split_sizes`, default `MIKOLOV2012_SPLIT` = (90M, 5M, 5M)): train = the first
`split_sizes[0]` characters, valid = the next `split_sizes[1]`, test = the last
`split_sizes[2]`; the three must add up to the file's length. (A split that overlaps the
next word is not adjusted: character 90,000,000 begins the validation text whether or not
it begins a word, as in every published text8 split.)

Checks. What is published about the file:
  - `text8.zip` is 31,344,016 bytes (TensorFlow's word2vec tutorial,
    tensorflow/examples/tutorials/word2vec/word2vec_basic.py: `maybe_download('text8.zip',
    31344016)`); its sha1 is 6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e and the unzipped
    `text8`'s sha1 is 0dc3edebc970dcc96137e7deda4d9995af9d93de (GluonNLP's Text8 dataset,
    dmlc/gluon-nlp src/gluonnlp/data/corpora/large_text_compression_benchmark.py);
  - `text8` has 100,000,000 bytes, all of them `a-z` or space (mattmahoney.net/dc/
    textdata.html).
A download is checked against the archive's size and sha1 and the text's sha1 before
anything is written. `load_text8(..., verify=True)` (the default) checks a file found on
disk the same way (its size and sha1: 0.2 s for the 100 MB); `verify=False` skips both, for
a miniature text8 of another length (shortened runs, tests). Whatever `verify` says, every
byte must be `a-z` or space: anything else is refused naming its position. (The checksums
above are the published ones; no machine these modules are developed on reaches
mattmahoney.net, so they were not recomputed here.)

Layout: the data directory (`data_dir`, else `$TFLM_DATA_DIR`, else `~/.cache/tflm/data`)
is searched for, in order, `text8/text8` (where a download is written), `text8` (the file
itself, as `unzip text8.zip` leaves it), then the archives `text8/text8.zip` and
`text8.zip` (unpacked into `text8/text8`, checked as a download is); then the archive is
downloaded from `URL` (31 MB).

Reference: Mahoney 2011, "Large text compression benchmark" (mattmahoney.net/dc/text.html,
textdata.html); Mikolov et al. 2012, "Subword language modeling with neural networks" (the
90M / 5M / 5M split); Yang et al. 2018, "Breaking the Softmax Bottleneck", Appendix C.2 and
Table 12 (seeds/001).
"""

import hashlib
import io
import pathlib
import zipfile

import numpy as np

from tflm.data import download as _download
from tflm.data.corpus import SPLITS, Corpus, CorpusNotFoundError, default_data_dir
from tflm.data.download import ChecksumError, DownloadError
from tflm.data.vocabulary import Vocabulary

NAMES = ("text8",)
URL = "http://mattmahoney.net/dc/text8.zip"
MEMBER = "text8"  # the archive's one file
SUBDIR = "text8"  # <data_dir>/text8/text8: where a download is written
TEXT_SIZE = 100_000_000
ZIP_SIZE = 31_344_016
# (algorithm, hex digest): GluonNLP's Text8 (see the module docstring).
CHECKSUMS = {
    "text8.zip": ("sha1", "6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e"),
    "text8": ("sha1", "0dc3edebc970dcc96137e7deda4d9995af9d93de"),
}
SIZES = {"text8.zip": ZIP_SIZE, "text8": TEXT_SIZE}
MIKOLOV2012_SPLIT = (90_000_000, 5_000_000, 5_000_000)
SPACE = "_"  # the vocabulary's token for the space character
ALPHABET = " abcdefghijklmnopqrstuvwxyz"  # id i is ALPHABET[i]
TOKENS = tuple(SPACE if c == " " else c for c in ALPHABET)

# byte -> id, 255 for a byte outside the alphabet
_LOOKUP = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(ALPHABET):
    _LOOKUP[ord(_c)] = _i
_CHARS = np.frombuffer(ALPHABET.encode("ascii"), dtype=np.uint8)


def vocabulary():
    """The fixed 27-token vocabulary: `_` (the space), then `a` ... `z`."""
    return Vocabulary(TOKENS)


def encode(text):
    """The ids of `text` (a str or bytes of `a-z` and spaces) as an int32 array.

    >>> encode("ab z").tolist()
    [1, 2, 0, 26]
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return _ids(data, "the text")


def decode(ids):
    """The text of `ids` (spaces as spaces): `decode(encode(t)) == t`.

    >>> decode([1, 2, 0, 26])
    'ab z'
    """
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= len(ALPHABET)):
        raise ValueError(f"text8 ids are 0..{len(ALPHABET) - 1}; got ids in "
                         f"[{ids.min()}, {ids.max()}].")
    return _CHARS[ids.astype(np.intp)].tobytes().decode("ascii")


def _ids(data, what):
    """`data` (bytes) as int32 ids; `ValueError` naming the first byte outside the alphabet."""
    raw = np.frombuffer(data, dtype=np.uint8)
    ids = _LOOKUP[raw]
    bad = np.flatnonzero(ids == 255)
    if bad.size:
        at = int(bad[0])
        raise ValueError(
            f"{what}, character {at:,}: byte 0x{raw[at]:02x} ({chr(raw[at])!r}) is not in "
            f"text8's alphabet (a-z and space; {bad.size:,} such byte(s) in all). text8 is "
            f"one line of lowercase letters and single spaces with no line break: use the "
            f"file of {URL} as it unzips, or write a miniature with only those characters.")
    return ids.astype(np.int32)


def _digest(data, algorithm):
    return hashlib.new(algorithm, data).hexdigest()


def verify_text(data, what="text8"):
    """Check `data` (the bytes of a text8 file) against the published size and sha1;
    `ChecksumError` naming what differs."""
    if len(data) != SIZES["text8"]:
        raise ChecksumError(
            f"{what} has {len(data):,} characters; the published text8 has "
            f"{SIZES['text8']:,}: it is truncated, altered or not text8. Delete it and load "
            f"again to download {URL}, or pass verify=False (corpus.verify=false) to use it "
            f"as it is (a miniature for a shortened run) with split_sizes that add up to "
            f"{len(data):,}.")
    algorithm, expected = CHECKSUMS["text8"]
    actual = _digest(data, algorithm)
    if actual != expected:
        raise ChecksumError(
            f"{what}: {algorithm} is {actual}, the published text8's is {expected} "
            f"(GluonNLP's Text8): the file is altered. Delete it and load again to download "
            f"{URL}, or pass verify=False to use it as it is.")
    return True


def verify_archive(archive, what=URL):
    """Check the bytes of `text8.zip` against its published size and sha1 and return the
    unzipped `text8` (checked too); `ChecksumError` naming what differs."""
    if len(archive) != SIZES["text8.zip"]:
        raise ChecksumError(
            f"{what} has {len(archive):,} bytes; the published text8.zip has "
            f"{SIZES['text8.zip']:,} (TensorFlow's word2vec tutorial): the download is "
            f"truncated or the source changed; nothing was written. Retry, or put the "
            f"unzipped text8 into the data directory yourself.")
    _download.verify_checksum(archive, *CHECKSUMS["text8.zip"], what=what)
    data = unzip(archive, what)
    verify_text(data, f"{MEMBER} in {what}")
    return data


def unzip(archive, what=URL):
    """The member `text8` of a zip archive given as bytes."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            names = [n for n in z.namelist() if pathlib.PurePosixPath(n).name == MEMBER]
            if not names:
                raise ChecksumError(f"{what} has no member {MEMBER!r} (it has "
                                    f"{sorted(z.namelist())}); nothing was written.")
            return z.read(names[0])
    except zipfile.BadZipFile as error:
        raise ChecksumError(f"{what} is not a valid zip archive: {error}; nothing was "
                            f"written.") from error


def find_text8(directory):
    """(kind, path) of the first of `text8/text8`, `text8`, `text8/text8.zip`, `text8.zip`
    under `directory` that exists (kind "text" or "zip"), else None."""
    directory = pathlib.Path(directory)
    for kind, path in (("text", directory / SUBDIR / MEMBER), ("text", directory / MEMBER),
                       ("zip", directory / SUBDIR / "text8.zip"),
                       ("zip", directory / "text8.zip")):
        if path.is_file():
            return kind, path
    return None


def download_text8(data_dir, timeout=60.0):
    """Download `URL`, check the archive and the text (size, sha1) and write the text to
    `<data_dir>/text8/text8` atomically; returns that path.

    Raises:
        DownloadError: the fetch or the write failed.
        ChecksumError: the archive or the text differs from the published one (nothing is
            written).
    """
    try:
        archive = _download.fetch_bytes(URL, timeout=timeout)
    except Exception as error:  # network errors come in many types
        raise DownloadError(f"Could not download {URL}: {error}") from error
    data = verify_archive(archive)
    target = pathlib.Path(data_dir) / SUBDIR / MEMBER
    try:
        _download.write_atomic(target, data)
    except OSError as error:
        raise DownloadError(f"Could not write {target}: {error}") from error
    return target


def _split_sizes(sizes, length, path):
    given = sizes
    try:
        sizes = tuple(int(s) for s in given)
        integral = all(not isinstance(s, bool) and float(s) == int(s) for s in given)
    except (TypeError, ValueError):
        sizes, integral = (), False
    if len(sizes) != 3 or not integral or min(sizes) < 1:
        raise ValueError(f"split_sizes must be three positive character counts (train, "
                         f"valid, test), e.g. {list(MIKOLOV2012_SPLIT)}; got {given!r}.")
    if sum(sizes) != length:
        valid = max(1, round(length * MIKOLOV2012_SPLIT[1] / TEXT_SIZE))
        hint = [length - 2 * valid, valid, valid]
        raise ValueError(
            f"split_sizes {list(sizes)} add up to {sum(sizes):,} characters but {path} has "
            f"{length:,}: train, valid and test are consecutive and cover the file. For "
            f"this file, the 90 / 5 / 5 proportions are split_sizes={hint} "
            f"(--set corpus.split_sizes=[{','.join(map(str, hint))}]).")
    return sizes


def load_text8(data_dir=None, *, split_sizes=None, verify=True, download=True, path=None,
               timeout=60.0):
    """text8 as a character-level `Corpus` (`level == "char"`, 27 tokens; module docstring:
    tokens, split, checks, layout).

    Args:
        data_dir: where to look (and download to). Default `$TFLM_DATA_DIR`, else
            `~/.cache/tflm/data`.
        split_sizes: (train, valid, test) character counts, consecutive from the start of
            the file; they must add up to its length. Default `MIKOLOV2012_SPLIT`, (90M, 5M,
            5M).
        verify: check the file's size and sha1 against the published text8 (a download is
            always checked). Default True; False for a miniature text8.
        download: download `URL` when nothing is found. Default True.
        path: a text8 file (or text8.zip, read without unpacking it to disk) to read
            instead of searching `data_dir`.
        timeout: seconds for the download.

    Raises:
        CorpusNotFoundError: nothing found and the download disabled or failed (says where
            to put the file).
        ChecksumError: with `verify`, the file is not the published text8 (or a download is
            corrupt).
        ValueError: a byte outside `a-z` and space, or split sizes that do not cover the file.

    Example:

    >>> corpus = load_text8("/data")                                # doctest: +SKIP
    >>> len(corpus.vocabulary), [len(corpus.split(s)) for s in corpus.splits]  # doctest: +SKIP
    (27, [90000000, 5000000, 5000000])
    """
    directory = (pathlib.Path(data_dir).expanduser() if data_dir is not None
                 else default_data_dir())
    if path is not None:
        path = pathlib.Path(path).expanduser()
        if not path.is_file():
            raise CorpusNotFoundError(f"text8 file {path} does not exist.", directory=path.parent,
                                      expected=[path.name])
        found = ("zip" if path.suffix == ".zip" else "text", path)
    else:
        found = find_text8(directory)
    if found is None:
        found = ("text", _download_or_explain(directory, download, timeout))
        verify = False  # download_text8 has checked it
    kind, source = found
    if kind == "zip":
        archive = source.read_bytes()
        if verify:
            data = verify_archive(archive, str(source))
        else:
            data = unzip(archive, str(source))
        if path is None:  # unpacked into the data directory once: later loads read it
            source = _download.write_atomic(directory / SUBDIR / MEMBER, data)
        verify = False
    else:
        data = source.read_bytes()
    if verify:
        verify_text(data, str(source))
    sizes = _split_sizes(MIKOLOV2012_SPLIT if split_sizes is None else split_sizes,
                         len(data), source)
    ids = _ids(data, str(source))
    del data
    bounds = np.cumsum((0,) + sizes)
    arrays = {split: ids[bounds[i]:bounds[i + 1]] for i, split in enumerate(SPLITS)}
    corpus = Corpus(vocabulary(), name="text8", paths={s: source for s in SPLITS}, **arrays)
    corpus.level = "char"
    return corpus


def _download_or_explain(directory, download, timeout):
    where = (f"Put the unzipped text8 (100,000,000 bytes) at {directory / SUBDIR / MEMBER} "
             f"or {directory / MEMBER} (or text8.zip beside it), or set TFLM_DATA_DIR (or pass "
             f"data_dir=) to the directory that holds it: wget {URL} && unzip text8.zip.")
    if not download:
        reason = "downloading was disabled (download=False)"
    else:
        try:
            return download_text8(directory, timeout)
        except DownloadError as error:
            reason = f"the download failed: {error}"
    raise CorpusNotFoundError(
        f"text8 not found in data directory {directory} and {reason}. {where}",
        directory=directory, expected=[f"{SUBDIR}/{MEMBER}", MEMBER, f"{SUBDIR}/text8.zip",
                                       "text8.zip"], urls=[URL])
