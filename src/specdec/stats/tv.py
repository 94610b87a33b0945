"""Total-variation distance: plug-in estimates with distribution-free intervals, and the bound
a logit difference puts on it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .thresholds import CONFIDENCE


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
    confidence: float = CONFIDENCE,
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
    confidence: float = CONFIDENCE,
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
