"""The bench's micro-profile of one configuration: the target's verify curve, both sides' step
latencies and their ratio c, from the timed passes of ``profiler.passes``."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.core.drafter import Drafter
from specdec.core.model import CausalLM
from specdec.profiler.passes import (
    Clock,
    drafter_latency,
    flops_cost_ratio,
    param_count,
    profile_context,
    scaling_from_times,
    step_latency,
    verify_times,
)


@dataclass
class ConfigProfile:
    """The micro-profile of one configuration (times in seconds)."""

    config: str
    context_tokens: int
    repeats: int
    verify_n: list[int] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)  # target, median per n
    verify_ratio: list[float] = field(default_factory=list)  # verify(n) / verify(1)
    target_step_s: float = float("nan")
    draft_step_s: float = float("nan")
    draft_kind: str = "model"  # "model" | "model_free" (n-gram, suffix, planned: a lookup)
    c: float = float("nan")  # measured draft step / target step
    target_params: int | None = None
    draft_params: int | None = None
    c_flops: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_config(
    label: str,
    target: CausalLM,
    draft: CausalLM | Drafter,
    *,
    context_tokens: int = 100,
    n_max: int = 16,
    repeats: int = 3,
    clock: Clock = time.perf_counter,
) -> ConfigProfile:
    """Verify scaling of the target, step latencies of both sides and their ratio c."""
    ctx = profile_context(target, context_tokens)
    times = verify_times(target, ctx, n_max, repeats, clock=clock)
    prof = ConfigProfile(
        config=label,
        context_tokens=len(ctx),
        repeats=repeats,
        verify_n=list(range(1, n_max + 1)),
        verify_s=times,
        verify_ratio=scaling_from_times(times),
        target_step_s=times[0],
        target_params=param_count(target),
    )
    if isinstance(draft, CausalLM):
        prof.draft_step_s = step_latency(draft, ctx, max(repeats, 3), clock=clock)
        prof.draft_params = param_count(draft)
        prof.c_flops = flops_cost_ratio(prof.draft_params, prof.target_params)
    else:
        prof.draft_kind = "model_free"
        prof.draft_step_s = drafter_latency(draft, ctx, repeats, clock=clock)
    if prof.target_step_s > 0:
        prof.c = prof.draft_step_s / prof.target_step_s
    return prof
