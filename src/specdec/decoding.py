"""The decoding loop: prefill, draft K, verify K + 1 in one target pass, accept/reject,
roll back. K = 0 (or no drafter) is plain target-only decoding through the same code.

Cache invariant between rounds (L = len(context)):
    target cache = context[:L-1]       (the last token is fed at the start of the next round)
    draft cache  <= context            (the drafter syncs itself; see ModelDrafter)
A round feeds the target [context[-1], x_1..x_K] and gets K + 1 rows: row i is p_{i+1}, the
target's distribution for the position of draft i + 1, row K the bonus distribution. After
n acceptances the target cache is truncated to L + n, which is the new context minus its last
(freshly sampled) token: the invariant holds again without ever re-prefilling.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.model import ModelDrafter
from specdec.errors import ConfigError, ContextOverflowError, EmptyPromptError, VocabMismatchError
from specdec.models.base import CausalLM, cached_prefix_len
from specdec.policy import FixedK, KPolicy, RoundObservation
from specdec.rejection import accept_reject
from specdec.sampling import SamplingConfig, logits_to_probs, make_generator
from specdec.timing import Stopwatch, delta


@dataclass
class RoundStats:
    """What one round did. Times in seconds."""

    k: int  # drafts proposed this round (after clamping); 0 = a plain step
    n_accepted: int  # drafts accepted (0..k)
    n_emitted: int  # tokens kept from this round (after EOS / length cut)
    t_draft: float
    t_verify: float
    t_sampling: float
    t_round: float


@dataclass
class RoundEvent:
    """Yielded once per round by ``generate_stream``."""

    tokens: list[int]
    stats: RoundStats


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int]
    rounds: list[RoundStats]
    finish_reason: str  # "length" | "eos" | "context"
    t_prefill: float
    t_total: float  # wall time of prefill plus all rounds
    drafter: str = "none"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    @property
    def tokens_per_second(self) -> float:
        t = self.t_total - self.t_prefill
        return len(self.tokens) / t if t > 0 else float("nan")

    @property
    def e2e_tokens_per_second(self) -> float:
        """Tokens per second of wall time including prefill (what a user waits for)."""
        return len(self.tokens) / self.t_total if self.t_total > 0 else float("nan")

    @property
    def mean_tokens_per_round(self) -> float:
        """Tokens emitted per round (1 + mean accepted drafts, before cuts)."""
        return len(self.tokens) / len(self.rounds) if self.rounds else float("nan")

    @property
    def mean_accepted_per_round(self) -> float:
        return float(np.mean([r.n_accepted for r in self.rounds])) if self.rounds else 0.0

    def acceptance_counts(self) -> tuple[list[int], list[int]]:
        """(reached[i], accepted[i]) for draft position i = 1..max K (0-based lists)."""
        kmax = max((r.k for r in self.rounds), default=0)
        reached, accepted = [0] * kmax, [0] * kmax
        for r in self.rounds:
            for i in range(min(r.k, r.n_accepted + 1)):
                reached[i] += 1
                accepted[i] += int(i < r.n_accepted)
        return reached, accepted

    def acceptance_by_position(self) -> list[float]:
        """P(accept draft i | drafts 1..i-1 accepted), i = 1..max K (nan when never reached)."""
        reached, accepted = self.acceptance_counts()
        return [a / n if n else float("nan") for a, n in zip(accepted, reached, strict=True)]

    def time_split(self) -> dict[str, float]:
        """Seconds in prefill / draft / verify / sampling / other (sums to t_total)."""
        d = sum(r.t_draft for r in self.rounds)
        v = sum(r.t_verify for r in self.rounds)
        s = sum(r.t_sampling for r in self.rounds)
        other = self.t_total - self.t_prefill - d - v - s
        return {"prefill": self.t_prefill, "draft": d, "verify": v, "sampling": s, "other": other}

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": len(self.prompt_ids),
            "tokens": self.tokens,
            "n_tokens": len(self.tokens),
            "finish_reason": self.finish_reason,
            "drafter": self.drafter,
            "rounds": len(self.rounds),
            "tokens_per_second": self.tokens_per_second,
            "e2e_tokens_per_second": self.e2e_tokens_per_second,
            "mean_tokens_per_round": self.mean_tokens_per_round,
            "mean_accepted_per_round": self.mean_accepted_per_round,
            "acceptance_by_position": self.acceptance_by_position(),
            "time_split": self.time_split(),
            "t_total": self.t_total,
            "round_stats": [asdict(r) for r in self.rounds],
            **self.extra,
        }


def _as_drafter(draft: CausalLM | Drafter | None, target: CausalLM) -> Drafter | None:
    if draft is None:
        return None
    if hasattr(draft, "propose"):
        return draft  # type: ignore[return-value]
    model: CausalLM = draft
    if model is target:
        raise ConfigError("draft and target must be separate model instances (own caches)")
    if model.vocab_size != target.vocab_size:
        raise VocabMismatchError(
            f"draft vocabulary has {model.vocab_size} tokens, target has {target.vocab_size}"
        )
    return ModelDrafter(model)


def _context_limit(target: CausalLM, drafter: Drafter | None) -> int:
    limit = target.n_ctx
    if isinstance(drafter, ModelDrafter):
        limit = min(limit, drafter.model.n_ctx)
    return limit


def validate_request(prompt_ids: Sequence[int], max_new_tokens: int, n_ctx: int) -> None:
    if len(prompt_ids) == 0:
        raise EmptyPromptError("the prompt is empty (it encodes to zero tokens)")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompt_ids) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt has {len(prompt_ids)} tokens but the context window is {n_ctx} "
            "(room for at least one new token is needed)"
        )


def generate_stream(
    target: CausalLM,
    draft: CausalLM | Drafter | None,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    k: int | KPolicy = 4,
    sampling: SamplingConfig | None = None,
    seed: int = 0,
    stop_on_eos: bool = True,
    reuse_prefix: bool = True,
    result_sink: list[GenerationResult] | None = None,
) -> Iterator[RoundEvent]:
    """Yield one ``RoundEvent`` per round; when done, append the full result to result_sink.

    reuse_prefix: keep cache entries that the prompt shares with what the models already hold
    (backends that report ``cached_tokens``), so repeated or extended prompts are not prefilled
    again; False always prefills from scratch.
    """
    sampling = sampling if sampling is not None else SamplingConfig()
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    drafter = _as_drafter(draft, target)
    n_ctx = _context_limit(target, drafter)
    validate_request(prompt_ids, max_new_tokens, n_ctx)
    for t in prompt_ids:
        if not 0 <= int(t) < target.vocab_size:
            raise ConfigError(f"prompt token id {t} outside the vocabulary")

    gen = make_generator(seed)
    sw = Stopwatch()
    ctx = [int(t) for t in prompt_ids]
    out: list[int] = []
    rounds: list[RoundStats] = []
    finish = "length"
    t_start = time.perf_counter()

    with sw.section("prefill"):
        # reuse the cached prefix the prompt shares with the previous generation, if any
        keep = cached_prefix_len(target, ctx[:-1]) if reuse_prefix else 0
        if target.n_cached > keep:
            target.truncate(keep)
        if len(ctx) - 1 > keep:
            target.extend(ctx[keep:-1], last_only=True)
        if drafter is not None:
            drafter.reset()
            if not reuse_prefix:
                drafter.rollback([])
            drafter.prefill(ctx[:-1])
    t_prefill = time.perf_counter() - t_start

    while len(out) < max_new_tokens:
        if len(ctx) >= n_ctx:
            finish = "context"
            break
        t0 = time.perf_counter()
        before = sw.snapshot()
        remaining = max_new_tokens - len(out)
        k_r = max(0, min(policy.next_k(), remaining - 1, n_ctx - len(ctx) - 1))
        draft_out = (
            drafter.propose(ctx, k_r, sampling, gen, sw)
            if drafter is not None and k_r > 0
            else Draft([], None)
        )
        k_r = len(draft_out)
        assert target.n_cached == len(ctx) - 1, "target cache out of sync with the context"
        with sw.section("verify"):
            logits = target.extend([ctx[-1], *draft_out.tokens])  # [K+1, V]
        with sw.section("sampling"):
            p = logits_to_probs(logits, sampling)  # [K+1, V]
            drafts = torch.tensor(draft_out.tokens, dtype=torch.long)  # [K]
            n_acc, nxt = accept_reject(p, draft_out.probs, drafts, gen)
        if n_acc < k_r:
            with sw.section("verify"):
                target.truncate(len(ctx) + n_acc)
        emitted = [*draft_out.tokens[:n_acc], nxt]
        if stop_on_eos:
            for j, t in enumerate(emitted):
                if t in target.eos_token_ids:
                    emitted = emitted[: j + 1]
                    finish = "eos"
                    break
        emitted = emitted[:remaining]
        ctx.extend(emitted)
        out.extend(emitted)
        if drafter is not None and n_acc < k_r:
            with sw.section("draft"):
                drafter.rollback(ctx)
        after = sw.snapshot()
        stats = RoundStats(
            k=k_r,
            n_accepted=n_acc,
            n_emitted=len(emitted),
            t_draft=delta(after, before, "draft"),
            t_verify=delta(after, before, "verify"),
            t_sampling=delta(after, before, "sampling"),
            t_round=time.perf_counter() - t0,
        )
        rounds.append(stats)
        policy.observe(RoundObservation(k_r, n_acc, stats.t_draft, stats.t_verify, stats.t_round))
        yield RoundEvent(emitted, stats)
        if finish == "eos":
            break

    if result_sink is not None:
        result_sink.append(
            GenerationResult(
                prompt_ids=list(prompt_ids),
                tokens=out,
                rounds=rounds,
                finish_reason=finish,
                t_prefill=t_prefill,
                t_total=time.perf_counter() - t_start,
                drafter=getattr(drafter, "name", "none") if drafter is not None else "none",
            )
        )


def generate(
    target: CausalLM,
    draft: CausalLM | Drafter | None,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    k: int | KPolicy = 4,
    sampling: SamplingConfig | None = None,
    seed: int = 0,
    stop_on_eos: bool = True,
    reuse_prefix: bool = True,
) -> GenerationResult:
    """Generate up to max_new_tokens after prompt_ids; see ``generate_stream``."""
    sink: list[GenerationResult] = []
    for _ in generate_stream(
        target,
        draft,
        prompt_ids,
        max_new_tokens=max_new_tokens,
        k=k,
        sampling=sampling,
        seed=seed,
        stop_on_eos=stop_on_eos,
        result_sink=sink,
    ):
        pass
    return sink[0]
