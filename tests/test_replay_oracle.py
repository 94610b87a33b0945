"""The replay's ceilings are exact: ``best_length_plan`` (the draft lengths planned over the
whole output) equals exhaustive enumeration of every length sequence, and the oracle rows
of ``benchmarks/studies/planner_replay.py`` use it. No model runs here."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

from specdec.profiler.predict import ProbeSequence, best_length_plan, plan_seconds
from specdec.theory import Costs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "studies"))
import planner_replay

WIDE = (1.00, 1.54, 2.07, 2.34, 2.96, 3.34, 4.50, 5.66)  # the wide curve's v(n)/v(1)
CURVES = {
    "wide": Costs(verify_s=WIDE, prefill_tps=math.inf),
    "linear": Costs(verify_s=tuple(1.0 + 0.5 * i for i in range(8)), prefill_tps=math.inf),
    "flat": Costs(verify_s=tuple(1.0 + 0.05 * i for i in range(8)), prefill_tps=math.inf),
    "jump": Costs(verify_s=(1.0, 1.2, 1.3, 3.0, 3.1, 3.2, 6.0, 6.1), prefill_tps=math.inf),
    "overheads": Costs(
        verify_s=WIDE,
        prefill_tps=math.inf,
        draft_round_s=0.15,
        draft_token_s=0.02,
        row_s=0.03,
        round_s=0.01,
    ),
}


def brute_force(seq: ProbeSequence, k: int, costs: Costs) -> float:
    """Fewest seconds over every sequence of draft lengths, enumerated one by one (each
    round at t may draft 0..its proposal, capped at K and at the tokens left - 1)."""
    best = math.inf
    total = seq.n_tokens

    def walk(t: int, seconds: float) -> None:
        nonlocal best
        if t >= total:
            best = min(best, seconds)
            return
        d, m = seq.round_at(t, min(k, total - t - 1))
        for length in range(d + 1):
            walk(t + min(length, m) + 1, seconds + costs.round_seconds(length))

    walk(0, 0.0)
    return best


def per_round_cut(seq: ProbeSequence, k: int, costs: Costs) -> float:
    """The previous oracle: each round cut to its own best tokens per second."""
    t, seconds = 0, 0.0
    while t < seq.n_tokens:
        _, m = seq.round_at(t, min(k, seq.n_tokens - t - 1))
        n = max(range(m + 1), key=lambda n: (n + 1) / costs.round_seconds(n))
        seconds += costs.round_seconds(n)
        t += n + 1
    return seconds


def dp_seconds(seq: ProbeSequence, k: int, costs: Costs) -> float:
    plan = best_length_plan(seq, k, costs)
    assert sum(a + 1 for a in plan.kept) == seq.n_tokens  # the plan emits the output exactly
    return plan_seconds(plan, costs)


@pytest.mark.parametrize("curve", sorted(CURVES))
def test_best_length_plan_equals_exhaustive_enumeration(curve: str) -> None:
    costs = CURVES[curve]
    rng = random.Random(10)
    for _ in range(60):
        n = rng.randint(1, 8)
        proposals = []
        for t in range(n):
            d = rng.randint(0, 8)
            proposals.append((d, rng.randint(0, min(d, n - t))))
        seq = ProbeSequence(1, n, proposals=tuple(proposals))
        for k in (2, 16):
            assert dp_seconds(seq, k, costs) == pytest.approx(brute_force(seq, k, costs), 1e-12)


def test_whole_output_plan_beats_per_round_cut() -> None:
    # At t = 0 the best round alone drafts 2 (3 tokens for v(3) = 2.07, 1.45 tokens per
    # step) and lands on t = 3, where only 1 draft fits before the end: 2.07 + 1.54 = 3.61.
    # A plain step first reaches t = 1, where 3 drafts finish the output: 1 + 2.34 = 3.34.
    costs = CURVES["wide"]
    seq = ProbeSequence(1, 5, proposals=((2, 2), (3, 3), (2, 2), (2, 2), (0, 0)))
    assert per_round_cut(seq, 16, costs) == pytest.approx(3.61)
    assert dp_seconds(seq, 16, costs) == pytest.approx(3.34)
    assert brute_force(seq, 16, costs) == pytest.approx(3.34)


def synthetic_traces(n: int, seed: int = 0) -> list[planner_replay.Trace]:
    """Traces over a 3-token vocabulary, so that the suffix index has candidates."""
    rng = random.Random(seed)
    traces = []
    for i in range(n):
        motif = [rng.randint(0, 2) for _ in range(rng.randint(2, 4))]
        prompt = [rng.randint(0, 2) for _ in range(rng.randint(2, 5))] + motif * 3
        noisy = [x if rng.random() > 0.2 else rng.randint(0, 2) for x in motif * 4]
        tokens = noisy[: rng.randint(3, 8)]
        traces.append({"id": str(i), "category": "c", "prompt_ids": prompt, "tokens": tokens})
    return traces


@pytest.mark.parametrize("curve", ["wide", "overheads"])
def test_replay_oracles_are_exact_ceilings(curve: str) -> None:
    costs = CURVES[curve]
    strictly_better = 0
    for tr in synthetic_traces(40):
        for probe, seconds in (
            (planner_replay.oracle_probe(tr), planner_replay.oracle_seconds(tr, costs)),
            (planner_replay.tree_probe(tr), planner_replay.tree_oracle_seconds(tr, costs)),
        ):
            exact, cut = brute_force(probe, 16, costs), per_round_cut(probe, 16, costs)
            assert seconds == pytest.approx(exact, 1e-12)
            assert seconds <= cut + 1e-12
            strictly_better += seconds < cut - 1e-9
    assert strictly_better > 0  # the per-round cut is not the ceiling on these traces


def test_tree_candidates_keep_at_least_the_suffix_proposal() -> None:
    for tr in synthetic_traces(40, seed=1):
        suffix = planner_replay.oracle_probe(tr).proposals
        tree = planner_replay.tree_probe(tr).proposals
        assert suffix is not None and tree is not None
        for (_, kept_suffix), (_, kept_tree) in zip(suffix, tree, strict=True):
            assert kept_tree >= kept_suffix
