"""The One Billion Word benchmark (Chelba et al. 2013) as Yang et al. 2018 use it: lower-cased,
the 100K most frequent training words, `<eos>` after every sentence, all the rest `<unk>`.

The release `1-billion-word-language-modeling-benchmark-r13output.tar.gz` unpacks to

    1-billion-word-language-modeling-benchmark-r13output/
      training-monolingual.tokenized.shuffled/news.en-00001-of-00100 ... news.en-00099-of-00100
      heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050 ... -00049-of-00050

one tokenized sentence per line. The training set has 99 files: shard 00000 of the 100 was
held out and split into the 50 heldout files (so Yang et al.'s "all of the 100 training
shards" are these 99). Splits (001 App. B.2): train = every training shard, valid =
heldout-00000 and heldout-00010, test = heldout-00020, -00030, -00040
(`YANG2018_HELDOUT`). The usual test set of the benchmark is heldout-00000 alone
(Chelba et al. 2013; Jozefowicz et al. 2016), which Yang et al. validate on: their test
perplexities are on other sentences than most 1B Word results. `heldout=` takes other
shard numbers.

Preprocessing, line by line (as the MoS / AWD-LSTM code reads a corpus, with 001's
lower-casing): `words = line.lower().split() + ["<eos>"]`; the sentences follow each other
in one stream, file by file in name order (shards in numeric order), the LSTM state carried
across sentence ends. Vocabulary: the training tokens (`<eos>` included, one per sentence)
counted, sorted by count (ties by the word, so the order is reproducible), the first
`vocab_size - 1` kept and `<unk>` appended; every other word of any split is `<unk>`. With
the default vocab_size = 100,000 the vocabulary has exactly 100,000 entries (`<eos>` and
`<unk>` among them); the paper's "top 100K tokens" does not say whether it counts the two.

Checksums: no checksum of the unpacked files is published. What is:
  - the archive: 1,792,209,805 bytes, sha256 01ba6038...0a34e (TensorFlow Datasets'
    `url_checksums/lm1b.txt`): `verify_archive(path)` checks a downloaded archive;
  - the number of sentences (lines): 30,301,028 in the training files and 306,688 in the
    50 heldout files (TensorFlow Datasets' lm1b catalog: train / test examples).
`load_lm1b(..., verify=True)` checks both line counts on the unpacked files (it reads every
training line anyway; the heldout files are 1 % more), so a truncated or altered copy is
refused, naming what differs.

Memory: the training split is ~0.83 B tokens (0.80 B words + 30.3 M `<eos>`): 3.3 GB as
int32 ids. The text is never held whole: the shards are read in blocks of lines, twice
(count, then encode into an array allocated once at its final size), so the peak is the id
array plus the word counts (a dict of the ~2.4 M lower-cased word types, ~0.3 GB) plus one
block. With `cache_dir` the ids are written there as .npy files (with the vocabulary and a
manifest of the shards' sizes) and later loads map them from disk (`mmap_mode="r"`): no
resident copy, no second pass over the text. Count on ~4 GB of memory for the first load
and 3.3 GB of disk for the cache.

Reference: Chelba et al. 2013, "One Billion Word Benchmark for Measuring Progress in
Statistical Language Modeling"; Yang et al. 2018 §3.1 and Appendix B.2 (seeds/001).
"""

import collections
import hashlib
import json
import os
import pathlib

import numpy as np

from tflm.data.corpus import Corpus, CorpusNotFoundError
from tflm.data.download import ChecksumError
from tflm.data.vocabulary import EOS, UNK, Vocabulary

NAMES = ("lm1b", "1b", "1b-word", "one-billion-word", "billion-word")
ROOT = "1-billion-word-language-modeling-benchmark-r13output"
TRAIN_DIR = "training-monolingual.tokenized.shuffled"
HELDOUT_DIR = "heldout-monolingual.tokenized.shuffled"
TRAIN_SHARDS = tuple(f"news.en-{i:05d}-of-00100" for i in range(1, 100))
HELDOUT_SHARDS = tuple(f"news.en.heldout-{i:05d}-of-00050" for i in range(50))
YANG2018_HELDOUT = {"valid": (0, 10), "test": (20, 30, 40)}
URL = ("http://www.statmt.org/lm-benchmark/"
       "1-billion-word-language-modeling-benchmark-r13output.tar.gz")
ARCHIVE_SIZE = 1_792_209_805
ARCHIVE_SHA256 = "01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e"
TRAIN_LINES = 30_301_028
HELDOUT_LINES = 306_688
BLOCK_LINES = 100_000  # lines read and encoded at a time


def _get_help(root):
    return (f"Get the corpus with: wget {URL} && tar xzf "
            f"{URL.rsplit('/', 1)[1]} -C {root.parent} (1.8 GB; 4.2 GB unpacked); "
            f"verify the archive with tflm.data.lm1b.verify_archive(PATH).")


def shard_paths(root, heldout=None):
    """{"train": [99 paths], "valid": [...], "test": [...]} under the release's folder
    `root` (`heldout`: {"valid": shard numbers, "test": shard numbers}, default Yang's)."""
    root = pathlib.Path(root)
    heldout = YANG2018_HELDOUT if heldout is None else heldout
    paths = {"train": [root / TRAIN_DIR / name for name in TRAIN_SHARDS]}
    for split in ("valid", "test"):
        numbers = [int(n) for n in heldout[split]]
        bad = [n for n in numbers if not 0 <= n < 50]
        if bad or not numbers:
            raise ValueError(f"heldout[{split!r}] must list heldout shard numbers in 0..49; "
                             f"got {list(heldout[split])!r}.")
        paths[split] = [root / HELDOUT_DIR / HELDOUT_SHARDS[n] for n in numbers]
    return paths


def check_layout(root, heldout=None, all_heldout=False):
    """The shard paths, after checking that every file is there: `CorpusNotFoundError`
    naming the folder, what is missing and where to get the corpus otherwise."""
    root = pathlib.Path(root)
    if not root.is_dir():
        raise CorpusNotFoundError(
            f"1B Word benchmark not found: {root} is not a directory. Expected the unpacked "
            f"release {ROOT}/ with {TRAIN_DIR}/ (99 files news.en-000NN-of-00100) and "
            f"{HELDOUT_DIR}/ (50 files news.en.heldout-000NN-of-00050). {_get_help(root)}",
            directory=root, expected=[ROOT])
    paths = shard_paths(root, heldout)
    wanted = [p for split in paths.values() for p in split]
    if all_heldout:
        wanted += [root / HELDOUT_DIR / n for n in HELDOUT_SHARDS]
    missing = sorted({p for p in wanted if not p.is_file()})
    if missing:
        shown = ", ".join(str(p.relative_to(root)) for p in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CorpusNotFoundError(
            f"1B Word benchmark in {root} is incomplete: {len(missing)} shard file(s) "
            f"missing ({shown}{more}). Every one of the 99 training files and the heldout "
            f"files of the splits must be there. {_get_help(root)}",
            directory=root, expected=[str(p.relative_to(root)) for p in missing])
    return paths


def verify_archive(path, chunk=1 << 24):
    """Check the downloaded archive against its published size and sha256 (TensorFlow
    Datasets); `ChecksumError` naming what differs."""
    path = pathlib.Path(path)
    size = path.stat().st_size
    if size != ARCHIVE_SIZE:
        raise ChecksumError(f"{path} has {size:,} bytes; the published archive has "
                            f"{ARCHIVE_SIZE:,}: download it again from {URL}.")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    if digest.hexdigest() != ARCHIVE_SHA256:
        raise ChecksumError(f"{path}: sha256 {digest.hexdigest()}, published "
                            f"{ARCHIVE_SHA256}: the archive is corrupt; download it again.")
    return True


def _blocks(path):
    """The lower-cased words of each line of `path` with `<eos>` appended, BLOCK_LINES lines
    at a time: (list of words, number of lines)."""
    with open(path, "r", encoding="utf-8") as f:
        while True:
            lines = [line for _, line in zip(range(BLOCK_LINES), f)]
            if not lines:
                return
            words = []
            for line in lines:
                words.extend(line.lower().split())
                words.append(EOS)
            yield words, len(lines)


def count_words(paths):
    """(Counter of lower-cased tokens with `<eos>`, number of lines) over `paths`."""
    counts, lines = collections.Counter(), 0
    for path in paths:
        for words, n in _blocks(path):
            counts.update(words)
            lines += n
    return counts, lines


def count_lines(paths):
    """Number of lines of the files `paths` (read in binary)."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
    return total


def top_vocabulary(counts, vocab_size):
    """The `vocab_size - 1` most frequent tokens (count descending, then the word) and
    `<unk>` last (unless `<unk>` is itself among them: then `vocab_size` tokens)."""
    vocab_size = int(vocab_size)
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2 (a word and <unk>); got {vocab_size}.")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    tokens = [w for w, _ in ranked[:vocab_size - 1]]
    if UNK not in tokens:
        tokens.append(UNK)
    elif len(ranked) >= vocab_size:
        tokens.append(ranked[vocab_size - 1][0])
    return Vocabulary(tokens)


def encode(paths, vocabulary, out=None):
    """The ids of `paths`' tokens (unknown words -> `<unk>`) as one int32 array, written into
    `out` (an array of exactly the right length) when given."""
    index = {w: i for i, w in enumerate(vocabulary)}
    unk = index[UNK]
    chunks, at = [], 0
    for path in paths:
        for words, _ in _blocks(path):
            ids = np.fromiter((index.get(w, unk) for w in words), dtype=np.int32,
                              count=len(words))
            if out is None:
                chunks.append(ids)
            else:
                out[at:at + len(ids)] = ids
            at += len(ids)
    if out is None:
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
    if at != len(out):
        raise ValueError(f"encoded {at} tokens into an array of {len(out)}: the files "
                         "changed while they were read.")
    return out


def _manifest(paths, vocab_size):
    return {"vocab_size": int(vocab_size), "version": 1,
            "files": {split: [[p.name, p.stat().st_size] for p in files]
                      for split, files in paths.items()}}


def _read_cache(cache, manifest):
    try:
        if json.loads((cache / "manifest.json").read_text()) != manifest:
            return None
        vocabulary = Vocabulary.load(cache / "vocab.txt")
        arrays = {s: np.load(cache / f"{s}.npy", mmap_mode="r") for s in manifest["files"]}
    except (OSError, ValueError):
        return None
    return vocabulary, arrays


def load_lm1b(root, vocab_size=100_000, heldout=None, verify=True, cache_dir=None):
    """The 1B Word benchmark as a `Corpus` (module docstring: splits, preprocessing,
    vocabulary, checks, memory).

    Args:
        root: the unpacked release folder (`.../1-billion-word-language-modeling-benchmark-
            r13output`).
        vocab_size: entries of the vocabulary, `<unk>` included. Default 100,000.
        heldout: {"valid": shard numbers, "test": shard numbers}; default
            `YANG2018_HELDOUT` (valid 00, 10; test 20, 30, 40).
        verify: check the published line counts of the training and heldout files.
        cache_dir: where to keep the encoded splits (.npy), the vocabulary and a manifest of
            the shards' sizes; a later load with the same shards and vocab_size maps them
            from disk. Default None: no cache.

    Raises:
        CorpusNotFoundError: the folder or a shard is missing (says where to get them).
        ChecksumError: with `verify`, a line count differs from the published one.
    """
    root = pathlib.Path(root).expanduser()
    paths = check_layout(root, heldout, all_heldout=verify)
    manifest = _manifest(paths, vocab_size)
    cache = None if cache_dir is None else pathlib.Path(cache_dir).expanduser()
    found = _read_cache(cache, manifest) if cache is not None else None
    if found is not None:
        vocabulary, arrays = found
        return Corpus(vocabulary, name="lm1b", paths={s: p[0] for s, p in paths.items()},
                      **arrays)
    counts, lines = count_words(paths["train"])
    if verify:
        heldout_lines = count_lines([root / HELDOUT_DIR / n for n in HELDOUT_SHARDS])
        for what, got, published in (("training", lines, TRAIN_LINES),
                                     ("heldout", heldout_lines, HELDOUT_LINES)):
            if got != published:
                raise ChecksumError(
                    f"the {what} files in {root} have {got:,} lines; the release has "
                    f"{published:,} (TensorFlow Datasets' lm1b): the copy is incomplete or "
                    f"altered. {_get_help(root)} (verify=False skips this check.)")
    vocabulary = top_vocabulary(counts, vocab_size)
    train_tokens = sum(counts.values())
    del counts
    arrays = {}
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        vocabulary.save(cache / "vocab.txt")
        out = np.lib.format.open_memmap(cache / "train.npy.part", mode="w+", dtype=np.int32,
                                        shape=(train_tokens,))
        encode(paths["train"], vocabulary, out)
        out.flush()
        del out
        os.replace(cache / "train.npy.part", cache / "train.npy")
        for split in ("valid", "test"):
            np.save(cache / f"{split}.npy", encode(paths[split], vocabulary))
        (cache / "manifest.json").write_text(json.dumps(manifest))
        arrays = {s: np.load(cache / f"{s}.npy", mmap_mode="r") for s in paths}
    else:
        arrays["train"] = encode(paths["train"], vocabulary,
                                 np.empty(train_tokens, dtype=np.int32))
        for split in ("valid", "test"):
            arrays[split] = encode(paths[split], vocabulary)
    return Corpus(vocabulary, name="lm1b", paths={s: p[0] for s, p in paths.items()},
                  **arrays)
