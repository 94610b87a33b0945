"""Multiple testing: Holm's step-down procedure and Bonferroni (valid under any dependence
between the tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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


def holm_reject(pvalues: Sequence[float], alpha: float) -> np.ndarray:
    """Boolean [m]: which hypotheses Holm's procedure rejects at family-wise level alpha."""
    return holm_adjust(pvalues) <= alpha


def bonferroni_adjust(pvalues: Sequence[float]) -> np.ndarray:
    """min(1, m * p) for each of the m p-values."""
    p = np.asarray(pvalues, dtype=np.float64)
    return np.minimum(p * max(1, p.shape[0]), 1.0)
