"""The speed model of speculative decoding (pure functions).

Units: one plain target step costs 1. A round drafting K tokens costs K * c (c = draft step
time / target step time) plus verify(K + 1), the cost of one target pass over K + 1 tokens
relative to one token (1 for perfectly batch-parallel verification, K + 1 for serial).
``Costs`` holds the same quantities in seconds, as measured on a machine (``specdec profile``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def expected_tokens_per_round(accept: Sequence[float], k: int) -> float:
    """E[tokens emitted] of a round with K drafts and positional acceptance a_1..a_K
    (a_i = P(accept draft i | drafts 1..i-1 accepted)): 1 + sum_i prod_{j<=i} a_j."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= accept[i]
        total += reach
    return total


def geometric_tokens_per_round(alpha: float, k: int) -> float:
    """(1 - a^(K+1)) / (1 - a): the constant-acceptance formula of Leviathan et al."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def round_cost(k: int, c: float, verify_cost: Sequence[float] | None = None) -> float:
    """Cost of one round with K drafts of a draft model (c per drafted token) in target-step
    units; verify_cost[n-1] = verify(n) / verify(1)."""
    return round_cost_varied(k, c, verify_cost, per_token=True)


def predicted_speedup(
    accept: Sequence[float], k: int, c: float, verify_cost: Sequence[float] | None = None
) -> float:
    """Predicted wall-clock speedup over plain decoding for K drafts per round."""
    return expected_tokens_per_round(accept, k) / round_cost(k, c, verify_cost)


def round_cost_varied(
    drafted: int, c: float, verify_cost: Sequence[float] | None, *, per_token: bool
) -> float:
    """Cost in target-step units of a round that drafted ``drafted`` tokens (0: a plain step).
    A model draft pays c per drafted token (``per_token``); a model-free lookup pays c once
    per round that drafted anything."""
    if drafted == 0:
        return 1.0
    v = 1.0 if verify_cost is None else float(verify_cost[min(drafted, len(verify_cost) - 1)])
    return (drafted * c if per_token else c) + v


def predicted_speedup_from_rounds(
    draft_lengths: Sequence[int],
    tokens: int,
    c: float,
    verify_cost: Sequence[float] | None,
    *,
    per_token: bool,
) -> float:
    """Predicted speedup of a run from its round structure: ``tokens`` emitted over rounds of
    which draft_lengths[j] drafted j tokens [K + 1], each round costed by
    ``round_cost_varied``; plain decoding costs 1 per token. Unlike ``predicted_speedup`` it
    charges a round for the drafts it really verified, so drafters whose drafts are shorter
    than K (suffix lookup, cost-aware lengths) are not charged K."""
    cost = sum(
        n * round_cost_varied(j, c, verify_cost, per_token=per_token)
        for j, n in enumerate(draft_lengths)
        if n
    )
    return tokens / cost if cost > 0 else float("nan")


def best_k(
    accept: Sequence[float], c: float, verify_cost: Sequence[float] | None, k_max: int
) -> int:
    """The K in 0..k_max with the highest predicted speedup (0 when nothing beats plain)."""
    best, best_val = 0, 1.0
    for k in range(1, k_max + 1):
        if verify_cost is not None and k >= len(verify_cost):
            break
        val = predicted_speedup(accept, k, c, verify_cost)
        if val > best_val + 1e-9:
            best, best_val = k, val
    return best


@dataclass(frozen=True)
class Costs:
    """Measured costs of one target backend with one drafter (seconds)."""

    verify_s: tuple[float, ...]  # verify_s[n-1]: one target pass over n tokens
    prefill_tps: float  # target prefill throughput, tokens / s
    draft_token_s: float = 0.0  # per drafted token (model drafts)
    draft_round_s: float = 0.0  # per round with a draft (model-free lookup, sync)
    draft_prefill_tps: float = math.inf  # a model draft's own prefill throughput
    row_s: float = 0.0  # loop overhead per verified row
    round_s: float = 0.0  # loop overhead per round (bookkeeping outside model and rows)

    def verify(self, n: int) -> float:
        """Seconds of one pass over n tokens; linear extrapolation past the measured curve."""
        assert n >= 1
        v = self.verify_s
        if n <= len(v):
            return v[n - 1]
        slope = (v[-1] - v[-2]) if len(v) >= 2 else v[-1]
        return v[-1] + max(slope, 0.0) * (n - len(v))

    @property
    def step_s(self) -> float:
        """One plain decode step."""
        return self.verify_s[0] + self.row_s + self.round_s

    def round_seconds(self, drafted: int) -> float:
        """Expected seconds of a round that verifies ``drafted`` drafts (0: a plain step)."""
        seconds = self.verify(drafted + 1) + (drafted + 1) * self.row_s + self.round_s
        if drafted > 0:
            seconds += drafted * self.draft_token_s + self.draft_round_s
        return seconds


def costs_from_dict(d: object) -> Costs:
    """Costs from their JSON (a cache entry, a profile): every field a real number of the
    right range (a pass's seconds finite and > 0, overheads finite and >= 0, throughputs > 0,
    infinite allowed), or ValueError naming the first field that is not (a damaged entry
    read as costs failed deep inside the planner, or planned with nonsense)."""
    if not isinstance(d, dict):
        raise ValueError("the costs are not a JSON object")
    fields = Costs.__dataclass_fields__
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"unknown cost fields {unknown[:3]}")

    def real(name: str, x: object, *, positive: bool, infinite: bool) -> float:
        ok = isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)
        if ok and (math.isinf(x) and not infinite):  # type: ignore[arg-type]
            ok = False
        if ok and (x <= 0 if positive else x < 0):  # type: ignore[operator]
            ok = False
        if not ok:
            raise ValueError(f"{name} is {x!r}, not a {'positive' if positive else '>= 0'} number")
        return float(x)  # type: ignore[arg-type]

    verify = d.get("verify_s")
    if not isinstance(verify, list | tuple) or not verify:
        raise ValueError("verify_s is not a non-empty list of seconds")
    out: dict[str, object] = {
        "verify_s": tuple(
            real(f"verify_s[{i}]", v, positive=True, infinite=False) for i, v in enumerate(verify)
        )
    }
    if "prefill_tps" not in d:
        raise ValueError("prefill_tps is missing")
    for name in fields:
        if name == "verify_s" or name not in d:
            continue
        rate = name.endswith("_tps")
        out[name] = real(name, d[name], positive=rate, infinite=rate)
    return Costs(**out)  # type: ignore[arg-type]


def draft_model_ceiling(c: float, verify_ratio: Sequence[float]) -> tuple[int, float]:
    """(best K, ceiling): the most a draft model with step cost c can speed up decoding on a
    verify curve even if every draft is accepted.

    A round drafting K tokens costs K * c + verify(K + 1) / verify(1) target steps and emits at
    most K + 1 tokens, so the speedup over plain decoding is at most

        max over K = 1 .. len(verify_ratio) - 1 of (K + 1) / (K * c + verify_ratio[K])

    c             draft step time / target step time, finite and >= 0
    verify_ratio  [N], verify_ratio[n - 1] = verify(n) / verify(1) for n = 1 .. N (so
                  verify_ratio[0] == 1); N >= 2, every entry finite and > 0

    The ceiling ignores drafting's other costs (the draft's prefill, the pass over the
    accepted tokens); K = 0 (plain decoding, 1.0) is not a candidate, so a ceiling below 1
    says no K pays even with perfect acceptance. Ties keep the smallest K.
    """
    if not (math.isfinite(c) and c >= 0.0):
        raise ValueError(f"draft step cost c must be finite and >= 0, got {c}")
    v = [float(x) for x in verify_ratio]
    if len(v) < 2:
        raise ValueError(f"verify_ratio needs verify(1) and verify(2) at least, got {len(v)}")
    if not all(math.isfinite(x) and x > 0.0 for x in v):
        raise ValueError("verify_ratio entries must be finite and > 0")
    if abs(v[0] - 1.0) > 1e-9:
        raise ValueError(f"verify_ratio[0] is verify(1) / verify(1) = 1, got {v[0]}")
    best, best_val = 0, -math.inf
    for k in range(1, len(v)):
        val = (k + 1) / round_cost(k, c, v)  # K c + verify(K + 1) / verify(1)
        if val > best_val:
            best, best_val = k, val
    return best, best_val


def copy_ceiling(alpha: float, verify_ratio: Sequence[float]) -> tuple[int, float]:
    """(best K, speedup over plain decoding) of drafts whose tokens are each kept with
    probability ``alpha`` (given the ones before), at the K that pays most on a verify curve:

        max over K = 0 .. len(verify_ratio) - 1 of E(alpha, K) / verify_ratio[K],
        E(alpha, K) = (1 - alpha^(K + 1)) / (1 - alpha)   (``geometric_tokens_per_round``)

    verify_ratio  [N], verify_ratio[n - 1] = verify(n) / verify(1), N >= 1 (a draft of K
                  needs K + 1 rows, so K stops at the measured curve's end)

    K = 0 is plain decoding (1.0). For an all-accepted copy (alpha = 1) this is the best
    (K + 1) / verify(K + 1). Drafting costs nothing here: the ceiling of a model-free drafter
    (a prediction, a copy) whose acceptance is alpha, on this machine's curve. Ties keep
    the smallest K."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    v = [float(x) for x in verify_ratio]
    if not v or not all(math.isfinite(x) and x > 0.0 for x in v):
        raise ValueError("verify_ratio needs at least verify(1), every entry finite and > 0")
    best, best_val = 0, 1.0 / v[0]
    for k in range(1, len(v)):
        val = geometric_tokens_per_round(alpha, k) / v[k]
        if val > best_val * (1.0 + 1e-12):
            best, best_val = k, val
    return best, best_val
