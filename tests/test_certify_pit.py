"""The per-token test's math (specdec.stats): the randomised PIT is exact, the
uniformity tests hold their level, and the stated power is what simulation gives.

Thresholds (fixed before running): alpha 0.01; simulated rates are compared with the target
rate within 3 binomial standard errors (seeded, so deterministic in CI).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specdec.stats.alternatives import (
    alternatives,
    common_uniforms,
    min_detectable_tv,
    simulated_power,
)
from specdec.stats.intervals import sequence_mean_interval
from specdec.stats.pit import draw_v, order_keys, pit_values
from specdec.stats.uniformity import UniformityResult, reject_many, uniformity_test


def _se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def test_pit_values_by_hand() -> None:
    """P = (0.2, 0.5, 0.3) ordered by -P: token 1 first, then 2, then 0; F(x-) = 0, 0.5, 0.8.
    U = F(x-) + v P(x) exactly; ordering by q / P puts the token with the largest ratio last."""
    p = torch.tensor([[0.2, 0.5, 0.3]] * 3, dtype=torch.float64)  # [3, 3]
    tokens = torch.tensor([1, 2, 0])
    v = torch.tensor([0.5, 0.5, 0.25], dtype=torch.float64)
    u = pit_values(p, tokens, v, order_keys(p, None))
    np.testing.assert_allclose(u, [0.25, 0.5 + 0.15, 0.8 + 0.05])
    q = torch.tensor([[0.6, 0.2, 0.2]] * 3, dtype=torch.float64)  # ratios 3, 0.4, 0.667
    u = pit_values(p, tokens, v, order_keys(p, q))
    # order: token 1 (0.4), token 2 (0.667), token 0 (3)
    np.testing.assert_allclose(u, [0.25, 0.5 + 0.15, 0.8 + 0.05])
    q2 = torch.tensor([[0.1, 0.6, 0.3]] * 3, dtype=torch.float64)  # ratios 0.5, 1.2, 1.0
    u = pit_values(p, tokens, v, order_keys(p, q2))
    # order: token 0, token 2, token 1 -> F(1-) = 0.5, F(2-) = 0.2, F(0-) = 0
    np.testing.assert_allclose(u, [0.5 + 0.25, 0.2 + 0.15, 0.05])


def test_impossible_token_is_nan_and_rejects() -> None:
    """A token of reference probability 0 (e.g. outside top-k) has no PIT value and rejects
    the null outright, whatever the other values."""
    p = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    u = pit_values(p, torch.tensor([2]), torch.tensor([0.5]), order_keys(p, None))
    assert math.isnan(u[0])
    good = np.random.default_rng(0).random(500)
    r = uniformity_test(np.concatenate([good, u]), 0.01)
    assert r.impossible == 1 and r.pvalue == 0.0 and r.rejected


def test_a_nan_p_value_of_either_test_is_rejected_not_passed() -> None:
    """A p-value that could not be computed rejects; Python's min(1, 2 min(nan, p)) gave 1."""
    for ad, chi2 in ((math.nan, 0.5), (0.5, math.nan), (math.nan, math.nan)):
        r = UniformityResult(100, 0, 0.0, ad, 0.0, chi2, 20, 0.01, 0.0, 0.0)
        assert math.isnan(r.pvalue) and r.rejected
    assert not UniformityResult(100, 0, 0.0, 0.5, 0.0, 0.5, 20, 0.01, 0.0, 0.0).rejected


def test_pit_of_tokens_from_the_reference_is_uniform() -> None:
    """Tokens drawn from their own rows (random Dirichlet rows, V = 50, 4,000 tokens): the
    PIT values pass the test and their mean is 1/2 within 4 standard errors; drawn from a
    row mixed 30 % with the draft row, the same test rejects."""
    g = torch.Generator().manual_seed(1)
    n, vocab = 4000, 50
    p = torch.distributions.Dirichlet(torch.full((vocab,), 0.3)).sample((n,)).double()
    q = torch.distributions.Dirichlet(torch.full((vocab,), 0.3)).sample((n,)).double()
    x = torch.multinomial(p, 1, generator=g).view(-1)
    v = draw_v(n, g)
    u = pit_values(p, x, v, order_keys(p, q))
    r = uniformity_test(u, 0.01)
    assert not r.rejected, r
    assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / n)
    mix = 0.7 * p + 0.3 * q
    x_bad = torch.multinomial(mix, 1, generator=g).view(-1)
    u_bad = pit_values(p, x_bad, v, order_keys(p, q))
    assert uniformity_test(u_bad, 0.01).rejected


def test_level_is_held() -> None:
    """2,000 uniform samples of 800: the combined test rejects at 0.01 +- 3 SE."""
    u = np.random.default_rng(2).random((2000, 800))
    rate = reject_many(u, 0.01).mean()
    assert abs(rate - 0.01) <= 3 * _se(0.01, 2000)
    # the vectorised decision is the one-sample function's
    for row in u[:20]:
        assert uniformity_test(row, 0.01).rejected == reject_many(row[None], 0.01)[0]


def test_alternatives_have_the_stated_tv() -> None:
    """Each alternative's density at TV 0.1 integrates to 1 and is at TV 0.1 from uniform."""
    for alt in alternatives():
        h = alt.heights(0.1)
        w = np.diff(alt.breaks)
        assert float((h * w).sum()) == pytest.approx(1.0)
        assert 0.5 * float((np.abs(h - 1) * w).sum()) == pytest.approx(0.1)


def test_min_detectable_tv_has_the_stated_power() -> None:
    """For n = 1,500: at the computed TV a fresh simulation (other seed, 600 trials) rejects
    with probability >= 0.80 - 3 SE, at 0.7 x that TV with probability < 0.80."""
    n, trials = 1500, 600
    for alt in alternatives()[:2]:
        tv = min_detectable_tv(alt, common_uniforms(300, n, np.random.default_rng(3)), 0.01, 0.8)
        assert 0 < tv < 0.2
        rng = np.random.default_rng(4)
        assert simulated_power(alt, tv, n, 0.01, trials, rng) >= 0.8 - 3 * _se(0.8, trials)
        assert simulated_power(alt, 0.7 * tv, n, 0.01, trials, rng) < 0.8


def test_sequence_mean_interval() -> None:
    """Student-t interval of the mean: hand-checked on (0, 0.02, 0.04)."""
    m, lo, hi = sequence_mean_interval([0.0, 0.02, 0.04], 0.95)
    assert m == pytest.approx(0.02)
    half = 4.302652729911275 * 0.02 / math.sqrt(3)
    assert hi == pytest.approx(0.02 + half) and lo == 0.0
    m, lo, hi = sequence_mean_interval([0.1], 0.95)  # one sequence: no interval
    assert m == 0.1 and math.isnan(lo) and math.isnan(hi)
