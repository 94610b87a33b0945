"""Statistical helpers with valid nulls (pure functions on numpy arrays; scipy for the
distributions).

Conventions:
    counts      observed category counts, float or int array [C]
    probs       a known probability row [C] (need not be normalised)
    alpha       the significance level, fixed before the data are seen
    TV          total-variation distance, 0.5 * sum |a - b|, in [0, 1]

What the tests here assume: the observations behind a count vector are independent draws of
one categorical variable (one per independent unit: a round, a sequence, a seed). Pooled
tokens of one sequence are NOT independent and must not be fed in as if they were.

Rare categories are pooled before a chi-square test (the usual rule: every expected cell count
>= 5), and the pooling depends only on quantities that are symmetric under the null (the known
probabilities, or the column totals of a two-sample table), so it does not bias the test.

Power and "minimal detectable TV": for a chi-square test with dof degrees of freedom, the
statistic under an alternative is approximately noncentral chi-square with noncentrality
    one-sample:  lambda = n * chi2_div(r || p)
    two-sample:  lambda = (n_a * n_b / (n_a + n_b)) * sum_c (P_a(c) - P_b(c))^2 / Pbar(c)
and by Cauchy-Schwarz chi2_div >= (sum |d|)^2 = 4 TV^2 for every alternative (equality when
the difference is spread in proportion to the probabilities, the hardest case to detect).
Hence the power against ANY alternative at distance TV >= delta is at least the power at
lambda = 4 delta^2 n_eff: ``min_detectable_tv_*`` returns the smallest such delta with the
requested power (an asymptotic approximation; ``simulated_power_homogeneity`` checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as sps

MIN_EXPECTED = 5.0


# ------------------------------------------------------------------ multiple testing
def holm_adjust(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values [m] (reject H_i at family-wise level alpha iff
    adjusted_i <= alpha). Valid under any dependence between the tests. A p-value that is
    NaN (a test that could not be computed) counts as 0: rejected, never passed (NaN would
    compare false with every level and so pass silently)."""
    p = np.asarray(pvalues, dtype=np.float64)  # [m]
    p = np.where(np.isnan(p), 0.0, p)
    m = p.shape[0]
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]  # [m] (m - i) * p_(i)
    adjusted_sorted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    out = np.empty(m)
    out[order] = adjusted_sorted
    return out


def worst(values: Sequence[float]) -> float:
    """The largest of ``values`` (0 for none), NaN when any is NaN: an aggregate of errors
    that must not lose one (Python's ``max`` drops a NaN that is not first)."""
    out = 0.0
    for v in values:
        if math.isnan(v):
            return math.nan
        out = max(out, v)
    return out


def holm_reject(pvalues: Sequence[float], alpha: float) -> np.ndarray:
    """Boolean [m]: which hypotheses Holm's procedure rejects at family-wise level alpha."""
    return holm_adjust(pvalues) <= alpha


def bonferroni_adjust(pvalues: Sequence[float]) -> np.ndarray:
    """min(1, m * p) for each of the m p-values."""
    p = np.asarray(pvalues, dtype=np.float64)
    return np.minimum(p * max(1, p.shape[0]), 1.0)


# ------------------------------------------------------------------ effect sizes
def tv_distance(a: np.ndarray, b: np.ndarray) -> float:
    """0.5 * sum |a/sum(a) - b/sum(b)| for two non-negative rows [C]."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def tv_radius(n: float, n_categories: int, confidence: float) -> float:
    """Distribution-free radius eps with P(TV(empirical, true) <= eps) >= confidence for n
    independent draws of a categorical with at most n_categories values.

    E[TV] <= 0.5 * sqrt((C - 1) / n) (Cauchy-Schwarz), and TV moves by at most 1/n when one
    draw changes, so McDiarmid gives the deviation term sqrt(log(1 / (1 - confidence)) / 2n).
    Conservative (it holds for every distribution), never an approximation.
    """
    if n <= 0:
        return 1.0
    c = max(1, int(n_categories))
    return min(
        1.0,
        0.5 * math.sqrt((c - 1) / n) + math.sqrt(math.log(1.0 / (1.0 - confidence)) / (2 * n)),
    )


@dataclass(frozen=True)
class TvEstimate:
    """A TV distance with a distribution-free confidence interval [low, high]."""

    estimate: float
    low: float
    high: float
    confidence: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def tv_one_sample(
    counts: np.ndarray,
    probs: np.ndarray,
    confidence: float = 0.95,
    *,
    support_size: int | None = None,
) -> TvEstimate:
    """TV between the distribution that generated ``counts`` [C] and the known ``probs`` [C]:
    the plug-in estimate and an interval from ``tv_radius`` (triangle inequality).

    The radius grows with the size of the SUPPORT the data can fall in, not with the number
    of categories observed: ``counts`` must list every possible category (zeros included),
    or ``support_size`` must say how many there are (e.g. the vocabulary size)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = float(counts.sum())
    est = tv_distance(counts, probs) if n > 0 else float("nan")
    c = max(counts.shape[0], support_size or 0)
    r = tv_radius(n, c, confidence)
    return TvEstimate(est, max(0.0, est - r), min(1.0, est + r), confidence)


def tv_two_sample(
    counts_a: np.ndarray,
    counts_b: np.ndarray,
    confidence: float = 0.95,
    *,
    support_size: int | None = None,
) -> TvEstimate:
    """TV between the distributions behind two count vectors [C] (same categories): the
    plug-in estimate and an interval whose radius is the sum of the two one-sample radii
    (each at confidence 1 - (1 - confidence) / 2).

    As in ``tv_one_sample`` the radius must use the size of the support: when the vectors
    list only the categories that were observed (a table built from the data), pass the true
    ``support_size``; the interval computed from the observed categories alone is too narrow
    (it would hold only for TV on categories chosen from the data)."""
    a = np.asarray(counts_a, dtype=np.float64)
    b = np.asarray(counts_b, dtype=np.float64)
    est = tv_distance(a, b) if a.sum() > 0 and b.sum() > 0 else float("nan")
    half = 1.0 - (1.0 - confidence) / 2
    c = max(a.shape[0], support_size or 0)
    r = tv_radius(a.sum(), c, half) + tv_radius(b.sum(), c, half)
    return TvEstimate(est, max(0.0, est - r), min(1.0, est + r), confidence)


def softmax_tv_bound(
    eps: float, n_tokens: int = 1, *, temperature: float = 1.0, truncated: bool = False
) -> float:
    """Largest TV between two distributions of n-token sequences whose next-token rows are
    softmax(logits / temperature) of logits differing by at most eps (max abs) at every
    token: the scaled logits differ by eps / T, a token's probability ratio lies in
    [e^(-2 eps/T), e^(2 eps/T)], a sequence's in [e^(-2 n eps/T), e^(2 n eps/T)], so
    TV <= 1 - e^(-2 n eps / T).

    Under top-k / top-p truncation (``truncated``) there is no such bound: a tiny logit
    change can move a token across the cut and its whole mass with it, so 1.0 is returned."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if truncated:
        return 1.0
    return 1.0 - math.exp(-2.0 * n_tokens * max(0.0, eps) / temperature)


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

    def min_detectable_tv(self, alpha: float, power: float = 0.8) -> float:
        """Smallest pooled TV detected with the given power at level alpha (see module doc)."""
        if self.kind == "gof":
            return min_detectable_tv_gof(self.n, self.dof, alpha, power)
        return min_detectable_tv_homogeneity(self.n_a, self.n_b, self.dof, alpha, power)


def chisquare_gof(
    counts: np.ndarray,
    probs: np.ndarray,
    *,
    min_expected: float = MIN_EXPECTED,
    confidence: float = 0.95,
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
    confidence: float = 0.95,
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


# ------------------------------------------------------------------ power
def chisquare_power(ncp: float, dof: int, alpha: float) -> float:
    """P(reject) of a level-alpha chi-square test (dof) when the statistic is noncentral
    chi-square with noncentrality ncp."""
    if dof <= 0:
        return 0.0
    crit = sps.chi2.isf(alpha, dof)
    if ncp <= 0:
        return float(sps.chi2.sf(crit, dof))
    return float(sps.ncx2.sf(crit, dof, ncp))


def ncp_for_power(dof: int, alpha: float, power: float = 0.8) -> float:
    """The noncentrality at which a level-alpha chi-square test (dof) has the given power."""
    if dof <= 0:
        return math.inf
    if not 0.0 < alpha < power < 1.0:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    hi = 1.0
    while chisquare_power(hi, dof, alpha) < power:
        hi *= 2.0
    return float(optimize.brentq(lambda x: chisquare_power(x, dof, alpha) - power, 0.0, hi))


def min_detectable_tv_gof(n: float, dof: int, alpha: float, power: float = 0.8) -> float:
    """Smallest TV to a known distribution that a goodness-of-fit test on n independent draws
    (dof after pooling) detects with at least ``power`` at level alpha (nan if untestable)."""
    if n <= 0 or dof <= 0:
        return float("nan")
    return min(1.0, math.sqrt(ncp_for_power(dof, alpha, power) / (4.0 * n)))


def min_detectable_tv_homogeneity(
    n_a: float, n_b: float, dof: int, alpha: float, power: float = 0.8
) -> float:
    """Smallest TV between two distributions that the homogeneity test on samples of n_a and
    n_b detects with at least ``power`` at level alpha (nan if untestable)."""
    if n_a <= 0 or n_b <= 0 or dof <= 0:
        return float("nan")
    n_eff = n_a * n_b / (n_a + n_b)
    return min(1.0, math.sqrt(ncp_for_power(dof, alpha, power) / (4.0 * n_eff)))


def min_detectable_tv_combined(
    n_eff: Sequence[float], dof: int, alpha: float, power: float = 0.8
) -> float:
    """Smallest TV that, present in EVERY stratum, the combined chi-square (summed dof) detects
    with the given power; n_eff[i] is n for a one-sample stratum, n_a n_b / (n_a + n_b) for a
    two-sample one."""
    total = float(sum(n_eff))
    if total <= 0 or dof <= 0:
        return float("nan")
    return min(1.0, math.sqrt(ncp_for_power(dof, alpha, power) / (4.0 * total)))


def hardest_alternative(p: np.ndarray, tv: float) -> np.ndarray:
    """A distribution at TV distance ``tv`` from p [C] whose chi-square divergence from p is
    close to the minimum 4 tv^2: mass moves in proportion to p from one half (by probability)
    of the categories to the other. Requires tv <= the smaller half's mass."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    order = np.argsort(p, kind="stable")
    cum = np.cumsum(p[order])
    half = np.zeros(p.shape[0], dtype=bool)
    half[order[cum <= 0.5]] = True
    if not half.any():
        half[order[0]] = True
    ma, mb = float(p[half].sum()), float(p[~half].sum())
    if tv > min(ma, mb) + 1e-12:
        raise ValueError(f"tv {tv} is larger than the movable mass {min(ma, mb):.4f}")
    out = np.where(half, p * (1 + tv / ma), p * (1 - tv / mb))
    return out / out.sum()


def simulated_power_homogeneity(
    p_a: np.ndarray,
    p_b: np.ndarray,
    n_a: int,
    n_b: int,
    alpha: float,
    trials: int,
    seed: int,
) -> float:
    """Fraction of ``trials`` simulated experiments (multinomial samples of n_a from p_a and
    n_b from p_b) in which ``chisquare_homogeneity`` rejects at level alpha."""
    rng = np.random.default_rng(seed)
    pa = np.asarray(p_a, dtype=np.float64)
    pb = np.asarray(p_b, dtype=np.float64)
    pa, pb = pa / pa.sum(), pb / pb.sum()
    hits = 0
    for _ in range(trials):
        a = rng.multinomial(n_a, pa)
        b = rng.multinomial(n_b, pb)
        hits += int(chisquare_homogeneity(a, b).pvalue <= alpha)
    return hits / trials


def simulated_power_gof(
    p_true: np.ndarray, p_null: np.ndarray, n: int, alpha: float, trials: int, seed: int
) -> float:
    """Fraction of simulated samples of n draws from p_true that ``chisquare_gof`` against
    p_null rejects at level alpha."""
    rng = np.random.default_rng(seed)
    pt = np.asarray(p_true, dtype=np.float64)
    pt = pt / pt.sum()
    hits = 0
    for _ in range(trials):
        hits += int(chisquare_gof(rng.multinomial(n, pt), p_null).pvalue <= alpha)
    return hits / trials


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where two sequences differ (the shorter length when one is a prefix
    of the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
