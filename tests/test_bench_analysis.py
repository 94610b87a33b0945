"""Speedup and acceptance aggregation on hand-made records with exactly known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from specdec.bench.analysis import (
    ConfigSummary,
    attach_speedups,
    diagnose,
    fill_acceptance,
    overall_rate,
    pooled_acceptance,
    predicted_from_counts,
    predicted_from_rounds,
    speedup_cells,
    summarize_config,
    time_split_fractions,
    verdict,
)
from specdec.bench.results import read_results
from specdec.stats.bootstrap import Spread, cluster_bootstrap_geomean
from specdec.theory import predicted_speedup


def rec(prompt: str, k: int, tps: float, *, config: str = "A", mode: str = "greedy",
        repeat: int = 0, reached: list[int] | None = None,
        accepted: list[int] | None = None, category: str = "c") -> dict[str, Any]:  # fmt: skip
    return {
        "type": "measurement",
        "config": config,
        "mode": mode,
        "prompt_id": prompt,
        "category": category,
        "repeat": repeat,
        "k": k,
        "tokens_per_second": tps,
        "reached": reached or [0] * k,
        "accepted": accepted or [0] * k,
        "time_split": {"prefill": 1.0, "draft": 1.0, "verify": 2.0, "sampling": 0.0, "other": 0.0},
        "speedup": None,  # recomputed from the pairs, whatever the file says
    }


def hand_made() -> list[dict[str, Any]]:
    return [
        rec("p1", 0, 10.0),
        rec("p1", 2, 20.0, reached=[4, 2], accepted=[2, 1]),
        rec("p2", 0, 10.0),
        rec("p2", 2, 10.0, reached=[6, 3], accepted=[3, 0]),
        rec("p3", 0, 20.0),
        rec("p3", 2, 10.0, reached=[10, 0], accepted=[0, 0]),
        rec("p4", 2, 99.0),  # no plain partner: dropped from speedups
    ]


def test_speedups_pair_with_plain_of_same_prompt_and_repeat() -> None:
    sp = attach_speedups(hand_made())
    assert [(m["prompt_id"], m["speedup"]) for m in sp] == [("p1", 2.0), ("p2", 1.0), ("p3", 0.5)]
    cells = speedup_cells(hand_made())
    s = cells[("A", "greedy", 2)]
    assert (s.n, s.n_prompts) == (3, 3)
    assert s.geomean == pytest.approx(1.0)  # (2 * 1 * 0.5) ** (1/3)
    assert s.median == pytest.approx(1.0)
    assert (s.q25, s.q75) == (pytest.approx(0.75), pytest.approx(1.5))
    assert s.ci_low <= s.geomean <= s.ci_high
    assert s.ci_low >= 0.5 and s.ci_high <= 2.0


def test_bootstrap_resamples_prompts_not_measurements() -> None:
    # one prompt with many repeats is still a single unit: no CI
    lo, hi = cluster_bootstrap_geomean([2.0, 2.1, 1.9], ["p", "p", "p"])
    assert math.isnan(lo) and math.isnan(hi)
    lo, hi = cluster_bootstrap_geomean([1.5] * 6, ["a", "a", "b", "b", "c", "c"])
    assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)
    vals, cls = [1.0, 4.0], ["a", "b"]
    lo, hi = cluster_bootstrap_geomean(vals, cls)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(4.0)  # extremes of 2 clusters
    # a narrower level gives an interval inside the wider one
    vals, cls = [0.9, 0.95, 1.0, 1.02, 1.1, 0.97], ["a", "b", "c", "d", "e", "f"]
    lo95, hi95 = cluster_bootstrap_geomean(vals, cls)
    lo90, hi90 = cluster_bootstrap_geomean(vals, cls, level=0.90)
    assert lo95 < lo90 < hi90 < hi95


def test_acceptance_is_pooled_from_counts() -> None:
    reached, accepted = pooled_acceptance(hand_made())
    assert (reached, accepted) == ([20, 5], [5, 1])
    assert overall_rate(reached, accepted) == pytest.approx(6 / 25)
    assert fill_acceptance(reached, accepted) == [0.25, 0.2]
    # an unreached later position repeats the previous rate; an unreached first one is 0
    assert fill_acceptance([4, 0, 0], [2, 0, 0]) == [0.5, 0.5, 0.5]
    assert fill_acceptance([0, 0], [0, 0]) == [0.0, 0.0]


def test_predicted_speedup_uses_theory_with_measured_costs() -> None:
    vr = [1.0, 1.2, 1.5, 1.9]
    got = predicted_from_counts([10, 5], [5, 4], 2, 0.1, vr)
    assert got == pytest.approx(predicted_speedup([0.5, 0.8], 2, 0.1, vr))
    assert got == pytest.approx((1 + 0.5 + 0.4) / (2 * 0.1 + 1.5))
    assert predicted_from_counts([], [], 0, 0.1, vr) == 1.0
    assert predicted_from_counts([10], [5], 1, None, vr) is None


def test_time_split_fractions() -> None:
    fr = time_split_fractions(hand_made()[:2])
    assert fr == {"prefill": 0.25, "draft": 0.25, "verify": 0.5, "sampling": 0.0, "other": 0.0}


def profile(c: float, ratio: list[float]) -> dict[str, Any]:
    return {"type": "profile", "config": "A", "c": c, "verify_ratio": ratio}


def test_summary_best_k_plateau_and_verdicts() -> None:
    ms = []
    for p, base in (("p1", 10.0), ("p2", 12.0), ("p3", 8.0), ("p4", 11.0)):
        ms.append(rec(p, 0, base))
        for k, f in ((1, 1.5), (2, 1.6), (4, 1.1)):
            jitter = {"p1": 1.0, "p2": 1.15, "p3": 0.85, "p4": 1.08}[p]
            ms.append(rec(p, k, base * f * jitter, reached=[8] * k, accepted=[6] * k))
    cells = speedup_cells(ms)
    s = summarize_config("A", "greedy", cells, ms, profile(0.1, [1.0, 1.05, 1.1, 1.15, 1.2]))
    assert s.best_k == 2
    assert s.best is not None and s.best.geomean == pytest.approx(1.6, rel=0.02)
    assert s.plateau == [1, 2]  # K = 4 is clearly below
    assert s.verify5 == pytest.approx(1.2) and math.isnan(s.verify8)
    assert s.verdict.startswith("speculation pays")


def test_verdict_names_the_cost_that_hurts() -> None:
    accept = [0.7, 0.6, 0.5, 0.4]
    serial = [float(n) for n in range(1, 17)]
    flat = [1.0] * 16
    # serial verification with a cheap draft: the verify pass is to blame
    assert diagnose(accept, 0.05, serial, 4) == "verify"
    # batch-parallel verification with an expensive draft: the draft is to blame
    assert diagnose(accept, 0.9, flat, 4) == "draft"
    # nothing would help when nothing is accepted
    assert diagnose([0.0] * 4, 0.5, serial, 4) == "acceptance"

    def summary(geo: float, lo: float, hi: float, c: float, v5: float) -> ConfigSummary:
        s = ConfigSummary("A", "greedy", 4, Spread(4, 4, geo, lo, hi, geo, geo, geo))
        s.c, s.verify5 = c, v5
        return s

    v = verdict(summary(0.7, 0.6, 0.8, 0.05, 5.0), accept, serial, 4)
    assert v == "decelerates: verification is serial (verify(5)/verify(1) = 5.00)"
    v = verdict(summary(0.7, 0.6, 0.8, 0.9, 1.0), accept, flat, 4)
    assert v == "decelerates: draft not cheap enough (c = 0.90)"
    v = verdict(summary(1.05, 0.9, 1.2, 0.1, 1.0), accept, flat, 4)
    assert v.startswith("inconclusive")
    v = verdict(summary(1.3, float("nan"), float("nan"), 0.1, 1.0), accept, flat, 4)
    assert v.startswith("speculation pays")


def test_reader_tolerates_partial_tail_and_counts_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    lines = [json.dumps(r) for r in hand_made()]
    path.write_text("\n".join(lines[:3]) + "\nGARBAGE\n" + "\n".join(lines[3:]) + '\n{"type": "mea')
    res = read_results(path)
    assert len(res.measurements) == len(lines)
    assert res.bad_lines == [4] and res.partial_tail


def test_prediction_from_rounds_charges_the_drafts_really_verified() -> None:
    # 10 tokens from 4 plain steps and 2 rounds of 3 drafts (2 accepted + 1 each); a
    # model-free lookup costs c once per drafting round, a draft model c per drafted token
    vr = [1.0 + 0.5 * i for i in range(9)]  # verify(n) / verify(1) = 1, 1.5, 2, ...
    hist = [4, 0, 0, 2]  # rounds by drafts verified
    free = predicted_from_rounds(hist, 10, 8, 0.1, vr, "suffix")
    assert free == pytest.approx(10 / (4 * 1.0 + 2 * (2.5 + 0.1)))
    model = predicted_from_rounds(hist, 10, 8, 0.1, vr, "model")
    assert model == pytest.approx(10 / (4 * 1.0 + 2 * (2.5 + 3 * 0.1)))
    # the positional formula charges every round K = 8 drafts: about half
    assert predicted_from_counts([2, 2, 2], [2, 2, 0], 8, 0.1, vr) is None  # too few counts
    assert predicted_speedup([1.0, 1.0, 0.0] + [0.0] * 5, 8, 0.1, vr) < free / 2
    # rounds that drafted nothing are plain steps; no rounds or no costs: no prediction
    assert predicted_from_rounds([5], 5, 8, 0.1, vr, "suffix") == pytest.approx(1.0)
    assert predicted_from_rounds([0, 0], 5, 8, 0.1, vr, "suffix") is None
    assert predicted_from_rounds(hist, 10, 8, None, vr, "suffix") is None
    assert predicted_from_rounds(hist, 10, 0, 0.1, vr, "suffix") == 1.0
