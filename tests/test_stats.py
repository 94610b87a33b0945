"""specdec.stats on known cases. Everything is seeded; thresholds are stated per test and
were fixed before running (simulation tolerances are about 3 binomial standard errors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from specdec.stats.chisquare import (
    chisquare_gof,
    chisquare_homogeneity,
    combine_chisquare,
    pool_rare,
)
from specdec.stats.multiple import bonferroni_adjust, holm_adjust, holm_reject
from specdec.stats.power import (
    chisquare_power,
    min_detectable_tv_combined,
    min_detectable_tv_gof,
    min_detectable_tv_homogeneity,
    ncp_for_power,
)
from specdec.stats.simulated import (
    hardest_alternative,
    simulated_power_gof,
    simulated_power_homogeneity,
)
from specdec.stats.tv import (
    softmax_tv_bound,
    tv_distance,
    tv_one_sample,
    tv_radius,
    tv_two_sample,
)


def test_holm_on_a_hand_computed_example() -> None:
    """Sorted p (0.005, 0.01, 0.03, 0.04) scaled by (4, 3, 2, 1) = (0.02, 0.03, 0.06, 0.04),
    running max (0.02, 0.03, 0.06, 0.06): exact equality expected."""
    p = [0.01, 0.04, 0.03, 0.005]
    np.testing.assert_allclose(holm_adjust(p), [0.03, 0.06, 0.06, 0.02])
    assert holm_reject(p, 0.05).tolist() == [True, False, False, True]
    np.testing.assert_allclose(bonferroni_adjust(p), [0.04, 0.16, 0.12, 0.02])
    assert holm_adjust([]).shape == (0,)
    assert holm_adjust([0.9, 0.8]).max() <= 1.0


def test_pool_rare_keeps_mass_and_reaches_the_minimum() -> None:
    """Every group except a lone one has weight >= the minimum; total weight is preserved."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        w = rng.exponential(size=20) * rng.choice([0.1, 1, 10])
        w[rng.random(20) < 0.2] = 0.0
        labels = pool_rare(w, 5.0)
        sums = np.bincount(labels, weights=w)
        assert sums.sum() == pytest.approx(w.sum())
        if sums.shape[0] > 1:
            assert sums.min() >= 5.0 - 1e-12
        assert set(labels.tolist()) == set(range(sums.shape[0]))


def test_gof_exact_counts_impossible_outcomes_and_pooling() -> None:
    """Counts exactly proportional: statistic 0, p = 1. A count where p = 0: p-value 0."""
    probs = np.array([0.5, 0.25, 0.25, 0.0])
    r = chisquare_gof(np.array([200, 100, 100, 0]), probs)
    assert r.statistic == pytest.approx(0.0, abs=1e-12) and r.pvalue == pytest.approx(1.0)
    bad = chisquare_gof(np.array([200, 100, 99, 1]), probs)
    assert bad.pvalue == 0.0 and bad.impossible == 1
    # tiny expected counts are pooled: 100 draws over 50 rare + 1 common category
    p = np.array([0.5] + [0.01] * 50)
    r = chisquare_gof(np.random.default_rng(1).multinomial(100, p), p)
    assert r.n_groups < 51 and r.dof == r.n_groups - 1


def test_type_one_error_is_controlled() -> None:
    """Under the null, rejection rates at alpha = 0.05 over 400 seeded experiments lie in
    [0.02, 0.085] (0.05 +- about 3 standard errors) for both tests."""
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(12))
    gof = [chisquare_gof(rng.multinomial(300, p), p).pvalue for _ in range(400)]
    hom = [
        chisquare_homogeneity(rng.multinomial(300, p), rng.multinomial(200, p)).pvalue
        for _ in range(400)
    ]
    for pv in (gof, hom):
        rate = float(np.mean(np.array(pv) <= 0.05))
        assert 0.02 <= rate <= 0.085, rate


def test_homogeneity_identical_versus_shifted_samples() -> None:
    """Same distribution: p > 0.01. A TV = 0.2 shift with 1,000 per sample: p < 1e-6."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(8))
    same = chisquare_homogeneity(rng.multinomial(1000, p), rng.multinomial(1000, p))
    assert same.pvalue > 0.01
    q = hardest_alternative(p, 0.2)
    assert q is not None
    assert tv_distance(p, q) == pytest.approx(0.2)
    shifted = chisquare_homogeneity(rng.multinomial(1000, p), rng.multinomial(1000, q))
    assert shifted.pvalue < 1e-6
    assert shifted.tv.low > 0.0  # the distribution-free interval excludes 0 here


def test_power_formula_matches_simulation() -> None:
    """At the computed minimal detectable TV (hardest-shape alternative, no pooling needed),
    the simulated power over 1,500 experiments is 0.80 +- 0.04 (about 3.9 s.e.)."""
    p = np.array([0.2, 0.2, 0.15, 0.15, 0.15, 0.15])
    n = 500
    tv = min_detectable_tv_homogeneity(n, n, 5, 0.01)
    q = hardest_alternative(p, tv)
    assert q is not None
    power = simulated_power_homogeneity(p, q, n, n, 0.01, 1500, np.random.default_rng(4))
    assert abs(power - 0.8) <= 0.04, power
    tv1 = min_detectable_tv_gof(n, 5, 0.01)
    q1 = hardest_alternative(p, tv1)
    assert q1 is not None
    power1 = simulated_power_gof(q1, p, n, 0.01, 1500, np.random.default_rng(5))
    assert abs(power1 - 0.8) <= 0.04, power1


def test_power_helpers_are_consistent() -> None:
    """ncp_for_power inverts chisquare_power (to 1e-6); the size of the test is alpha."""
    for dof in (1, 5, 40):
        ncp = ncp_for_power(dof, 0.01, 0.8)
        assert chisquare_power(ncp, dof, 0.01) == pytest.approx(0.8, abs=1e-6)
        assert chisquare_power(0.0, dof, 0.01) == pytest.approx(0.01)
    assert math.isnan(min_detectable_tv_gof(100, 0, 0.01))
    # more data, smaller detectable difference; combined over strata beats one stratum
    assert min_detectable_tv_gof(4000, 5, 0.01) < min_detectable_tv_gof(1000, 5, 0.01)
    assert min_detectable_tv_combined([250.0] * 10, 50, 0.01) < (
        min_detectable_tv_homogeneity(500, 500, 5, 0.01)
    )


def test_tv_interval_covers_the_truth() -> None:
    """The 95 % distribution-free interval covers the true TV in >= 95 % of 300 experiments
    (it is conservative, so coverage is usually ~100 %)."""
    rng = np.random.default_rng(6)
    p = rng.dirichlet(np.ones(10))
    q = hardest_alternative(p, 0.1)
    assert q is not None
    hits_one = hits_two = 0
    for _ in range(300):
        est = tv_one_sample(rng.multinomial(400, q), p)
        hits_one += int(est.low <= 0.1 <= est.high)
        est2 = tv_two_sample(rng.multinomial(400, p), rng.multinomial(300, q))
        hits_two += int(est2.low <= 0.1 <= est2.high)
    assert hits_one / 300 >= 0.95 and hits_two / 300 >= 0.95


def test_combined_chisquare_sums_statistics() -> None:
    """The combination is chi2(sum of statistics, sum of dof), exactly."""
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(6))
    rs = [chisquare_homogeneity(rng.multinomial(200, p), rng.multinomial(200, p)) for _ in range(4)]
    c = combine_chisquare(rs)
    assert c.statistic == pytest.approx(sum(r.statistic for r in rs))
    assert c.dof == sum(r.dof for r in rs)
    assert c.pvalue == pytest.approx(sps.chi2.sf(c.statistic, c.dof))


def test_softmax_tv_bound_holds() -> None:
    """For random logits and perturbations of max size eps, the TV between the two
    softmax rows (1 token) never exceeds 1 - exp(-2 eps); bound is 0 at eps = 0."""
    rng = np.random.default_rng(8)
    for eps in (1e-5, 0.1, 0.5):
        for _ in range(200):
            logits = rng.normal(size=20) * 3
            delta = rng.uniform(-eps, eps, size=20)
            p = np.exp(logits - logits.max())
            q = np.exp(logits + delta - (logits + delta).max())
            assert tv_distance(p, q) <= softmax_tv_bound(eps) + 1e-12
    assert softmax_tv_bound(0.0, 3) == 0.0
    assert softmax_tv_bound(0.1, 2) == pytest.approx(1 - math.exp(-0.4))


def test_combined_chisquare_keeps_an_impossible_stratum() -> None:
    """One clean stratum plus one with an observation of probability 0 (statistic inf, dof 0)
    must reject the joint null (p = 0), not be dropped as 'untestable' (the old p was 1.0)."""
    clean = chisquare_gof(np.array([50, 50]), np.array([0.5, 0.5]))
    impossible = chisquare_gof(np.array([10, 1]), np.array([1.0, 0.0]))
    assert impossible.statistic == math.inf and impossible.dof == 0
    c = combine_chisquare([clean, impossible])
    assert c.pvalue == 0.0 and c.statistic == math.inf
    assert combine_chisquare([impossible]).pvalue == 0.0


def test_tv_interval_uses_the_support_size() -> None:
    """A table built from the observed categories (2 here) out of a support of 1,000 must get
    the radius of the support: observed-only radii cover TV on data-chosen categories only.
    Numbers: radius = 0.5 sqrt((C - 1) / n) + sqrt(log(1 / (1 - conf)) / 2n) per sample."""
    a, b = np.array([50.0, 50.0]), np.array([50.0, 50.0])
    narrow = tv_two_sample(a, b)
    honest = tv_two_sample(a, b, support_size=1000)
    expected = 2 * tv_radius(100, 1000, 0.975)
    assert honest.high == pytest.approx(min(1.0, expected))
    assert honest.high > narrow.high
    one = tv_one_sample(a, np.array([0.5, 0.5]), support_size=1000)
    assert one.high == pytest.approx(min(1.0, tv_radius(100, 1000, 0.95)))
    r = chisquare_homogeneity(a, b, support_size=1000)
    assert r.tv.high == pytest.approx(honest.high)


def test_softmax_tv_bound_scales_with_temperature_and_refuses_truncation() -> None:
    """At temperature T the logits are divided by T, so a logit difference eps moves the
    probabilities like eps / T: the bound at T = 0.5 equals the T = 1 bound at 2 eps, and
    it holds on random rows. Under top-k / top-p there is no bound (1.0)."""
    rng = np.random.default_rng(9)
    eps, t = 0.1, 0.5
    assert softmax_tv_bound(eps, 1, temperature=t) == pytest.approx(softmax_tv_bound(2 * eps))
    worst = 0.0
    for _ in range(300):
        logits = rng.normal(size=20) * 3
        delta = rng.choice([-eps, eps], size=20)
        p = np.exp((logits - logits.max()) / t)
        q = np.exp((logits + delta - (logits + delta).max()) / t)
        worst = max(worst, tv_distance(p, q))
    assert worst <= softmax_tv_bound(eps, 1, temperature=t)
    # two tied tokens moved by +-eps at T = 0.1: TV = sigmoid(2 eps / T) - 1/2 = 0.381, above
    # the T = 1 bound 1 - exp(-2 eps) = 0.181 (which the old bound would have claimed)
    p2, q2 = np.exp(np.array([0.0, 0.0]) / 0.1), np.exp(np.array([eps, -eps]) / 0.1)
    tv2 = tv_distance(p2, q2)
    assert tv2 == pytest.approx(1 / (1 + math.exp(-2 * eps / 0.1)) - 0.5)
    assert softmax_tv_bound(eps) < tv2 <= softmax_tv_bound(eps, temperature=0.1)
    assert softmax_tv_bound(1e-6, 1, truncated=True) == 1.0
    with pytest.raises(ValueError):
        softmax_tv_bound(0.1, temperature=0.0)
