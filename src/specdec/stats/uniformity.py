"""Tests of uniformity of PIT values: Anderson-Darling (tails and shifts) and a binned
chi-square (bumps), each at alpha / 2 (family-wise alpha by Bonferroni); vectorised over
simulated samples for the power computations (``alternatives``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from .thresholds import N_BINS


def _adinf(z: np.ndarray) -> np.ndarray:
    """Asymptotic CDF of the Anderson-Darling statistic for a fully specified continuous
    distribution (Marsaglia & Marsaglia 2004, 'Evaluating the Anderson-Darling distribution',
    J. Stat. Softw. 9(2), function ADinf; absolute error < 2e-6)."""
    z = np.asarray(z, dtype=np.float64)
    out = np.zeros_like(z)
    small = (z > 0) & (z < 2)
    zs = z[small]
    out[small] = (np.exp(-1.2337141 / zs) / np.sqrt(zs)) * (
        2.00012
        + (0.247105 - (0.0649821 - (0.0347962 - (0.011672 - 0.00168691 * zs) * zs) * zs) * zs) * zs
    )
    big = z >= 2
    zb = z[big]
    out[big] = np.exp(
        -np.exp(
            1.0776
            - (2.30695 - (0.43424 - (0.082433 - (0.008056 - 0.0003146 * zb) * zb) * zb) * zb) * zb
        )
    )
    return np.clip(out, 0.0, 1.0)


def anderson_darling(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AD statistic and asymptotic p-value against U(0, 1) for samples u [..., n] (last axis;
    vectorised over leading axes). Returns (statistic [...], pvalue [...])."""
    s = np.sort(np.clip(u, 1e-300, 1 - 1e-16), axis=-1)  # [..., n]
    n = s.shape[-1]
    i = np.arange(1, n + 1, dtype=np.float64)  # [n]
    terms = (2 * i - 1) * (np.log(s) + np.log1p(-s[..., ::-1]))  # [..., n]
    a2 = -n - terms.sum(-1) / n  # [...]
    return a2, 1.0 - _adinf(a2)


def binned_chisquare(u: np.ndarray, bins: int = N_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Pearson chi-square of u [..., n] against U(0, 1) in ``bins`` equal bins (dof bins - 1).
    Returns (statistic [...], pvalue [...])."""
    n = u.shape[-1]
    idx = np.minimum((u * bins).astype(np.int64), bins - 1)  # [..., n]
    flat = idx.reshape(-1, n) + bins * np.arange(idx.reshape(-1, n).shape[0])[:, None]
    counts = np.bincount(flat.ravel(), minlength=bins * flat.shape[0]).reshape(-1, bins)
    e = n / bins
    stat = ((counts - e) ** 2 / e).sum(-1).reshape(u.shape[:-1])
    return stat, sps.chi2.sf(stat, bins - 1)


@dataclass(frozen=True)
class UniformityResult:
    """Tests of H0: the PIT values are i.i.d. U(0, 1), each at alpha / 2 (Bonferroni)."""

    n: int  # PIT values tested
    impossible: int  # tokens with reference probability 0 (reject outright)
    ad_statistic: float
    ad_pvalue: float
    chi2_statistic: float
    chi2_pvalue: float
    bins: int
    alpha: float
    ks_statistic: float  # sup |F_n(u) - u|: a lower bound on the U distribution's TV
    tv_lower: float  # one-sided (1 - alpha) lower confidence bound on that TV (DKW)

    @property
    def pvalue(self) -> float:
        """Bonferroni-combined p-value of the two tests (0 with an impossible token; NaN when
        either is NaN: rejected, never passed; ``min`` would drop a NaN and give 1)."""
        if self.impossible:
            return 0.0
        if math.isnan(self.ad_pvalue) or math.isnan(self.chi2_pvalue):
            return math.nan
        return min(1.0, 2 * min(self.ad_pvalue, self.chi2_pvalue))

    @property
    def rejected(self) -> bool:
        return not self.pvalue > self.alpha  # a NaN p-value is rejected, never passed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(pvalue=self.pvalue, rejected=self.rejected)
        return d


def uniformity_test(u: np.ndarray, alpha: float, bins: int = N_BINS) -> UniformityResult:
    """Test PIT values u [n] (nan = impossible token) for uniformity at family-wise alpha."""
    u = np.asarray(u, dtype=np.float64)
    bad = int(np.isnan(u).sum())
    ok = u[~np.isnan(u)]
    n = int(ok.shape[0])
    if n == 0:
        return UniformityResult(0, bad, 0.0, 1.0, 0.0, 1.0, bins, alpha, 0.0, 0.0)
    a2, pa = anderson_darling(ok)
    c2, pc = binned_chisquare(ok, bins)
    s = np.sort(ok)
    i = np.arange(1, n + 1)
    ks = float(max((i / n - s).max(), (s - (i - 1) / n).max()))
    # DKW: P(sup |F_n - F| > e) <= 2 exp(-2 n e^2); TV(F, U) >= sup |F - U| >= ks - e
    e = math.sqrt(math.log(2 / alpha) / (2 * n))
    return UniformityResult(
        n, bad, float(a2), float(pa), float(c2), float(pc), bins, alpha, ks, max(0.0, ks - e)
    )


def reject_many(u: np.ndarray, alpha: float, bins: int = N_BINS) -> np.ndarray:
    """The decision of ``uniformity_test`` for each row of u [trials, n] (bool [trials])."""
    _, pa = anderson_darling(u)
    _, pc = binned_chisquare(u, bins)
    return np.minimum(1.0, 2 * np.minimum(pa, pc)) <= alpha
