"""Next-word samplers for `LanguageModel.generate`, named and parametrised as KerasHub's
(`keras_hub.samplers`: "greedy", "random", "top_k", "top_p", each with `temperature`).

Every sampler turns a batch of rows of log-probabilities (B, V) into one id per row:

    q(w) proportional to exp(log p(w) / temperature)  on the sampler's candidate words
    greedy: argmax (ties: the lowest id);  random: every word;  top_k: the k most likely
    (ties at the boundary: the lower ids);  top_p: the fewest most likely words whose
    probability sums to at least p (then at most k of them when k is given)

and draws it on the host with one `rng.random()` per row, compared with the cumulative
distribution over the candidates in id order (`rng`: NumPy's `Generator(PCG64(seed))`). The
model's rows are the same on every Keras backend up to float rounding, so a seed gives the
same words on TensorFlow, JAX and PyTorch (a word can differ only where a uniform number
falls within rounding of a boundary between two words). KerasHub samples inside its compiled
loop with the backend's generator instead, which differs across backends.
"""

import numpy as np


class Sampler:
    """Base: `temperature` > 0 divides the log-probabilities (towards 0: greedy)."""

    name = None

    def __init__(self, temperature=1.0):
        temperature = float(temperature)
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a number > 0 (1: the model's own "
                             f"distribution); got {temperature!r}.")
        self.temperature = temperature

    def candidates(self, row):
        """The ids that may be drawn from `row` (float64 (V,)), ascending."""
        return np.arange(row.size)

    def __call__(self, rows, rng):
        """One id per row of `rows` ((B, V) log-probabilities); one `rng.random()` each."""
        rows = np.asarray(rows, np.float64).reshape(len(rows), -1)
        return np.array([self.draw(row, rng) for row in rows], np.int64)

    def draw(self, row, rng):
        if np.isnan(row).any() or np.isposinf(row).any():
            raise ValueError("the model's log-probabilities are not finite (NaN weights?)")
        keep = self.candidates(row)
        scores = row[keep]
        # (log p - max) / T <= 0: no overflow however small T is; T -> 0 gives the argmax.
        weights = np.exp((scores - scores.max()) / self.temperature)
        cdf = np.cumsum(weights)
        i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        if i >= keep.size:  # u rounded up to the total: the last word with weight > 0
            i = int(np.flatnonzero(weights > 0)[-1])
        return int(keep[i])

    def get_config(self):
        return {"temperature": self.temperature}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class RandomSampler(Sampler):
    """Every word, with the model's probability (at `temperature` 1)."""

    name = "random"


class GreedySampler(Sampler):
    """The most likely word (no randomness is used, but one number is still drawn per row,
    so that a seed's stream does not depend on the sampler)."""

    name = "greedy"

    def __init__(self):
        super().__init__(1.0)

    def candidates(self, row):
        return np.array([int(np.argmax(row))])

    def get_config(self):
        return {}


class TopKSampler(Sampler):
    """The `k` most likely words."""

    name = "top_k"

    def __init__(self, k=5, temperature=1.0):
        super().__init__(temperature)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"top_k: k must be an integer >= 1; got {k!r}.")
        self.k = int(k)

    def candidates(self, row):
        if self.k >= row.size:
            return np.arange(row.size)
        return np.sort(np.argsort(-row, kind="stable")[:self.k])

    def get_config(self):
        return {"k": self.k, "temperature": self.temperature}


class TopPSampler(Sampler):
    """Nucleus sampling (Holtzman et al. 2020): the fewest most likely words whose
    probability (at the sampler's temperature) sums to at least `p`, at most `k` of them."""

    name = "top_p"

    def __init__(self, p=0.1, k=None, temperature=1.0):
        super().__init__(temperature)
        p = float(p)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p: p must be in (0, 1]; got {p!r}.")
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer))
                              or k < 1):
            raise ValueError(f"top_p: k must be None or an integer >= 1; got {k!r}.")
        self.p, self.k = p, None if k is None else int(k)

    def candidates(self, row):
        order = np.argsort(-row, kind="stable")
        if self.k is not None:
            order = order[:self.k]
        probs = np.exp((row[order] - row[order[0]]) / self.temperature)
        probs /= probs.sum()
        count = int(np.searchsorted(np.cumsum(probs), self.p * (1 - 1e-12))) + 1
        return np.sort(order[:min(count, order.size)])

    def get_config(self):
        return {"p": self.p, "k": self.k, "temperature": self.temperature}


SAMPLERS = {cls.name: cls for cls in (GreedySampler, RandomSampler, TopKSampler, TopPSampler)}


def get(sampler):
    """A `Sampler` from a sampler, a name ("greedy", "random", "top_k", "top_p": their
    defaults) or None ("random")."""
    if sampler is None:
        return RandomSampler()
    if isinstance(sampler, Sampler):
        return sampler
    if isinstance(sampler, str) and sampler in SAMPLERS:
        return SAMPLERS[sampler]()
    raise ValueError(f"unknown sampler {sampler!r}; use one of {', '.join(SAMPLERS)} or a "
                     "tflm.samplers.Sampler.")
