"""Intervals over independent units (sequences): the mean of a per-unit value with its
Student-t interval."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps


def sequence_mean_interval(
    values: Sequence[float], confidence: float
) -> tuple[float, float, float]:
    """Mean of per-sequence values (independent units) and its two-sided Student-t interval
    (mean, low, high); (nan, nan, nan) for no data, (m, nan, nan) for one value: one
    sequence gives no interval, and its value is not a bound on the mean (taking it as one
    let a single sequence below a threshold pass a rule stated for the upper 95 % bound)."""
    x = np.asarray(values, dtype=np.float64)
    if x.shape[0] == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.shape[0] == 1:
        return m, math.nan, math.nan
    half = float(sps.t.ppf(0.5 + confidence / 2, x.shape[0] - 1) * x.std(ddof=1)) / math.sqrt(
        x.shape[0]
    )
    return m, max(0.0, m - half), min(1.0, m + half)
