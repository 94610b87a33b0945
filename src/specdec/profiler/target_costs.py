"""The target's measured costs on this machine, measured once and cached: what the
cost-aware suffix drafter (``drafters.planned``) needs when no full profile exists.

A full ``specdec profile`` takes minutes; these few passes (the verify curve up to
``N_MAX`` tokens, the prefill throughput and the loop's overheads) take about 15-20 s for
the 1.5B Q4_K_M on llama.cpp on a 2-core CPU. They are cached per machine, package versions,
model file (SHA-256) and backend settings like a profile, so a later run never re-measures
and a changed model never reuses stale numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from specdec.models.base import CausalLM
from specdec.models.loader import ModelConfig
from specdec.pairs import CostProvider, is_planned
from specdec.profiler import cache
from specdec.profiler.measure import PROFILE_NS, target_costs
from specdec.theory import Costs

# verify passes up to this many tokens: every pass a planned or predicted draft makes (a draft
# is capped at PLANNED_K = 16, so a pass has at most 17 rows); longer ones are extrapolated
N_MAX = 17
# medians of 5 passes per n: with 2, one slow pass skewed a cached curve (verify(2) at 1.97x)
REPEATS = 5

Log = Callable[[str], None]


def costs_key(cfg: ModelConfig) -> str:
    settings: dict[str, Any] = {
        "kind": "target-costs",
        "backend": cfg.resolved_backend(),
        "device": cfg.device,
        "dtype": cfg.dtype,
        "n_threads": cfg.n_threads,
        "n_max": N_MAX,
        "repeats": REPEATS,
        "ns": list(PROFILE_NS),
    }
    if cfg.exact:  # other kernels, other costs (absent otherwise, so older keys still hold)
        settings["exact"] = True
    return cache.profile_key(target=cfg.model, drafts=(), settings=settings, prompts=[])


def cached_target_costs(
    cfg: ModelConfig, target: CausalLM, *, log: Log = lambda _: None, refresh: bool = False
) -> Costs:
    """The target's costs from the cache, or measured now (and cached)."""
    key = costs_key(cfg)
    if not refresh:
        hit = cache.load_cached(key)
        if hit is not None and isinstance(hit.get("costs"), dict):
            c = dict(hit["costs"])
            c["verify_s"] = tuple(c["verify_s"])
            return Costs(**c)
    log(
        f"measuring the target's verify cost on this machine once (passes of 1..{N_MAX} "
        "tokens; cached)"
    )
    costs = target_costs(target, n_max=N_MAX, repeats=REPEATS)
    cache.save(key, {"costs": asdict(costs), "model": cfg.model})
    return costs


def cost_provider(
    draft: str | None, profiled: Costs | None, *, exact: bool, log: Log = lambda _: None
) -> CostProvider | None:
    """Where a planned drafter (``draft``) gets the target's costs: the profile's
    (``profiled``) when it measured them and timed these numerics, else measured once on this
    machine and cached (``log`` hears when they are measured); None for any other drafter."""
    if not is_planned(draft):
        return None
    if profiled is not None and not exact:
        return lambda _cfg, _target: profiled
    return lambda cfg, target: cached_target_costs(cfg, target, log=log)
