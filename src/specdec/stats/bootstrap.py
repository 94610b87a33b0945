"""The spread of a positive ratio (a speedup) over measurements that come in clusters (repeats
of one prompt are not independent: the prompt is the unit): the geometric mean with a
percentile-bootstrap interval that resamples whole clusters, and quartiles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

N_BOOT = 2000  # bootstrap draws
BOOT_SEED = 12345  # fixed: the same measurements give the same interval


@dataclass
class Spread:
    """Summary of one cell's speedups (or any positive ratio)."""

    n: int  # measurements
    n_prompts: int  # independent units (prompts)
    geomean: float
    ci_low: float  # nan when fewer than two prompts
    ci_high: float
    median: float
    q25: float
    q75: float


def cluster_bootstrap_geomean(
    values: Sequence[float],
    clusters: Sequence[str],
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile-bootstrap CI (``level``, 95 % by default) of the geometric mean, resampling
    whole clusters."""
    assert 0.0 < level < 1.0
    logs = np.log(np.asarray(values, dtype=np.float64))
    ids = sorted(set(clusters))
    if len(ids) < 2:
        return float("nan"), float("nan")
    index = {c: i for i, c in enumerate(ids)}
    cl = np.array([index[c] for c in clusters])
    sums = np.bincount(cl, weights=logs, minlength=len(ids))  # [C]
    counts = np.bincount(cl, minlength=len(ids)).astype(np.float64)  # [C]
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, len(ids), size=(n_boot, len(ids)))  # [B, C]
    means = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)  # [B]
    lo, hi = np.percentile(means, [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return float(np.exp(lo)), float(np.exp(hi))


def spread(values: Sequence[float], clusters: Sequence[str]) -> Spread:
    v = np.asarray(values, dtype=np.float64)
    lo, hi = cluster_bootstrap_geomean(values, clusters)
    q25, med, q75 = np.percentile(v, [25, 50, 75])
    return Spread(
        n=len(v),
        n_prompts=len(set(clusters)),
        geomean=float(np.exp(np.mean(np.log(v)))),
        ci_low=lo,
        ci_high=hi,
        median=float(med),
        q25=float(q25),
        q75=float(q75),
    )
