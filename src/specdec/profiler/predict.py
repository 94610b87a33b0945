"""Predict what a configuration will do, from measured costs and a greedy acceptance probe
(pure functions: no model is run here).

Costs (seconds, measured on this machine by ``profiler.measure``):
    verify_s[n-1]   one target pass over n new tokens (n = 1 is a plain decode step)
    prefill_tps     the target's prefill throughput (tokens / s)
    draft_token_s   a model draft's cost per drafted token (0 for model-free drafters)
    draft_round_s   a drafter's fixed cost per round (lookup, bookkeeping)
    row_s           the loop's per-row cost (logits -> probabilities, the verifier)

The probe: greedy speculative decoding emits exactly the target's greedy output, so a round
that starts at position t keeps the longest prefix of the drafter's proposal that equals the
target's own tokens from t. ``ProbeSequence`` holds, for one prompt, the target's greedy
continuation and, for every position t, what the drafter would propose there. For a greedy
model draft that is one number per position: the run of consecutive positions from t where
the draft's argmax (teacher-forced on the target's text) equals the target's token, because a
draft that agrees keeps seeing exactly the target's context. For a model-free drafter the
proposal is computed directly. Simulating the rounds on that sequence for a given K gives the
exact rounds a greedy run would have (up to batch-shape numerics), including drafts shorter
than K, so the prediction needs no constant-acceptance assumption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from specdec.theory import Costs


@dataclass(frozen=True)
class ProbeSequence:
    """One prompt's greedy probe.

    prompt_tokens: prompt length.
    n_tokens:      length of the target's greedy continuation that was probed.
    run:           for model drafts, run[t] = consecutive agreeing positions from t (draft
                   argmax == target token), capped at the probe's K max; None for model-free.
    proposals:     for model-free drafters, proposals[t] = (drafted, matched) for the K max of
                   the probe: how many tokens the drafter proposes at t and how many of them
                   match the target's continuation. With a smaller K the drafter proposes
                   min(drafted, K) and keeps min(matched, K) (a prefix of the same lookup).
    """

    prompt_tokens: int
    n_tokens: int
    run: tuple[int, ...] | None = None
    proposals: tuple[tuple[int, int], ...] | None = None

    def round_at(self, t: int, k: int) -> tuple[int, int]:
        """(drafted, kept) for a round starting at continuation position t with K = k."""
        if k <= 0:
            return 0, 0
        if self.run is not None:
            return k, min(self.run[t], k)
        assert self.proposals is not None
        drafted, matched = self.proposals[t]
        return min(drafted, k), min(matched, k)


@dataclass(frozen=True)
class RoundPlan:
    """The rounds a greedy run would make on a probe sequence."""

    drafted: tuple[int, ...]  # per round
    kept: tuple[int, ...]  # per round

    @property
    def tokens(self) -> int:
        return sum(k + 1 for k in self.kept)


def simulate(seq: ProbeSequence, k: int, n_tokens: int | None = None) -> RoundPlan:
    """The rounds of a greedy run with K = k over the probe's continuation (the last round is
    cut at the end, as ``max_new_tokens`` cuts it)."""
    total = seq.n_tokens if n_tokens is None else min(n_tokens, seq.n_tokens)
    t = 0
    drafted: list[int] = []
    kept: list[int] = []
    while t < total:
        remaining = total - t
        d, a = seq.round_at(t, min(k, remaining - 1))
        drafted.append(d)
        kept.append(a)
        t += a + 1
    return RoundPlan(tuple(drafted), tuple(kept))


def plan_seconds(plan: RoundPlan, costs: Costs) -> float:
    """Decode seconds of a round plan (no prefill)."""
    return sum(costs.round_seconds(d) for d in plan.drafted)


def best_length_plan(
    seq: ProbeSequence, k: int, costs: Costs, n_tokens: int | None = None
) -> RoundPlan:
    """The round plan with the fewest decode seconds over the probe's continuation when every
    round may draft any length L from 0 to what the drafter proposes at its position (capped
    at K and at the tokens left - 1, as ``simulate`` caps it), knowing how much is kept: the
    ceiling of every draft-length policy over these proposals (it reads the continuation, so
    it is not a drafter).

    A round at position t with draft length L keeps a = min(L, matched_t) drafts plus one
    token and costs ``costs.round_seconds(L)``; under greedy decoding what is proposed and
    kept at t depends only on t (the context is the prompt plus the fixed continuation up to
    t), so the best plan is a shortest path over positions, solved backwards:
    best[t] = min over L of round_seconds(L) + best[min(t + a + 1, total)], best[total] = 0.
    Cutting each round to its own best tokens per second instead (greedy) can land on a
    position where the drafter has nothing and cost more over the whole output."""
    total = seq.n_tokens if n_tokens is None else min(n_tokens, seq.n_tokens)
    best = [math.inf] * total + [0.0]  # best[t]: fewest seconds from position t to the end
    choice = [(0, 0)] * total  # choice[t]: (drafted, kept) of the first round of best[t]
    for t in range(total - 1, -1, -1):
        d, m = seq.round_at(t, min(k, total - t - 1))
        for length in range(d + 1):  # lengths past m are legal, only never better
            a = min(length, m)
            s = costs.round_seconds(length) + best[min(t + a + 1, total)]
            if s < best[t]:
                best[t], choice[t] = s, (length, a)
    drafted: list[int] = []
    kept: list[int] = []
    t = 0
    while t < total:
        d, a = choice[t]
        drafted.append(d)
        kept.append(a)
        t += a + 1
    return RoundPlan(tuple(drafted), tuple(kept))


@dataclass
class Prediction:
    """Predicted speed of one (configuration, K) over the probe sequences."""

    config: str
    k: int
    decode_s: float  # predicted decode seconds over all probe sequences
    prefill_s: float  # predicted prefill seconds (target, plus a model draft's own)
    tokens: int  # generated tokens over the probe sequences
    prompt_tokens: int  # prompt tokens over the probe sequences
    mean_drafted: float  # drafted tokens per round
    mean_kept: float  # kept drafts per round
    rounds: int
    notes: list[str] = field(default_factory=list)

    @property
    def decode_tps(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else math.inf

    @property
    def e2e_s(self) -> float:
        return self.prefill_s + self.decode_s


def predict(
    config: str, costs: Costs, seqs: Sequence[ProbeSequence], k: int, *, model_draft: bool
) -> Prediction:
    """Predicted decode and prefill time of ``config`` with K = k over the probe sequences."""
    decode = prefill = 0.0
    tokens = rounds = drafted = kept = prompt = 0
    for seq in seqs:
        prompt += seq.prompt_tokens
        plan = simulate(seq, k)
        decode += plan_seconds(plan, costs)
        prefill += seq.prompt_tokens / costs.prefill_tps
        if model_draft and k > 0:
            prefill += seq.prompt_tokens / costs.draft_prefill_tps
        tokens += plan.tokens
        rounds += len(plan.kept)
        drafted += sum(plan.drafted)
        kept += sum(plan.kept)
    return Prediction(
        config=config,
        k=k,
        decode_s=decode,
        prefill_s=prefill,
        tokens=tokens,
        prompt_tokens=prompt,
        mean_drafted=drafted / rounds if rounds else 0.0,
        mean_kept=kept / rounds if rounds else 0.0,
        rounds=rounds,
    )


def runs_from_matches(matches: Sequence[bool], cap: int) -> tuple[int, ...]:
    """run[t] = consecutive True from t (capped): a greedy draft's kept length at t."""
    run = [0] * len(matches)
    nxt = 0
    for t in range(len(matches) - 1, -1, -1):
        nxt = min(nxt + 1, cap) if matches[t] else 0
        run[t] = nxt
    return tuple(run)


def pass_ceiling_tps(points: Sequence[tuple[int, float]]) -> float:
    """The most tokens per second ANY speculative decoding can reach on a target whose
    verification passes were timed at ``points`` = [(n rows, seconds)], ascending n from 1 up
    to the largest pass a round can have.

    Drafts are taken as free and every one as accepted, so a pass over n rows yields at most
    n tokens in v(n) seconds. Between two timed points a < b a pass over n rows (a <= n <= b)
    costs at least v(a), since more rows never cost less, so n / v(n) <= b / v(a); the ceiling
    is the largest of these bounds and of n_last / v(n_last)."""
    if not points or points[0][0] != 1:
        raise ValueError("the ceiling needs timed passes starting at n = 1")
    ns = [n for n, _ in points]
    if any(b <= a for a, b in pairwise(ns)):
        raise ValueError(f"the timed pass sizes must ascend, got {ns}")
    if any(not (s > 0 and math.isfinite(s)) for _, s in points):
        raise ValueError("every timed pass must take a positive, finite time")
    bounds = [b / v_a for (_, v_a), (b, _) in pairwise(points)]
    n_last, v_last = points[-1]
    return max([*bounds, n_last / v_last])
