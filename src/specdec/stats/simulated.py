"""The power of the chi-square tests by simulation: the hardest alternative at a given TV, and
the fraction of simulated experiments that a test rejects (every draw from an explicit
``numpy.random.Generator``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .chisquare import chisquare_gof, chisquare_homogeneity, combined_homogeneity, pool_rare
from .thresholds import MIN_EXPECTED


def hardest_alternative(p: np.ndarray, tv: float) -> np.ndarray | None:
    """A distribution at TV distance ``tv`` from p [C] of the shape a chi-square test detects
    least: mass moved in proportion to p from the heavier half (by probability) of the
    categories to the lighter one. Its chi-square divergence tv^2 (1/m_a + 1/m_b) is the
    smallest of this form, 4 tv^2 when the halves weigh 0.5 each (module ``power``). None
    when no such move exists: the heavier half holds less than tv (a lighter half lighter
    than tv is allowed: a dominant category, common after pooling)."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    order = np.argsort(p, kind="stable")
    light = np.zeros(p.shape[0], dtype=bool)
    light[order[np.cumsum(p[order]) <= 0.5]] = True
    if not light.any():
        light[order[0]] = True
    m_light, m_heavy = float(p[light].sum()), float(p[~light].sum())
    if m_light <= 0 or tv > m_heavy:
        return None
    out = np.where(light, p * (1 + tv / m_light), p * (1 - tv / m_heavy))
    return out / out.sum()


def simulated_power_homogeneity(
    p_a: np.ndarray,
    p_b: np.ndarray,
    n_a: int,
    n_b: int,
    alpha: float,
    trials: int,
    rng: np.random.Generator,
) -> float:
    """Fraction of ``trials`` simulated experiments (multinomial samples of n_a from p_a and
    n_b from p_b) in which ``chisquare_homogeneity`` rejects at level alpha."""
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
    p_true: np.ndarray,
    p_null: np.ndarray,
    n: int,
    alpha: float,
    trials: int,
    rng: np.random.Generator,
) -> float:
    """Fraction of simulated samples of n draws from p_true that ``chisquare_gof`` against
    p_null rejects at level alpha."""
    pt = np.asarray(p_true, dtype=np.float64)
    pt = pt / pt.sum()
    hits = 0
    for _ in range(trials):
        hits += int(chisquare_gof(rng.multinomial(n, pt), p_null).pvalue <= alpha)
    return hits / trials


def simulated_power_combined(
    tables: Sequence[tuple[np.ndarray, np.ndarray]],
    tv: float,
    level: float,
    trials: int,
    rng: np.random.Generator,
) -> float:
    """P(the combined homogeneity test rejects at ``level``) when, in every stratum (a pair of
    count vectors [C] a, b), sample a is ``hardest_alternative`` at ``tv`` from the observed
    frequencies of the categories the test pools to and sample b has those frequencies: the
    TV is on the pooled categories, as the analytic power states it. nan when some stratum
    has no such alternative (or tv is not finite, or there are no trials)."""
    if not math.isfinite(tv) or trials < 1:
        return math.nan
    setups = []
    for a, b in tables:
        na, nb = float(a.sum()), float(b.sum())
        # the categories the test itself pools to (column totals, as chisquare_homogeneity)
        labels = pool_rare((a + b) * min(na, nb) / (na + nb), MIN_EXPECTED)
        grouped = np.bincount(labels, weights=a + b)  # [G]
        p = grouped / grouped.sum()
        alt = hardest_alternative(p, tv)
        if alt is None:
            return math.nan
        setups.append((int(a.sum()), int(b.sum()), alt, p))
    hits = 0
    for _ in range(trials):
        sim = [
            (rng.multinomial(na, alt).astype(float), rng.multinomial(nb, p).astype(float))
            for na, nb, alt, p in setups
        ]
        hits += int(combined_homogeneity(sim).pvalue <= level)
    return hits / trials
