"""A Zipfian stand-in for large-vocabulary corpora (the 1B Word benchmark's 100K words)."""

import numpy as np

from tflm.data.synthetic import corpus_of_one_sample
from tflm.data.vocabulary import Vocabulary


class ZipfLanguage:
    """Independent words with Zipf's law over a vocabulary of V words:

        P(w_r) = r^-s / sum_{j=1}^V j^-s,   r = id + 1 (id 0 is the most frequent word)

    Word frequencies of natural text follow it with s close to 1, so a sample has the
    long tail a 100K-word vocabulary has (most words rare, a few very frequent) without the
    corpus: for throughput and memory benchmarks of large-vocabulary training (sampled vs
    full softmax) and for tests of the training machinery at V = 100,000. The words are
    independent, so no context helps: the optimal perplexity is exp(H(P)), reported as
    `optimal_perplexity`, and a model can at best learn the unigram distribution.

    Args:
        vocab_size: V. Default 100,000 (001 App. B.2's 1B Word vocabulary).
        exponent: s > 0. Default 1.0.
        seed: seed of the samples `to_corpus` draws by default.
    """

    def __init__(self, vocab_size=100_000, exponent=1.0, seed=0):
        if int(vocab_size) != vocab_size or int(vocab_size) < 2:
            raise ValueError(f"ZipfLanguage: vocab_size must be an integer >= 2; got "
                             f"{vocab_size!r}.")
        if not float(exponent) > 0:
            raise ValueError(f"ZipfLanguage: exponent must be > 0; got {exponent!r}.")
        self.vocab_size, self.exponent, self.seed = int(vocab_size), float(exponent), int(seed)
        weights = np.arange(1, self.vocab_size + 1, dtype=np.float64) ** -self.exponent
        self.probabilities = weights / weights.sum()

    @property
    def name(self):
        return f"zipf-{self.vocab_size}-s{self.exponent:g}"

    @property
    def optimal_perplexity(self):
        """exp(-sum_w P(w) log P(w)): the perplexity of the true unigram distribution."""
        p = self.probabilities
        return float(np.exp(-np.sum(p * np.log(p))))

    def vocabulary(self):
        """"w0".."w{V-1}" in id order (id = frequency rank - 1)."""
        return Vocabulary(f"w{i}" for i in range(self.vocab_size))

    def sample(self, num_tokens, seed=0):
        """`num_tokens` independent ids, int32."""
        rng = np.random.default_rng(seed)
        return rng.choice(self.vocab_size, size=int(num_tokens),
                          p=self.probabilities).astype(np.int32)

    def to_corpus(self, train_tokens=1_000_000, valid_tokens=100_000, test_tokens=100_000,
                  seed=None):
        """A `Corpus` of one sample cut into train, valid and test (as
        `MarkovLanguage.to_corpus`), carrying `optimal_perplexity`."""
        return corpus_of_one_sample(self, (train_tokens, valid_tokens, test_tokens),
                                    self.seed if seed is None else seed)


def zipf_language(vocab_size=100_000, exponent=1.0, seed=0):
    """`ZipfLanguage(vocab_size, exponent, seed)`."""
    return ZipfLanguage(vocab_size, exponent, seed)
