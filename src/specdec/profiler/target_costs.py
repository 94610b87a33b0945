"""The target's measured costs on this machine, measured once and cached: what the
cost-aware suffix drafter (``drafters.planned``) needs when no full profile exists.

A full ``specdec profile`` takes minutes; these passes (the verify curve up to ``N_MAX``
tokens, the prefill throughput and the loop's overheads) take about 30-40 s for the 1.5B
Q4_K_M on llama.cpp on a 2-core CPU, most of it the passes of 17 to 65 rows. They are cached
per machine, package versions, model file (SHA-256) and backend settings like a profile, so
a later run never re-measures and a changed model never reuses stale numbers. The key holds
the passes measured (``N_MAX``, the sizes timed) and ``FORMAT``: a cache written for shorter
passes (17 rows, before drafts of 64) has another key and is measured again, never read as a
curve it does not hold; an entry whose curve is shorter than ``N_MAX`` is measured again too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from specdec.core.model import CausalLM
from specdec.errors import SpecdecError
from specdec.models.llamacpp import exact_attention
from specdec.models.loader import ModelConfig
from specdec.pairs import CostProvider, is_planned
from specdec.profiler import cache
from specdec.profiler.measure import PROFILE_NS, extended, target_costs
from specdec.theory import Costs, costs_from_dict
from specdec.util import cpuload
from specdec.util.printable import printable

# verify passes up to this many tokens: every pass a planned or predicted draft makes (a draft
# is capped at PLANNED_K = 64, so a pass has at most 65 rows); a draft never needs a longer
# pass than the curve holds (``drafters.planned.best_plan``)
N_MAX = 65
# medians of 5 passes per n: with 2, one slow pass skewed a cached curve (verify(2) at 1.97x)
REPEATS = 5
FORMAT = 2  # of the cached entry: 2 = curves to N_MAX rows measured at PROFILE_NS

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
        "format": FORMAT,
    }
    if cfg.exact:  # other kernels, other costs (absent otherwise, so older keys still hold);
        # 2: exact numerics keep the row-invariant optional kernels (llama_trust.exact_kernels);
        # their KV cache types are part of the key, as in the kernel verdict's and profile's
        settings["exact"] = 2
        settings["exact_kv"] = exact_attention().key()
    return cache.profile_key(target=cfg.model, drafts=(), settings=settings, prompts=[])


def cached_target_costs(
    cfg: ModelConfig, target: CausalLM, *, log: Log = lambda _: None, refresh: bool = False
) -> Costs:
    """The target's costs from the cache, or measured now (and cached). A damaged entry is
    measured again (``log`` hears one line); costs measured while other processes kept the
    machine busy (``util.cpuload``) serve this run and are not cached; a cache that cannot
    be written costs a measurement per run, said in one line, never the run."""
    key = costs_key(cfg)
    if not refresh:
        entry = cache.load_cached(key, log=log)
        hit = cached_costs(entry)
        if hit is not None:
            return hit
        if entry is not None:
            log(
                f"the cached costs {cache.profile_dir() / (key + '.json')} are damaged "
                f"({cost_damage(entry)}): measuring again"
            )
    n_max, context = fitted_passes(target.n_ctx)
    log(
        f"measuring the target's verify cost on this machine once (passes of 1..{n_max} "
        f"tokens{'; cached' if n_max == N_MAX else ''})"
    )
    before = cpuload.sample()
    costs = target_costs(target, n_max=n_max, context_tokens=context, repeats=REPEATS)
    share = cpuload.others_share(before, cpuload.sample())
    if cpuload.under_load(share):
        assert share is not None
        log(
            f"other processes used {share:.0%} of the CPUs while the costs were measured: "
            "they serve this run and are not cached (measured again next time)"
        )
        return costs
    if n_max == N_MAX:  # a window too small for the full curve: measured for this load only
        try:
            cache.save(key, {"costs": asdict(costs), "model": cfg.model})
        except (OSError, SpecdecError) as e:  # measured for this run; said once, in one line
            log(f"could not cache the costs in {cache.profile_dir()}: {printable(e, 300)}")
    return costs


def cost_damage(entry: dict[str, Any]) -> str:
    """Why a cache entry holds no costs (for the one line that says so)."""
    try:
        costs_from_dict(entry.get("costs"))
    except ValueError as e:
        return printable(e, 200)
    return f"a curve shorter than {N_MAX} passes"


def fitted_passes(n_ctx: int, context_tokens: int = 100) -> tuple[int, int]:
    """(longest pass, context) of the cost measurement in a window of ``n_ctx`` positions:
    passes to ``N_MAX`` after up to ``context_tokens`` of context where they fit, else half
    the window after the rest (a draft is never longer than the curve it is sized by)."""
    if n_ctx > N_MAX + 1:
        return N_MAX, min(context_tokens, n_ctx - N_MAX - 1)
    n_max = max(1, n_ctx // 2)
    return n_max, max(1, n_ctx - n_max - 1)


def cached_costs(entry: dict[str, Any] | None) -> Costs | None:
    """The costs of a cache entry, or None where it holds none or a curve shorter than
    ``N_MAX`` passes (then they are measured again)."""
    if entry is None:
        return None
    try:
        costs = costs_from_dict(entry.get("costs"))  # every field a number of its range
    except ValueError:  # damaged, or fields of another version
        return None
    return costs if len(costs.verify_s) >= N_MAX else None


def cost_provider(
    draft: str | None, profiled: Costs | None, *, exact: bool, log: Log = lambda _: None
) -> CostProvider | None:
    """Where a planned drafter (``draft``) gets the target's costs: the profile's
    (``profiled``) when it measured them and timed these numerics, else measured once on this
    machine and cached (``log`` hears when they are measured); None for any other drafter. A
    profile whose curve stops short of ``N_MAX`` passes (one cached before drafts of 64) is
    extended with the shape of the cached measurement (``measure.extended``), never
    extrapolated."""
    if not is_planned(draft):
        return None
    if profiled is not None and not exact:
        if len(profiled.verify_s) >= N_MAX:
            return lambda _cfg, _target: profiled
        return lambda cfg, target: extended(profiled, cached_target_costs(cfg, target, log=log))
    return lambda cfg, target: cached_target_costs(cfg, target, log=log)
