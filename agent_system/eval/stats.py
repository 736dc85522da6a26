"""The statistics of the evaluator's summaries: 95 % intervals, unbiased pass@k and the exact paired test.

* :func:`wilson`: the Wilson score interval of a binomial proportion (one 0/1 value per problem);
* :func:`bootstrap`: a percentile bootstrap over problems, for per-problem values that are not 0/1 (the mean of
  k > 1 samples, a difference of two turns); seeded, so a summary is the same on every rerun;
* :func:`interval`: the first when every value is 0 or 1, the second otherwise, named in the result;
* :func:`pass_at_k`: 1 − C(n − c, k) / C(n, k) (Chen et al. 2021), the unbiased estimate from n samples, c right;
* :func:`paired_sign_test`: the exact two-sided sign test on per-problem differences; with 0/1 outcomes it is the
  exact McNemar test (only the discordant problems count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A 95 % interval and how it was computed (``wilson`` or ``bootstrap``)."""

    low: float
    high: float
    method: str

    def as_list(self) -> list:
        return [self.low, self.high, self.method]


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n`` (n ≥ 1)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n and n >= 1 (got {successes} of {n})")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: list[float], seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The 2.5 % and 97.5 % percentiles of the mean over ``resamples`` resamples of ``values`` (with replacement)."""
    if not values:
        raise ValueError("bootstrap: no values")
    data = np.asarray(values, dtype=np.float64)
    means = data[np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def interval(values: list[float]) -> Interval:
    """The 95 % interval of the mean of per-problem ``values``: Wilson when all are 0/1, else the bootstrap."""
    if all(v in (0, 1) for v in values):
        return Interval(*wilson(int(sum(values)), len(values)), "wilson")
    return Interval(*bootstrap(list(values)), "bootstrap")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` right answers among ``n`` samples (k ≤ n)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k: need 1 <= k <= n and 0 <= c <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class PairedTest:
    """The exact sign test of B against A on shared problems (the exact McNemar test for 0/1 outcomes)."""

    shared: int  # problems both runs evaluated
    a_better: int  # problems where A's value is higher (McNemar's b)
    b_better: int  # problems where B's value is higher (McNemar's c)
    p_value: float  # two-sided


def paired_sign_test(a: list[float], b: list[float]) -> PairedTest:
    """Exact two-sided sign test on the per-problem pairs (a[i], b[i]); ties carry no information and are dropped."""
    if len(a) != len(b):
        raise ValueError(f"paired test: {len(a)} values of A, {len(b)} of B")
    a_better = sum(x > y for x, y in zip(a, b, strict=True))
    b_better = sum(y > x for x, y in zip(a, b, strict=True))
    discordant = a_better + b_better
    tail = sum(math.comb(discordant, i) for i in range(min(a_better, b_better) + 1)) / 2**discordant
    return PairedTest(len(a), a_better, b_better, min(1.0, 2 * tail))
