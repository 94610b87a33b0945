"""Pearson chi-square tests with valid nulls: goodness of fit to a known row, homogeneity of
two samples, and their combination over independent strata (numpy arrays in, scipy for the
distributions).

What the tests assume: the observations behind a count vector are independent draws of one
categorical variable (one per independent unit: a round, a sequence, a seed). Pooled tokens
of one sequence are NOT independent and must not be fed in as if they were.

Rare categories are pooled before a test (the usual rule: every expected cell count >=
``MIN_EXPECTED``), and the pooling depends only on quantities that are symmetric under the
null (the known probabilities, or the column totals of a two-sample table), so it does not
bias the test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from .power import min_detectable_tv_gof, min_detectable_tv_homogeneity
from .thresholds import CONFIDENCE, MIN_EXPECTED, POWER
from .tv import TvEstimate, tv_distance, tv_one_sample, tv_two_sample


# ------------------------------------------------------------------ pooling
def pool_rare(weights: np.ndarray, min_weight: float) -> np.ndarray:
    """Group labels [C] that merge every category with weight < min_weight into one "other"
    group, moving the next-smallest categories into it until it reaches min_weight too.

    Labels are 0..G-1; kept categories keep their order. Categories of weight 0 join "other"
    (they carry no expectation). With everything pooled G = 1.
    """
    w = np.asarray(weights, dtype=np.float64)  # [C]
    order = np.argsort(w, kind="stable")  # ascending
    pooled = w < min_weight
    mass = float(w[pooled].sum())
    if pooled.any() and mass < min_weight:
        for idx in order:
            if mass >= min_weight:
                break
            if not pooled[idx]:
                pooled[idx] = True
                mass += float(w[idx])
    labels = np.empty(w.shape[0], dtype=np.int64)
    kept = np.flatnonzero(~pooled)
    labels[kept] = np.arange(kept.shape[0])
    if mass > 0 or kept.shape[0] == 0:
        labels[pooled] = kept.shape[0]
    else:
        # only zero-weight categories were pooled: fold them into the lightest kept category
        # (an "other" group with nothing expected in it would break the test)
        labels[pooled] = labels[kept[np.argmin(w[kept])]]
    return labels


def _group_sums(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.bincount(labels, weights=np.asarray(x, dtype=np.float64))  # [G]


# ------------------------------------------------------------------ tests
@dataclass(frozen=True)
class ChiSquareResult:
    """One chi-square test: statistic, dof and p-value after pooling, the sample sizes, the
    number of groups tested, the TV effect size (before pooling) and the pooled TV."""

    kind: str  # "gof" | "homogeneity"
    statistic: float
    dof: int
    pvalue: float
    n: int  # total sample size (one-sample: n; two-sample: n_a + n_b)
    n_a: int
    n_b: int
    n_categories: int  # categories before pooling
    n_groups: int  # after pooling
    tv: TvEstimate
    tv_pooled: float
    impossible: int = 0  # one-sample: observations in categories of probability 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tv"] = self.tv.to_dict()
        return d

    def min_detectable_tv(self, alpha: float, power: float = POWER) -> float:
        """Smallest pooled TV detected with the given power at level alpha (see module doc)."""
        if self.kind == "gof":
            return min_detectable_tv_gof(self.n, self.dof, alpha, power)
        return min_detectable_tv_homogeneity(self.n_a, self.n_b, self.dof, alpha, power)


def chisquare_gof(
    counts: np.ndarray,
    probs: np.ndarray,
    *,
    min_expected: float = MIN_EXPECTED,
    confidence: float = CONFIDENCE,
) -> ChiSquareResult:
    """Pearson goodness of fit of counts [C] to the known probs [C].

    Null: the n observations are independent draws from probs. Categories with expected count
    < min_expected are pooled. An observation in a category of probability 0 is impossible
    under the null: the statistic is inf and the p-value 0.
    """
    c = np.asarray(counts, dtype=np.float64)  # [C]
    pr = np.asarray(probs, dtype=np.float64)
    pr = pr / pr.sum()
    n = float(c.sum())
    tv = tv_one_sample(c, pr, confidence)
    impossible = int(c[pr <= 0].sum())
    if impossible:
        return ChiSquareResult(
            "gof", math.inf, 0, 0.0, int(n), int(n), 0, c.shape[0], 0, tv, tv.estimate, impossible
        )
    labels = pool_rare(n * pr, min_expected)
    obs, exp = _group_sums(c, labels), _group_sums(n * pr, labels)  # [G]
    g = obs.shape[0]
    pooled_tv = tv_distance(obs, exp) if n > 0 else float("nan")
    if g < 2 or n == 0:
        return ChiSquareResult("gof", 0.0, 0, 1.0, int(n), int(n), 0, c.shape[0], g, tv, pooled_tv)
    res = sps.chisquare(obs, exp)
    return ChiSquareResult(
        "gof",
        float(res.statistic),
        g - 1,
        float(res.pvalue),
        int(n),
        int(n),
        0,
        c.shape[0],
        g,
        tv,
        pooled_tv,
    )


def chisquare_homogeneity(
    counts_a: np.ndarray,
    counts_b: np.ndarray,
    *,
    min_expected: float = MIN_EXPECTED,
    confidence: float = CONFIDENCE,
    support_size: int | None = None,
) -> ChiSquareResult:
    """Pearson chi-square test of homogeneity on the 2 x C table [counts_a; counts_b].

    ``support_size``: the number of possible categories when the vectors list only the
    observed ones (for an honest TV interval; see ``tv_two_sample``).

    Null: the two samples are independent draws from one common distribution. Columns are
    pooled until every expected cell count is >= min_expected (using the column totals only,
    which are symmetric under the null). No continuity correction.
    """
    a = np.asarray(counts_a, dtype=np.float64)  # [C]
    b = np.asarray(counts_b, dtype=np.float64)  # [C]
    if a.shape != b.shape:
        raise ValueError(f"count vectors differ in shape: {a.shape} vs {b.shape}")
    na, nb = float(a.sum()), float(b.sum())
    tv = tv_two_sample(a, b, confidence, support_size=support_size)
    total = na + nb
    if na == 0 or nb == 0:
        return ChiSquareResult(
            "homogeneity", 0.0, 0, 1.0, int(total), int(na), int(nb), a.shape[0], 0, tv, tv.estimate
        )
    # expected cell (row r, column j) = n_r * col_j / N >= min_expected for both rows
    labels = pool_rare((a + b) * min(na, nb) / total, min_expected)
    ga, gb = _group_sums(a, labels), _group_sums(b, labels)  # [G]
    g = ga.shape[0]
    pooled_tv = tv_distance(ga, gb)
    if g < 2:
        return ChiSquareResult(
            "homogeneity", 0.0, 0, 1.0, int(total), int(na), int(nb), a.shape[0], g, tv, pooled_tv
        )
    table = np.stack([ga, gb])  # [2, G]
    res = sps.chi2_contingency(table, correction=False)
    return ChiSquareResult(
        "homogeneity",
        float(res.statistic),
        int(res.dof),
        float(res.pvalue),
        int(total),
        int(na),
        int(nb),
        a.shape[0],
        g,
        tv,
        pooled_tv,
    )


@dataclass(frozen=True)
class CombinedResult:
    """Sum of independent chi-square statistics (a chi-square with the summed dof under the
    joint null): sensitive to a small difference present in every stratum."""

    statistic: float
    dof: int
    pvalue: float
    n_tests: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def combine_chisquare(results: Sequence[ChiSquareResult]) -> CombinedResult:
    """Combine independent tests (e.g. one per prompt) by summing statistics and dof."""
    # an impossible observation (statistic inf, dof 0 from ``chisquare_gof``) rejects the joint
    # null outright: look for it BEFORE dropping the strata that have nothing to test
    if any(math.isinf(r.statistic) for r in results):
        return CombinedResult(math.inf, sum(r.dof for r in results), 0.0, len(results))
    live = [r for r in results if r.dof > 0]
    stat = float(sum(r.statistic for r in live))
    dof = int(sum(r.dof for r in live))
    p = float(sps.chi2.sf(stat, dof)) if dof > 0 else 1.0
    return CombinedResult(stat, dof, p, len(results))


def combined_homogeneity(tables: Sequence[tuple[np.ndarray, np.ndarray]]) -> CombinedResult:
    """The homogeneity test of each stratum (a pair of count vectors [C]), combined."""
    return combine_chisquare([chisquare_homogeneity(a, b) for a, b in tables])
