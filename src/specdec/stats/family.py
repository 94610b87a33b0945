"""A family of chi-square tests: each test flattened into a record (for JSON and for
resuming), Holm-adjusted together, with the smallest TV each one detects."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .chisquare import ChiSquareResult
from .multiple import holm_adjust
from .power import min_detectable_tv_gof, min_detectable_tv_homogeneity
from .thresholds import POWER


@dataclass(frozen=True)
class TestRecord:
    """One chi-square test in a family, flattened for JSON (and for resuming)."""

    unit: str  # what was tested (case / configuration / prompt) and where
    kind: str  # "gof" | "homogeneity"
    n_a: int
    n_b: int  # 0 for goodness of fit
    statistic: float
    dof: int
    pvalue: float
    n_groups: int
    tv: float
    tv_low: float
    tv_high: float
    tv_pooled: float
    min_detectable_tv: float = math.nan  # at the family's per-test worst-case level
    adjusted_p: float = math.nan  # Holm within the family
    rejected: bool = False

    @classmethod
    def from_test(cls, unit: str, r: ChiSquareResult) -> TestRecord:
        return cls(
            unit=unit,
            kind=r.kind,
            n_a=r.n_a,
            n_b=r.n_b,
            statistic=r.statistic,
            dof=r.dof,
            pvalue=r.pvalue,
            n_groups=r.n_groups,
            tv=r.tv.estimate,
            tv_low=r.tv.low,
            tv_high=r.tv.high,
            tv_pooled=r.tv_pooled,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def apply_holm(
    records: Sequence[TestRecord], alpha: float, power: float = POWER
) -> list[TestRecord]:
    """Holm-adjust a family of tests at family-wise level alpha; each record also gets the
    smallest pooled TV it detects with ``power`` at the Bonferroni level alpha / m (Holm's
    first step, the worst case)."""
    m = len(records)
    if m == 0:
        return []
    adj = holm_adjust([r.pvalue for r in records])
    out = []
    for r, a in zip(records, adj, strict=True):
        level = alpha / m
        if r.kind == "gof":
            mdt = min_detectable_tv_gof(r.n_a, r.dof, level, power)
        else:
            mdt = min_detectable_tv_homogeneity(r.n_a, r.n_b, r.dof, level, power)
        out.append(
            replace(r, adjusted_p=float(a), rejected=not bool(a > alpha), min_detectable_tv=mdt)
        )
    return out
