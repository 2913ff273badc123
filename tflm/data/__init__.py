"""Corpora, vocabulary, batching into BPTT windows, and a synthetic high-rank language.

`import tflm.data` does not import TensorFlow; only `lm_dataset` does, when called.
`lm_batches` gives `lm_dataset` on TensorFlow and `WindowSequence` (a `keras.utils.PyDataset`,
no TensorFlow needed) on JAX and PyTorch.

Example:

>>> from tflm import data                                                   # doctest: +SKIP
>>> ptb = data.load_corpus("ptb")                                           # doctest: +SKIP
>>> ds = data.lm_dataset(ptb.train, 20, 70, train=True, seed=141, epoch=None)  # doctest: +SKIP
"""

from tflm.data import download, lm1b, synthetic, zipf  # noqa: F401
from tflm.data.batching import (  # noqa: F401
    PAD_ID,
    batchify,
    covering_length,
    default_pad_to_multiple,
    eval_window_lengths,
    lm_dataset,
    lm_windows,
    num_windows,
    pad_window,
    pad_window_tensors,
    padded_length,
    window_lengths,
    window_starts,
)
from tflm.data.partial_shuffle import partial_shuffle  # noqa: F401
from tflm.data.corpora import load_corpus  # noqa: F401
from tflm.data.corpus import (  # noqa: F401
    Corpus,
    CorpusNotFoundError,
    default_data_dir,
    read_corpus,
)
from tflm.data.download import ChecksumError  # noqa: F401
from tflm.data.synthetic import (  # noqa: F401
    MarkovLanguage,
    markov_language,
    mixture_markov_language,
)
from tflm.data.vocabulary import Vocabulary  # noqa: F401

__all__ = [
    "Vocabulary", "Corpus", "load_corpus", "read_corpus", "default_data_dir",
    "CorpusNotFoundError", "ChecksumError", "batchify", "window_lengths",
    "eval_window_lengths", "window_starts", "lm_windows", "lm_dataset", "num_windows",
    "WindowSequence", "lm_batches",
    "PAD_ID", "default_pad_to_multiple", "pad_window", "pad_window_tensors", "padded_length",
    "MarkovLanguage", "markov_language", "synthetic", "download",
]
from tflm.data.zipf import ZipfLanguage, zipf_language  # noqa: F401
from tflm.data.window_sequence import WindowSequence, lm_batches  # noqa: F401
