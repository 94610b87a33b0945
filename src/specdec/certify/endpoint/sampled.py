"""Part 2 of ``certify --endpoint``: fixed statistics of independent sampled completions,
compared between the sides by chi-square tests of homogeneity (per prompt, combined over the
prompts), with their power; Holm over them and the per-token test together."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from specdec.stats.chisquare import (
    ChiSquareResult,
    chisquare_homogeneity,
    combined_homogeneity,
)
from specdec.stats.multiple import holm_adjust
from specdec.stats.power import min_detectable_tv_combined
from specdec.stats.simulated import simulated_power_combined

from .pertoken import EndpointPerTokenResult
from .plan import EndpointCertifyPlan

STATISTICS = ("piece 1", "piece 2", "piece 3", "text")
NONE = "<none>"
_PIECE = re.compile(r"\w+|[^\w\s]")  # a word, or one other non-space character


def statistics_of(text: str) -> dict[str, str]:
    """The tested statistics of one completion (fixed before any data are seen)."""
    pieces = _PIECE.findall(text)

    def piece(i: int) -> str:
        return pieces[i] if len(pieces) > i else NONE

    return {"piece 1": piece(0), "piece 2": piece(1), "piece 3": piece(2), "text": text}


def _table(on: Sequence[str], off: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    cats = sorted(set(on) | set(off))
    index = {c: i for i, c in enumerate(cats)}
    a = np.zeros(len(cats))
    b = np.zeros(len(cats))
    for v in on:
        a[index[v]] += 1
    for v in off:
        b[index[v]] += 1
    return cats, a, b


@dataclass(frozen=True)
class StatisticTest:
    name: str
    statistic: float
    dof: int
    pvalue: float
    adjusted_p: float
    rejected: bool
    per_prompt: tuple[dict[str, Any], ...]
    min_detectable_tv: float  # analytic, at alpha / m and the plan's power
    simulated_power: float  # at that TV, hardest_alternative on the observed frequencies


def sampled_tests(
    texts_on: Sequence[Sequence[str]],
    texts_off: Sequence[Sequence[str]],
    plan: EndpointCertifyPlan,
    rng: np.random.Generator,
    *,
    family: int = len(STATISTICS),
) -> list[StatisticTest]:
    """The four statistics' combined tests, Holm-adjusted among themselves, with their power
    at alpha / ``family`` (the size of the certificate's Holm family; ``joint_holm`` adjusts
    the whole family when the per-token test joins it)."""
    level = plan.alpha / family  # Holm's first step: a conservative level for the power
    raw: list[tuple[str, float, int, float, list[dict[str, Any]], float, float]] = []
    for name in STATISTICS:
        tables = []
        per_prompt = []
        n_eff = []
        for on, off in zip(texts_on, texts_off, strict=True):
            cats, a, b = _table(
                [statistics_of(t)[name] for t in on], [statistics_of(t)[name] for t in off]
            )
            r: ChiSquareResult = chisquare_homogeneity(a, b)
            tables.append((a, b))
            if r.dof > 0:
                n_eff.append(r.n_a * r.n_b / (r.n_a + r.n_b))
            top = sorted(range(len(cats)), key=lambda i: -(a[i] + b[i]))[:10]
            per_prompt.append(
                {
                    "pvalue": r.pvalue,
                    "dof": r.dof,
                    "categories": len(cats),
                    "groups": r.n_groups,
                    "tv": r.tv.estimate,
                    "top_values": [[cats[i], int(a[i]), int(b[i])] for i in top],
                }
            )
        combined = combined_homogeneity(tables)
        stat, dof, p = combined.statistic, combined.dof, combined.pvalue
        mdt = min_detectable_tv_combined(n_eff, dof, level, plan.power) if dof else math.nan
        live = [t for t in tables if chisquare_homogeneity(*t).dof > 0]
        sim = (
            simulated_power_combined(live, mdt, level, plan.power_trials, rng) if live else math.nan
        )
        raw.append((name, stat, dof, p, per_prompt, mdt, sim))
    adjusted = holm_adjust([r[3] for r in raw])
    return [
        StatisticTest(
            name=name,
            statistic=stat,
            dof=dof,
            pvalue=p,
            adjusted_p=float(adj),
            rejected=not bool(adj > plan.alpha),  # NaN: rejected
            per_prompt=tuple(pp),
            min_detectable_tv=mdt,
            simulated_power=sim,
        )
        for (name, stat, dof, p, pp, mdt, sim), adj in zip(raw, adjusted, strict=True)
    ]


def joint_holm(
    tests: Sequence[StatisticTest], pertoken: EndpointPerTokenResult | None, alpha: float
) -> tuple[list[StatisticTest], EndpointPerTokenResult | None]:
    """Holm over the sampled statistics and the per-token test together."""
    raw = [t.pvalue for t in tests] + ([pertoken.pvalue] if pertoken is not None else [])
    if not raw:
        return list(tests), pertoken
    adj = [float(a) for a in holm_adjust(raw)]
    out = [
        replace(t, adjusted_p=a, rejected=not a > alpha) for t, a in zip(tests, adj, strict=False)
    ]
    if pertoken is not None:
        a = adj[-1]
        rejected = not a > alpha or pertoken.impossible > 0  # an impossible token: rejected
        pertoken = replace(pertoken, adjusted_p=a, rejected=rejected)
    return out, pertoken
