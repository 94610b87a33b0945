"""The alternatives whose power the per-token test states, fixed before any data: densities
of U on [0, 1] at a given per-token TV (what a per-token alternative does to the PIT values),
and the smallest TV the uniformity test detects against each, by simulation with explicit
``numpy.random.Generator`` draws."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .thresholds import N_BINS
from .uniformity import reject_many


@dataclass(frozen=True)
class Alternative:
    """A density on [0, 1] that is constant on each piece [breaks[i], breaks[i+1]): the
    distribution of U under some per-token alternative. ``shape(tv)`` gives the heights."""

    name: str
    description: str
    breaks: tuple[float, ...]  # 0 = b_0 < ... < b_k = 1
    direction: tuple[float, ...]  # [k]: height = 1 + tv * direction (integrates to 0)

    def heights(self, tv: float) -> np.ndarray:
        h = 1.0 + tv * np.asarray(self.direction)
        if (h < -1e-12).any():
            raise ValueError(f"{self.name}: TV {tv} is too large for this shape")
        return np.maximum(h, 0.0)

    def sample(self, tv: float, base: np.ndarray) -> np.ndarray:
        """Samples [...] from the density at this TV by inverting its CDF at uniforms base."""
        b = np.asarray(self.breaks)  # [k+1]
        h = self.heights(tv)  # [k]
        cdf = np.concatenate([[0.0], np.cumsum(h * np.diff(b))])  # [k+1]
        cdf /= cdf[-1]
        j = np.clip(np.searchsorted(cdf, base, side="right") - 1, 0, h.shape[0] - 1)
        return b[j] + (base - cdf[j]) / np.where(h[j] > 0, h[j] / cdf[-1], np.inf)


def _two_piece(name: str, description: str, w: float, start: float = 0.0) -> Alternative:
    """Mass tv moved into [start, start + w) from the rest, evenly: TV exactly tv."""
    lo, hi = start, start + w
    breaks = sorted({0.0, lo, hi, 1.0})
    direction = []
    for a, b in itertools.pairwise(breaks):
        direction.append(1.0 / w if (a >= lo and b <= hi) else -1.0 / (1.0 - w))
    return Alternative(name, description, tuple(breaks), tuple(direction))


def draft_mixture(vocab: int, rng: np.random.Generator) -> Alternative:
    """Q = (1 - e) P + e D for a Zipf-like reference row P and an unrelated Zipf-like row D
    (both over ``vocab`` tokens, a random permutation each, drawn with ``rng``), in the q / P
    order the certificate uses: the U density is (1 - e) + e D(y) / P(y) on token y's
    interval, an increasing staircase. Returned normalised so that ``heights(tv)`` has TV =
    tv."""
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = rng.permutation(1.0 / ranks**1.1)
    d = rng.permutation(1.0 / ranks**1.1)
    p, d = p / p.sum(), d / d.sum()
    order = np.argsort(d / p, kind="stable")  # ascending q / P
    ps, ds = p[order], d[order]
    breaks = np.concatenate([[0.0], np.cumsum(ps)])  # [V+1]
    breaks[-1] = 1.0
    tv_d = 0.5 * float(np.abs(ds - ps).sum())
    # height at mixture weight e: 1 + e (D/P - 1), TV = e tv_d; per unit of TV: (D/P - 1)/tv_d
    direction = (ds / ps - 1.0) / tv_d  # [V]
    return Alternative(
        "draft-mixture",
        f"output = (1 - e) target + e draft (Zipf rows, V = {vocab}): the shape of a walk that "
        "leaks draft probability (residual or acceptance errors)",
        tuple(float(x) for x in breaks),
        tuple(float(x) for x in direction),
    )


def alternatives() -> list[Alternative]:
    """The alternatives whose power the certificate states (fixed before any data)."""
    return [
        draft_mixture(2000, np.random.default_rng(0)),  # the same rows in every run
        _two_piece(
            "shift-half", "mass moved from one half of the order to the other (a shift)", 0.5
        ),
        _two_piece(
            "tail-5%", "mass moved into the first 5 % of the order (e.g. over-sharpening)", 0.05
        ),
        _two_piece(
            "bump-10%", "mass moved into the middle 10 % of the order (a local bump)", 0.1, 0.45
        ),
    ]


def simulated_power(
    alt: Alternative,
    tv: float,
    n: int,
    alpha: float,
    trials: int,
    rng: np.random.Generator,
    bins: int = N_BINS,
) -> float:
    """Fraction of ``trials`` simulated samples of n PIT values under ``alt`` at this TV that
    the uniformity test rejects at alpha."""
    base = rng.random((trials, n))  # [trials, n]
    return float(reject_many(alt.sample(tv, base), alpha, bins).mean())


def min_detectable_tv(
    alt: Alternative,
    base: np.ndarray,
    alpha: float,
    power: float,
    bins: int = N_BINS,
    tv_max: float = 0.5,
) -> float:
    """Smallest TV (to within 2 %) at which the test on n PIT values rejects ``alt`` with
    probability >= power, by simulation with common random numbers: ``base`` [trials, n]
    holds uniforms in [0, 1), the same at every TV (so the estimated power is monotone in TV;
    ``common_uniforms``). nan if not reached by tv_max, or for n = 0."""
    if base.shape[-1] == 0:
        return math.nan

    def pw(tv: float) -> float:
        return float(reject_many(alt.sample(tv, base), alpha, bins).mean())

    if pw(tv_max) < power:
        return math.nan
    lo, hi = 0.0, tv_max
    while hi - lo > 0.02 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if pw(mid) >= power else (mid, hi)
    return hi


@dataclass(frozen=True)
class PowerRow:
    alternative: str
    description: str
    min_detectable_tv: float


def common_uniforms(trials: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """The base uniforms [trials, n] of a power computation: one draw from ``rng``, shared by
    every TV and every alternative it tries."""
    return rng.random((trials, n))


def power_table(
    n: int, alpha: float, power: float, trials: int, rng: np.random.Generator, bins: int = N_BINS
) -> list[PowerRow]:
    """The smallest per-token TV detected with ``power`` for each stated alternative, on n PIT
    values, from ``trials`` simulated samples drawn once from ``rng``."""
    base = common_uniforms(trials, n, rng)  # [trials, n]
    return [
        PowerRow(a.name, a.description, min_detectable_tv(a, base, alpha, power, bins))
        for a in alternatives()
    ]
