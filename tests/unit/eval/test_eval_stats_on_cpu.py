"""The evaluator's statistics against independent computations (published values, brute-force enumeration)."""

from __future__ import annotations

import itertools
import math

import pytest

from agent_system.eval.stats import bootstrap, interval, paired_sign_test, pass_at_k, wilson


def test_wilson_matches_published_values():
    # Newcombe (1998), Table I: 81 of 263 -> 0.2553-0.3662; 15 of 148 -> 0.0624-0.1605; 0 of 20 -> 0-0.1611
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert wilson(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    with pytest.raises(ValueError, match="3 of 2"):
        wilson(3, 2)


def test_pass_at_k_equals_the_share_of_k_subsets_with_a_right_sample():
    for n, c in ((5, 0), (5, 2), (6, 3), (4, 4)):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_paired_sign_test_is_the_exact_mcnemar_binomial():
    a = [1] * 12 + [0] * 3 + [1] * 30 + [0] * 5  # A right / B wrong on 12, B right / A wrong on 3, 35 ties
    b = [0] * 12 + [1] * 3 + [1] * 30 + [0] * 5
    test = paired_sign_test(a, b)
    expected = 2 * sum(math.comb(15, i) for i in range(4)) / 2**15  # P(X <= 3), X ~ Bin(15, 1/2), two-sided
    assert (test.shared, test.a_better, test.b_better) == (50, 12, 3)
    assert test.p_value == pytest.approx(expected) and test.p_value == pytest.approx(0.03516, abs=1e-5)
    assert paired_sign_test([1, 0], [1, 0]).p_value == 1.0  # no discordant problem: no evidence


def test_interval_uses_wilson_for_zero_one_values_and_a_seeded_bootstrap_otherwise():
    assert interval([1, 0, 1, 1]).method == "wilson"
    values = [0.0, 0.25, 0.5, 1.0, 0.75] * 20
    found = interval(values)
    assert found.method == "bootstrap" and found.low < sum(values) / len(values) < found.high
    assert bootstrap(values) == bootstrap(values)  # the same summary on every rerun
    se = math.sqrt(sum((v - 0.5) ** 2 for v in values) / len(values) / len(values))
    assert found.high - found.low == pytest.approx(2 * 1.96 * se, rel=0.15)  # the normal approximation's width
