"""Small shared pieces of the certificate levels: statuses, test records, Holm families."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from specdec.stats import ChiSquareResult, holm_adjust

PASS, FAIL, WARN, SKIPPED = "pass", "fail", "warn", "skipped"


def worst_status(statuses: Sequence[str]) -> str:
    """fail > warn > pass; skipped only when nothing else ran."""
    order = [FAIL, WARN, PASS]
    for s in order:
        if s in statuses:
            return s
    return SKIPPED


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


def apply_holm(records: Sequence[TestRecord], alpha: float, power: float = 0.8) -> list[TestRecord]:
    """Holm-adjust a family of tests at family-wise level alpha; each record also gets the
    smallest pooled TV it detects with ``power`` at the Bonferroni level alpha / m (Holm's
    first step, the worst case)."""
    from specdec.stats import min_detectable_tv_gof, min_detectable_tv_homogeneity

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


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with n torch intra-op threads, restoring the previous number after.

    Levels 1-2 work on tiny tensors, where a second thread only adds synchronisation (20x
    slower on a busy 2-core machine, measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
