"""The thesis's significance test between two samples, and a sample's summary.

Parthiban 2020 thesis §4.3.5 and Table 4.9: train models A and B with several seeds, then
test H0 "both samples come from the same distribution" against the two-sided alternative
with the Wilcoxon rank-sum test. The statistic is the standardized rank sum of sample `a`
in the pooled sample,
z = (W_a - n_a (n_a + n_b + 1) / 2) / sqrt(n_a n_b (n_a + n_b + 1) / 12), with a normal
p-value (``scipy.stats.ranksums``; no tie correction, normal approximation, so for very
small samples the p-value is approximate). Tables report a sample as mean +- one standard
deviation (n - 1 in the denominator).

Used by `python -m tools.stats` (two sets of run folders) and `python -m zoo.study` (the
arms of a study).
"""

import dataclasses

import numpy as np
import scipy.stats


@dataclasses.dataclass
class WilcoxonResult:
    """Outcome of `wilcoxon_rank_sum`.

    Attributes:
        statistic: standardized rank-sum statistic z of sample a.
        pvalue: two-sided p-value.
        significant: pvalue < alpha.
        alpha: significance level used for the sentence.
        sentence: one-line conclusion in words.
    """

    statistic: float
    pvalue: float
    significant: bool
    alpha: float
    sentence: str

    def __iter__(self):  # `stat, p, sentence = wilcoxon_rank_sum(a, b)`
        return iter((self.statistic, self.pvalue, self.sentence))

    def __str__(self):
        return self.sentence


def _sample(x, name):
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size < 2:
        raise ValueError(f"sample {name} needs at least 2 values (e.g. one per seed), got "
                         f"{x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"sample {name} holds non-finite values: {x.tolist()}")
    return x


def wilcoxon_rank_sum(a, b, alpha=0.05, label_a="A", label_b="B"):
    """Two-sided Wilcoxon rank-sum test of samples `a` and `b`.

    Args:
        a, b: 1-D samples (>= 2 finite values each), e.g. test perplexities per seed.
        alpha: significance level for the verdict in the sentence (default 0.05).
        label_a, label_b: names used in the sentence.

    Returns:
        `WilcoxonResult` (statistic, pvalue, significant, alpha, sentence); it also unpacks
        as ``statistic, pvalue, sentence``.
    """
    x, y = _sample(a, label_a), _sample(b, label_b)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    res = scipy.stats.ranksums(x, y, alternative="two-sided")
    stat, p = float(res.statistic), float(res.pvalue)
    significant = p < alpha
    if significant:
        lower = label_a if np.median(x) < np.median(y) else label_b
        verdict = (f"the difference is statistically significant at alpha = {alpha:g} "
                   f"(reject H0; {lower} has the lower median)")
    else:
        verdict = (f"the difference is not statistically significant at alpha = {alpha:g} "
                   f"(H0 of equal distributions not rejected)")
    sentence = (f"Two-sided Wilcoxon rank-sum test, {label_a} (n={x.size}, median "
                f"{np.median(x):.4g}) vs {label_b} (n={y.size}, median {np.median(y):.4g}): "
                f"z = {stat:.3f}, p = {p:.3g}; {verdict}.")
    return WilcoxonResult(statistic=stat, pvalue=p, significant=significant, alpha=alpha,
                          sentence=sentence)


def summary(values):
    """{n, mean, sd (n - 1), median} of a sample."""
    x = np.asarray(values, dtype=np.float64)
    return {"n": int(x.size), "mean": float(x.mean()), "sd": float(x.std(ddof=1)),
            "median": float(np.median(x))}
