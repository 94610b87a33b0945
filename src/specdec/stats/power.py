"""The power of chi-square tests, analytically, and the smallest TV they detect.

For a chi-square test with dof degrees of freedom, the statistic under an alternative is
approximately noncentral chi-square with noncentrality
    one-sample:  lambda = n * chi2_div(r || p)
    two-sample:  lambda = (n_a * n_b / (n_a + n_b)) * sum_c (P_a(c) - P_b(c))^2 / Pbar(c)
and by Cauchy-Schwarz chi2_div >= (sum |d|)^2 = 4 TV^2 for every alternative (equality when
the difference is spread in proportion to the probabilities, the hardest case to detect).
Hence the power against ANY alternative at distance TV >= delta is at least the power at
lambda = 4 delta^2 n_eff: ``min_detectable_tv_*`` returns the smallest such delta with the
requested power (an asymptotic approximation; ``simulated`` checks it by simulation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import optimize
from scipy import stats as sps

from .thresholds import POWER


def chisquare_power(ncp: float, dof: int, alpha: float) -> float:
    """P(reject) of a level-alpha chi-square test (dof) when the statistic is noncentral
    chi-square with noncentrality ncp."""
    if dof <= 0:
        return 0.0
    crit = sps.chi2.isf(alpha, dof)
    if ncp <= 0:
        return float(sps.chi2.sf(crit, dof))
    return float(sps.ncx2.sf(crit, dof, ncp))


def ncp_for_power(dof: int, alpha: float, power: float = POWER) -> float:
    """The noncentrality at which a level-alpha chi-square test (dof) has the given power."""
    if dof <= 0:
        return math.inf
    if not 0.0 < alpha < power < 1.0:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    hi = 1.0
    while chisquare_power(hi, dof, alpha) < power:
        hi *= 2.0
    return float(optimize.brentq(lambda x: chisquare_power(x, dof, alpha) - power, 0.0, hi))


def min_detectable_tv_gof(n: float, dof: int, alpha: float, power: float = POWER) -> float:
    """Smallest TV to a known distribution that a goodness-of-fit test on n independent draws
    (dof after pooling) detects with at least ``power`` at level alpha (nan if untestable)."""
    if n <= 0 or dof <= 0:
        return float("nan")
    return min(1.0, math.sqrt(ncp_for_power(dof, alpha, power) / (4.0 * n)))


def min_detectable_tv_homogeneity(
    n_a: float, n_b: float, dof: int, alpha: float, power: float = POWER
) -> float:
    """Smallest TV between two distributions that the homogeneity test on samples of n_a and
    n_b detects with at least ``power`` at level alpha (nan if untestable)."""
    if n_a <= 0 or n_b <= 0 or dof <= 0:
        return float("nan")
    n_eff = n_a * n_b / (n_a + n_b)
    return min(1.0, math.sqrt(ncp_for_power(dof, alpha, power) / (4.0 * n_eff)))


def min_detectable_tv_combined(
    n_eff: Sequence[float], dof: int, alpha: float, power: float = POWER
) -> float:
    """Smallest TV that, present in EVERY stratum, the combined chi-square (summed dof) detects
    with the given power; n_eff[i] is n for a one-sample stratum, n_a n_b / (n_a + n_b) for a
    two-sample one."""
    total = float(sum(n_eff))
    if total <= 0 or dof <= 0:
        return float("nan")
    return min(1.0, math.sqrt(ncp_for_power(dof, alpha, power) / (4.0 * total)))
