"""``--auto``: turn a profile into the configuration to run for one request.

The profile's recommendation is the fastest *measured* configuration at the probe's size.
For a request whose prompt is much longer than the probe's, the prediction is re-ranked for
the request's size (prefill time then weighs more: a draft model's own prefill can cost more
than its decoding wins back). K adapts inside the generation with ``ProfileK``: the profile's
costs and the probe's acceptance as the prior, updated from the rounds' acceptance counts
only, so a fixed seed gives a fixed output and K trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec.core.policy import FixedK, KPolicy, ProfileK
from specdec.pairs import PLANNED_K, is_planned
from specdec.profiler.decide import Candidate
from specdec.profiler.run import (
    ProfileResult,
    ProfileSpec,
    cached_profile,
    run_profile,
)
from specdec.theory import Costs

# re-rank by prediction when the request's prompt is this many times the probe's mean
LONG_PROMPT_FACTOR = 2.0


@dataclass(frozen=True)
class AutoChoice:
    """What ``--auto`` runs."""

    target_backend: str
    draft_ref: str  # "none" for plain decoding
    k: int  # the best fixed K of the profile (the cap of the adaptive policy is 2K, <= 16)
    costs: Costs | None  # None: the planned drafter measures (or reads) the target's own
    prior: tuple[float, ...]  # acceptance by position from the probe
    label: str
    reason: str
    # exact numerics: a full profile's decision (profiler.exact_price); None where no profile
    # decided (configuration.default_numerics decides then)
    exact: bool | None = None

    @property
    def speculative(self) -> bool:
        return self.draft_ref != "none" and self.k > 0

    def policy(self) -> KPolicy:
        """A fresh K policy for one generation. A planned drafter sizes its own drafts (the
        policy only caps them); other drafters get a ``ProfileK`` on the profile's costs."""
        if not self.speculative:
            return FixedK(0)
        if is_planned(self.draft_ref) or self.costs is None:
            return FixedK(PLANNED_K if is_planned(self.draft_ref) else self.k)
        return ProfileK(self.costs, k_max=min(16, 2 * self.k), prior_accept=self.prior)


def unprofiled_choice(target_backend: str) -> AutoChoice:
    """The default before any profile of this machine exists: the target on its natural
    backend (llama.cpp for GGUF files) with the cost-aware suffix drafter, which drafts only
    where the context repeats and only as far as the target's measured verify cost pays for,
    so on text without repeats it runs as plain decoding."""
    return AutoChoice(
        target_backend=target_backend,
        draft_ref="planned",
        k=PLANNED_K,
        costs=None,
        prior=(),
        label=f"planned -> {target_backend}",
        reason="no profile of this machine yet (`specdec profile` measures every "
        "configuration and picks); suffix drafts where the text repeats, cut to what the "
        "target's measured verify cost pays for, plain steps elsewhere",
    )


def choose(result: ProfileResult, prompt_tokens: int | None, new_tokens: int) -> AutoChoice:
    """The configuration for a request (prompt_tokens None: the probe's size)."""
    rec = result.recommendation
    cand = Candidate(**rec["candidate"])
    k, reason = int(rec["k"]), str(rec["reason"])
    probe_mean = sum(result.prompt_tokens) / max(len(result.prompt_tokens), 1)
    if prompt_tokens is not None and prompt_tokens > LONG_PROMPT_FACTOR * probe_mean:
        ranked = result.rank_for(prompt_tokens, new_tokens)
        cand, k = ranked.best.candidate, ranked.best.k
        reason = f"long prompt ({prompt_tokens} tokens): " + ranked.reason
    ref = result.draft_refs.get(cand.drafter, cand.drafter)
    return AutoChoice(
        target_backend=cand.target_backend,
        draft_ref=ref,
        k=k,
        costs=result.costs_for(cand),
        prior=tuple(result.probe_accept.get(cand.drafter, [])),
        label=cand.label,
        reason=reason,
        exact=bool(rec.get("exact", False)),
    )


def auto_profile(
    target: str,
    *,
    draft: str | None,
    target_backend: str,
    draft_backend: str,
    n_ctx: int,
    n_threads: int | None,
    log: Callable[[str], None] = lambda _: None,
    cached_only: bool = False,
) -> ProfileResult | None:
    """The (cached) profile ``--auto`` decides from, on the packaged probe prompts. Left at
    their defaults, ``draft`` and ``target_backend`` let the profile choose; other values
    narrow what it considers. ``cached_only``: None instead of profiling."""
    from specdec.pairs import DEFAULT_DRAFT, DEFAULT_TARGET_BACKEND
    from specdec.prompt_sets import select_prompts

    # "auto" (a store GGUF draft on llama.cpp) is the profile's own default, so that the
    # profile `specdec profile` caches is the one `generate` finds
    narrow: dict[str, Any] = {} if draft_backend == "auto" else {"draft_backend": draft_backend}
    if target_backend != DEFAULT_TARGET_BACKEND:
        narrow["target_backends"] = (target_backend,)
    if draft != DEFAULT_DRAFT:
        narrow["drafts"] = (draft or "none",)
    spec = ProfileSpec(target=target, n_ctx=n_ctx, n_threads=n_threads, **narrow)
    prompts = [p.text for p in select_prompts(None, per_category=1)]
    if cached_only:
        return cached_profile(spec, prompts, log)
    return run_profile(spec, prompts, log=log)


def machine_default(
    target: str,
    *,
    target_backend: str,
    draft_backend: str,
    n_ctx: int,
    n_threads: int | None,
    prompt_tokens: int | None = None,
    new_tokens: int = 128,
) -> AutoChoice:
    """What runs when nothing about speculation was chosen: the cached profile's choice when
    this machine has one for the target, else ``unprofiled_choice`` on the target's own
    backend. Nothing is measured here (``--auto`` profiles)."""
    from specdec.models.loader import ModelConfig
    from specdec.pairs import DEFAULT_DRAFT

    result = auto_profile(
        target,
        draft=DEFAULT_DRAFT,
        target_backend=target_backend,
        draft_backend=draft_backend,
        n_ctx=n_ctx,
        n_threads=n_threads,
        cached_only=True,
    )
    if result is not None:
        return choose(result, prompt_tokens, new_tokens)
    return unprofiled_choice(ModelConfig(target, target_backend).resolved_backend())
