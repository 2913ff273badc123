"""A synthetic high-rank language: a first-order Markov chain with a full-rank log-probability
matrix, for testing the softmax bottleneck where the optimum is known.

The next word depends only on the previous word:

    log P(w_t = j | w_{t-1} = i) = log_softmax(G / temperature)[i, j],  G_ij ~ N(0, 1) i.i.d.

G is full rank almost surely, so the true log-probability matrix A (V x V) has rank V, while a
softmax head of dimension d can only produce log-probability matrices of rank <= d + 1. The
Bayes-optimal perplexity is exp(entropy rate), known exactly. With the default temperature
0.5 the optimum is about 0.15-0.2 V for V = 100..1000 (e.g. V = 1000: 149), while the
renormalized rank-16 truncation of A only reaches about 0.55-0.9 V.

Reference:
    Yang et al. 2018, "Breaking the Softmax Bottleneck: A High-Rank RNN Language Model" (ICLR),
    §2 (the log-probability matrix A and its rank).
"""

import functools
import json
import math
import pathlib

import numpy as np

from tflm.data.corpus import Corpus
from tflm.data.vocabulary import Vocabulary

DEFAULT_TEMPERATURE = 0.5


def _log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    shifted = x - m
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


class MarkovLanguage:
    """A first-order Markov language given by its log-transition matrix.

    Args:
        log_probs: (V, V) array, row i = log P(next | previous = i); rows must logsumexp
            to 0 (within 1e-8).
        temperature: recorded for naming (None for a user matrix). Default None.
        seed: recorded for naming / determinism (None for a user matrix). Default None.

    Attributes:
        vocab_size: V.
        true_log_probs: (V, V) float64 log-transition matrix.
        stationary: (V,) float64 stationary distribution pi (pi P = pi, sums to 1).
        entropy_rate: -sum_i pi_i sum_j P_ij log P_ij, in nats.
        optimal_perplexity: exp(entropy_rate), the best perplexity any model can reach.
        true_rank: numerical rank of `true_log_probs` (numpy.linalg.matrix_rank).

    Example:

    >>> lang = markov_language(64, seed=0)
    >>> ids = lang.sample(100_000, seed=1)
    >>> abs(lang.empirical_perplexity(ids) / lang.optimal_perplexity - 1) < 0.05
    True
    """

    def __init__(self, log_probs, temperature=None, seed=None, kind="markov"):
        self.kind = str(kind)
        log_probs = np.array(log_probs, dtype=np.float64)
        if log_probs.ndim != 2 or log_probs.shape[0] != log_probs.shape[1] or not log_probs.size:
            raise ValueError(f"log_probs must be a square (V, V) matrix, got shape "
                             f"{log_probs.shape}.")
        if np.isnan(log_probs).any() or np.isposinf(log_probs).any():
            raise ValueError("log_probs contains NaN or +inf.")
        m = log_probs.max(axis=1)
        lse = m + np.log(np.exp(log_probs - m[:, None]).sum(axis=1))
        worst = float(np.abs(lse).max())
        if worst > 1e-8:
            raise ValueError(f"Each row of log_probs must logsumexp to 0 (a distribution over "
                             f"the next word); the worst row is off by {worst:.3g}. Apply a "
                             f"row-wise log_softmax first.")
        self.true_log_probs = log_probs
        self.vocab_size = log_probs.shape[0]
        self.temperature = temperature
        self.seed = seed
        self.transition = np.exp(log_probs)
        self.stationary = _stationary(self.transition)
        plogp = np.where(self.transition > 0, self.transition * log_probs, 0.0)
        self.entropy_rate = float(-(self.stationary @ plogp.sum(axis=1)))
        self.optimal_perplexity = math.exp(self.entropy_rate)

    def __repr__(self):
        return (f"MarkovLanguage(vocab_size={self.vocab_size}, temperature={self.temperature}, "
                f"seed={self.seed}, optimal_perplexity={self.optimal_perplexity:.3f})")

    @property
    def name(self):
        """"synthetic-{kind}-V{V}-T{temperature}" (kind: markov or mixture-K{K}-r{r})."""
        temp = "custom" if self.temperature is None else f"{self.temperature:g}"
        return f"synthetic-{self.kind}-V{self.vocab_size}-T{temp}"

    @functools.cached_property
    def true_rank(self):
        return int(np.linalg.matrix_rank(self.true_log_probs))

    @functools.cached_property
    def _sampling_tables(self):
        """Flat cumulative rows and a guide table (Chen & Asau 1974) into them.

        `cum[i * V + j] = P(next <= j | i)` (last entry of each row set to 1.0) and
        `guide[i * V + k]` = flat index of the first j with `cum[i, j] > (k - 1) / V`, a safe
        place to start the linear search for any u with `int(u * V) == k`.
        """
        v = self.vocab_size
        cum = np.cumsum(self.transition, axis=1)
        cum[:, -1] = 1.0  # u < 1 always lands inside the row
        rows = np.arange(v)[:, None]
        offset = (cum + rows).ravel()  # increasing over the flat index
        queries = (rows + np.maximum(np.arange(v) - 1, 0)[None, :] / v).ravel()
        guide = np.searchsorted(offset, queries, side="right").astype(np.int64)
        return cum.ravel(), guide

    def sample(self, num_tokens, seed=0):
        """Samples `num_tokens` consecutive words of the chain, starting from `stationary`.

        Each step draws u ~ U[0, 1) and takes the first word whose cumulative row
        probability exceeds u (inverse CDF; a guide table makes the search O(1) on average).
        Exact; under a second per million tokens.

        Args:
            num_tokens: length of the sample.
            seed: integer seed of the sample. Default 0.

        Returns:
            int32 array of shape (num_tokens,).
        """
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) \
                or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}.")
        num_tokens = int(num_tokens)
        if num_tokens == 0:
            return np.zeros(0, dtype=np.int32)
        v = self.vocab_size
        rng = np.random.default_rng(seed)
        start_cdf = np.cumsum(self.stationary)
        state = int(min(np.searchsorted(start_cdf, rng.random() * start_cdf[-1], side="right"),
                        v - 1))
        uniforms = rng.random(num_tokens - 1)
        buckets = np.minimum((uniforms * v).astype(np.int64), v - 1).tolist()
        cum_table, guide_table = self._sampling_tables
        cum, guide = memoryview(cum_table), memoryview(guide_table)  # fast scalar reads
        out = [state]
        append = out.append
        base = state * v
        for u, k in zip(uniforms.tolist(), buckets):
            j = guide[base + k]
            while cum[j] <= u:
                j += 1
            state = j - base
            append(state)
            base = state * v
        return np.array(out, dtype=np.int32)

    def empirical_perplexity(self, ids):
        """exp(mean over t of -log P(ids[t] | ids[t-1])): the Bayes-optimal perplexity on `ids`."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) < 2:
            raise ValueError(f"ids must be a 1-D sequence of at least 2 tokens, got shape "
                             f"{ids.shape}.")
        return float(np.exp(-self.true_log_probs[ids[:-1], ids[1:]].mean()))

    def low_rank_perplexity(self, rank):
        """Perplexity of the renormalized best rank-`rank` (SVD) approximation of the matrix.

        Rule: A_r = SVD truncation of `true_log_probs`; Q = log_softmax(A_r) row-wise;
        returns exp(-sum_i pi_i sum_j P_ij Q_ij). A softmax head of dimension `rank` can
        represent Q exactly, so this is an achievable (not the best) perplexity at that rank:
        a gap to `optimal_perplexity` shows what the bottleneck costs.
        """
        if not 1 <= int(rank) <= self.vocab_size:
            raise ValueError(f"rank must be in [1, {self.vocab_size}], got {rank!r}.")
        u, s, vt = self._svd
        approx = _log_softmax((u[:, :rank] * s[:rank]) @ vt[:rank])
        cross = -(self.stationary @ (self.transition * approx).sum(axis=1))
        return float(np.exp(cross))

    @functools.cached_property
    def _svd(self):
        return np.linalg.svd(self.true_log_probs)

    def vocabulary(self):
        """The vocabulary "w0".."w{V-1}" in id order (ids equal Markov states)."""
        return Vocabulary(f"w{i}" for i in range(self.vocab_size))

    def to_corpus(self, train_tokens=1_000_000, valid_tokens=100_000, test_tokens=100_000,
                  seed=0):
        """A `Corpus` of one sample of the chain, cut into train, valid and test.

        The three splits are consecutive pieces of a single sample of length
        train + valid + test (seeded by `seed`). The vocabulary is "w0".."w{V-1}" in id
        order, so ids equal the Markov states (no `<eos>`, no first-appearance reordering).
        The corpus also carries `optimal_perplexity` and `language` (this object).

        Args:
            train_tokens, valid_tokens, test_tokens: split lengths. Defaults 1,000,000,
                100,000, 100,000.
            seed: sample seed. Default 0.

        Returns:
            A `Corpus` named `self.name`.
        """
        return corpus_of_one_sample(self, (train_tokens, valid_tokens, test_tokens), seed)

    def write(self, directory, train_tokens=1_000_000, valid_tokens=100_000,
              test_tokens=100_000, seed=0, line_length=20):
        """Writes `to_corpus(...)` as text that `load_corpus(directory)` reads back exactly.

        Files: `train.txt`, `valid.txt`, `test.txt` (`line_length` words per line),
        `vocab.txt` ("w0".."w{V-1}", no `<eos>`) and `language.json` (parameters and
        optimal perplexity). Because `vocab.txt` has no `<eos>`, `load_corpus` appends no
        `<eos>` and uses these ids, so the loaded corpus equals `to_corpus(...)`.

        Returns:
            The directory as a `pathlib.Path`.
        """
        line_length = int(line_length)
        if line_length < 1:
            raise ValueError(f"line_length must be >= 1, got {line_length}.")
        corpus = self.to_corpus(train_tokens, valid_tokens, test_tokens, seed=seed)
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        corpus.vocabulary.save(directory / "vocab.txt")
        words = np.array(corpus.vocabulary.tokens, dtype=object)
        for split in ("train", "valid", "test"):
            ids = corpus.split(split)
            lines = (" ".join(words[ids[i:i + line_length]])
                     for i in range(0, len(ids), line_length))
            with open(directory / f"{split}.txt", "w", encoding="utf-8", newline="\n") as f:
                f.write("\n".join(lines) + "\n")
        meta = {"name": self.name, "vocab_size": self.vocab_size,
                "temperature": self.temperature, "language_seed": self.seed,
                "sample_seed": seed, "tokens": {"train": int(train_tokens),
                                                "valid": int(valid_tokens),
                                                "test": int(test_tokens)},
                "entropy_rate": self.entropy_rate,
                "optimal_perplexity": self.optimal_perplexity}
        (directory / "language.json").write_text(json.dumps(meta, indent=2) + "\n")
        return directory


def corpus_of_one_sample(language, sizes, seed):
    """A `Corpus` of one sample of `language` (its `sample`, `vocabulary`, `name` and
    `optimal_perplexity`) of length sum(sizes), cut into train, valid and test."""
    sizes = [int(n) for n in sizes]
    if any(n < 2 for n in sizes):
        raise ValueError(f"Each split needs at least 2 tokens, got {sizes}.")
    ids = language.sample(sum(sizes), seed=seed)
    ends = np.cumsum(sizes)
    corpus = Corpus(language.vocabulary(), train=ids[:ends[0]], valid=ids[ends[0]:ends[1]],
                    test=ids[ends[1]:], name=language.name)
    corpus.optimal_perplexity = language.optimal_perplexity
    corpus.language = language
    return corpus


def _stationary(transition, tol=1e-14, max_iter=100_000):
    """Stationary distribution by power iteration (eigenvector fallback)."""
    v = transition.shape[0]
    pi = np.full(v, 1.0 / v)
    for _ in range(max_iter):
        nxt = pi @ transition
        nxt /= nxt.sum()
        if np.abs(nxt - pi).sum() < tol:
            return nxt
        pi = nxt
    values, vectors = np.linalg.eig(transition.T)
    vec = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
    vec = np.abs(vec)
    return vec / vec.sum()


def markov_language(vocab_size, temperature=DEFAULT_TEMPERATURE, seed=0):
    """A random first-order Markov language with a full-rank log-probability matrix.

    Rule: G ~ N(0, 1)^{V x V} from `np.random.default_rng(seed)`;
    `true_log_probs = log_softmax(G / temperature)` row-wise.

    Args:
        vocab_size: V, number of words (>= 2).
        temperature: > 0; lower is more peaked (lower optimal perplexity). Default 0.5:
            optimal perplexity about 0.15-0.2 V for V = 100..1000, far below what a
            rank-16 head reaches.
        seed: integer seed of G. Default 0.

    Returns:
        A `MarkovLanguage`.

    Example:

    >>> lang = markov_language(256, seed=0)
    >>> lang.true_rank, round(lang.optimal_perplexity)        # doctest: +SKIP
    (256, 43)

    Reference:
        Yang et al. 2018, "Breaking the Softmax Bottleneck" (ICLR).
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
            or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}.")
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((int(vocab_size), int(vocab_size))) / float(temperature)
    return MarkovLanguage(_log_softmax(logits), temperature=float(temperature), seed=seed)


def mixture_markov_language(vocab_size, num_components=4, component_rank=8, temperature=0.25,
                            seed=0):
    """A Markov language whose transitions are a mixture of low-rank softmaxes.

        log P(j | i) = logsumexp_k [ log pi_{i,k} + log_softmax_j(h_{i,k} . e_j / (sqrt(r) tau)) ]

    with e_j in R^r, h_{i,k} in R^r and the mixture logits of pi_i all i.i.d. N(0, 1). Each
    component alone has log-probability rank <= r + 1, but the log of the mixture is full
    rank (V) almost surely: the structure a Mixture of Softmaxes head with K >= num_components
    and d >= component_rank can represent exactly, while a softmax head of the same d
    cannot (Yang et al. 2018, §2.3). Training on its exact distributions, V = 500, K = 4,
    r = 8, tau = 0.25: optimal perplexity 26.6; a d = 16 softmax head reaches ~32.7, a
    d = 16, K = 4 MoS head ~27.9.

    Args:
        vocab_size: V (>= 2).
        num_components: K (>= 1). Default 4.
        component_rank: r (>= 1). Default 8.
        temperature: tau > 0; lower is more peaked. Default 0.25.
        seed: integer seed. Default 0.

    Returns:
        A `MarkovLanguage` (kind "mixture-K{K}-r{r}").

    Reference: Yang et al. 2018, "Breaking the Softmax Bottleneck" (ICLR), §2.3-2.4.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
            or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}.")
    if int(num_components) < 1 or int(component_rank) < 1:
        raise ValueError(f"num_components and component_rank must be >= 1; got "
                         f"{num_components}, {component_rank}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}.")
    v, k, r = int(vocab_size), int(num_components), int(component_rank)
    rng = np.random.default_rng(seed)
    words = rng.standard_normal((v, r))
    contexts = rng.standard_normal((v, k, r))
    prior = _log_softmax(rng.standard_normal((v, k)))
    scale = 1.0 / (math.sqrt(r) * float(temperature))
    log_probs = np.full((v, v), -np.inf)
    for c in range(k):
        component = _log_softmax(contexts[:, c] @ words.T * scale) + prior[:, c:c + 1]
        log_probs = np.logaddexp(log_probs, component)
    return MarkovLanguage(log_probs, temperature=float(temperature), seed=seed,
                          kind=f"mixture-K{k}-r{r}")
