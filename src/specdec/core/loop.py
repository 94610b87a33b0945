"""The decoding loop: prefill, then rounds of draft K, verify K + 1 in one target pass,
accept/reject, roll back. K = 0 (or no drafter) is plain target-only decoding through the
same code. ``speculative_round`` is the one implementation of a round; what decides which
tokens are kept is a pluggable ``Verifier`` (``specdec.core.verifiers``): the lossless
accept/reject walk for generation, exact matching for the certificate's shape-matched
baseline.

Cache invariant between rounds (L = len(context)):
    target cache = context[:L-1]       (the last token is fed at the start of the next round)
    draft cache  <= context            (the drafter syncs itself; see ModelDrafter; a
                                        windowed one caches a prefix of context[offset:])
A round feeds the target [context[-1], x_1..x_K] and gets K + 1 rows: row i is p_{i+1}, the
target's distribution for the position of draft i + 1, row K the bonus distribution. After
n acceptances the target cache is truncated to L + n, which is the new context minus its last
(freshly sampled) token: the invariant holds again without ever re-prefilling.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ParamSpec

import numpy as np
import torch

from specdec.core.drafter import Draft, Drafter
from specdec.core.model_drafter import ModelDrafter
from specdec.core.policy import FixedK, KPolicy, RoundObservation
from specdec.core.sampling import SamplingConfig, logits_to_probs, make_generator
from specdec.core.verifiers import (
    Verifier,
    greedy_verify,
    keeps_argmax_when_greedy,
    rejection_verifier,
)
from specdec.errors import ConfigError, ContextOverflowError, EmptyPromptError
from specdec.models.base import CausalLM, cached_prefix_len, extend_last
from specdec.models.vocab import check_vocab_sizes
from specdec.util.timing import Stopwatch, delta


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
    source: str | None = None  # where the drafts came from, when the drafter says (Draft.source)


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
    finish_reason: str  # "length" | "eos" | "context" | "stop" (a stop string) | "cancelled"
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
    def ttft(self) -> float:
        """Time to first token, seconds: prefill (target and draft) plus the first round, which
        emits the first token(s). nan when no round ran."""
        return self.t_prefill + self.rounds[0].t_round if self.rounds else float("nan")

    @property
    def e2e_tokens_per_second(self) -> float:
        """Tokens per second of wall time including prefill (what a user waits for)."""
        return len(self.tokens) / self.t_total if self.t_total > 0 else float("nan")

    @property
    def mean_tokens_per_round(self) -> float:
        """Tokens kept per round, after the EOS / length cuts (``mean_acceptance_length`` is
        the same figure before the cuts)."""
        return len(self.tokens) / len(self.rounds) if self.rounds else float("nan")

    @property
    def mean_accepted_per_round(self) -> float:
        return float(np.mean([r.n_accepted for r in self.rounds])) if self.rounds else 0.0

    # -- the names other tools use (definitions: docs/metrics.md) ----------------------------
    @property
    def drafted_tokens(self) -> int:
        """Draft tokens proposed, summed over rounds (llama.cpp ``draft_n``)."""
        return sum(r.k for r in self.rounds)

    @property
    def accepted_tokens(self) -> int:
        """Draft tokens the verifier kept, summed over rounds (llama.cpp ``draft_n_accepted``)."""
        return sum(r.n_accepted for r in self.rounds)

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted_tokens / drafted_tokens (vLLM's per-drafted-token rate; nan undrafted)."""
        drafted = self.drafted_tokens
        return self.accepted_tokens / drafted if drafted else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens the rounds produced per verification round, the bonus/correction token
        included: (accepted_tokens + rounds) / rounds, taken before the EOS / length / stop
        cuts (1.0 for plain decoding; nan without rounds)."""
        n = len(self.rounds)
        return (self.accepted_tokens + n) / n if n else float("nan")

    def accepted_length_histogram(self) -> list[int]:
        """Rounds by drafts accepted: entry j counts the rounds that kept exactly j drafts
        (j = 0..max K; a round then produced j + 1 tokens)."""
        hist = [0] * (max((r.k for r in self.rounds), default=0) + 1)
        for r in self.rounds:
            hist[r.n_accepted] += 1
        return hist

    def draft_length_histogram(self) -> list[int]:
        """Rounds by drafts proposed: entry j counts the rounds that verified exactly j drafts
        (j = 0..max K; 0 is a plain step)."""
        hist = [0] * (max((r.k for r in self.rounds), default=0) + 1)
        for r in self.rounds:
            hist[r.k] += 1
        return hist

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

    def prediction_tokens(self, source: str = "prediction") -> tuple[int, int]:
        """(accepted, rejected) draft tokens of the rounds drafted from ``source`` (OpenAI's
        ``accepted_prediction_tokens`` / ``rejected_prediction_tokens``): accepted ones are in
        the output; rejected ones were proposed and are not (a verifier rejection, or cut by
        the end-of-sequence / length limit)."""
        accepted = rejected = 0
        for r in self.rounds:
            if r.source == source:
                kept = min(r.n_accepted, r.n_emitted)
                accepted += kept
                rejected += r.k - kept
        return accepted, rejected

    def time_split(self) -> dict[str, float]:
        """Seconds in prefill / draft / verify / sampling / other (sums to t_total)."""
        d = sum(r.t_draft for r in self.rounds)
        v = sum(r.t_verify for r in self.rounds)
        s = sum(r.t_sampling for r in self.rounds)
        other = self.t_total - self.t_prefill - d - v - s
        return {"prefill": self.t_prefill, "draft": d, "verify": v, "sampling": s, "other": other}

    def summary(self, label: str = "") -> str:
        """One line for people: tokens, time, TTFT, tok/s, rounds, acceptance by position,
        the prediction's counts, the numerics and draft window when they apply, time split."""
        split = self.time_split()
        total = sum(split.values()) or 1.0
        acc = " ".join("-" if a != a else f"{a:.2f}" for a in self.acceptance_by_position())
        parts = [
            f"{len(self.tokens)} tokens in {self.t_total:.2f} s",
            f"TTFT {self.ttft:.2f} s ({len(self.prompt_ids)}-token prompt)",
            f"{self.tokens_per_second:.2f} tok/s",
            f"{self.n_rounds} rounds, {self.mean_tokens_per_round:.2f} tokens/round",
        ]
        if acc:
            parts.append(f"acceptance by position {acc}")
        if "prediction_tokens" in self.extra:
            accepted, rejected = self.prediction_tokens()
            parts.append(f"prediction {accepted} accepted / {rejected} rejected")
        if self.extra.get("exact"):
            parts.append("exact numerics")
        if "draft_window" in self.extra:  # the draft's prefill (in TTFT) covers only the window
            parts.append(
                f"draft window {self.extra['draft_window']} ({self.extra['draft_rebases']} "
                "re-bases)"
            )
        parts.append(" ".join(f"{k} {100 * v / total:.0f}%" for k, v in split.items()))
        return f"[specdec{' ' + label if label else ''}] " + " | ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        if "prediction_tokens" in self.extra:  # a prediction was given (drafters.prediction)
            accepted, rejected = self.prediction_tokens()
            counts = {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
            }
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
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "verification_rounds": len(self.rounds),
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "accepted_length_histogram": self.accepted_length_histogram(),
            "draft_length_histogram": self.draft_length_histogram(),
            "time_split": self.time_split(),
            "t_prefill": self.t_prefill,
            "ttft": self.ttft,
            "t_total": self.t_total,
            "round_stats": [asdict(r) for r in self.rounds],
            **self.extra,
            **counts,
        }


def as_drafter(draft: CausalLM | Drafter | None, target: CausalLM) -> Drafter | None:
    """A Drafter as is; a draft model wrapped in a ``ModelDrafter``; None stays None."""
    if draft is None:
        return None
    if hasattr(draft, "propose"):
        return draft  # type: ignore[return-value]
    model: CausalLM = draft
    if model is target:
        raise ConfigError("draft and target must be separate model instances (own caches)")
    check_vocab_sizes(model, target)  # equal, or padding (at most MAX_VOCAB_PAD apart)
    return ModelDrafter(model, vocab_size=target.vocab_size)


def context_limit(target: CausalLM, drafter: Drafter | None) -> int:
    """Tokens a generation may hold: the smaller window of the target and a model drafter
    (drafters bounded by a context window expose it as ``n_ctx``; a ModelDrafter with a
    draft window reports None there, since it slides, and bounds nothing)."""
    limit = target.n_ctx
    drafter_ctx = getattr(drafter, "n_ctx", None)
    return limit if drafter_ctx is None else min(limit, int(drafter_ctx))


def drafter_report(drafter: Drafter | None) -> dict[str, Any]:
    """What a drafter adds to its generation's result (``report()``, when it has one: a
    windowed model drafter's window and re-bases); empty for the others."""
    report = getattr(drafter, "report", None)
    return dict(report()) if callable(report) else {}


def numerics_report(target: CausalLM) -> dict[str, Any]:
    """``{"exact": True}`` when the target runs exact numerics (``models.exact``): the output
    is then plain decoding's token for token; empty otherwise."""
    return {"exact": True} if getattr(target, "exact", False) else {}


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


def clamp_k(k: int, remaining: int, n_ctx: int, n_context: int) -> int:
    """K for a round: never more drafts than tokens still wanted minus the correction/bonus
    token, and never past the context window (the K + 1 verified positions must fit)."""
    return max(0, min(k, remaining - 1, n_ctx - n_context - 1))


@dataclass
class RoundOutcome:
    """What ``speculative_round`` did to the context."""

    k: int  # drafts proposed (after clamping; a drafter may propose fewer than asked)
    n_accepted: int  # drafts kept by the verifier (0..k)
    tokens: list[int]  # tokens appended to the context (after the EOS / length cut)
    eos: bool  # the round ended at an end-of-sequence token
    source: str | None = None  # Draft.source


def speculative_round(
    target: CausalLM,
    drafter: Drafter | None,
    ctx: list[int],
    *,
    k: int,
    remaining: int,
    n_ctx: int,
    sampling: SamplingConfig,
    verifier: Verifier,
    draft_generator: torch.Generator,
    verify_generator: torch.Generator,
    stopwatch: Stopwatch,
    stop_on_eos: bool,
) -> RoundOutcome:
    """One round. Appends the kept tokens to ``ctx`` (the accepted context) in place.

    Before and after: the target caches ctx[:-1] and the drafter a prefix of ctx.
    """
    # 1. How many drafts: the policy's K, clamped to the tokens wanted and the window.
    k_r = clamp_k(k, remaining, n_ctx, len(ctx))
    # 2. Draft (a drafter may propose fewer tokens than asked, or none).
    draft = Draft([], None)
    if drafter is not None and k_r > 0:
        with stopwatch.section("draft"):  # the loop times the drafter, whatever it does
            draft = drafter.propose(ctx, k_r, sampling, draft_generator)
    k_r = len(draft)
    assert target.n_cached == len(ctx) - 1, "target cache out of sync with the context"
    # 3. Verify: ONE target pass over [last context token, x_1..x_K] -> K + 1 rows.
    with stopwatch.section("verify"):
        logits = target.extend([ctx[-1], *draft.tokens])  # [K+1, V]
    # 4. Decide which drafts are kept and the token after them.
    with stopwatch.section("sampling"):
        if sampling.greedy and keeps_argmax_when_greedy(verifier):  # no rows needed
            n_acc, nxt = greedy_verify(logits, draft.tokens)
        else:
            p = logits_to_probs(logits, sampling)  # [K+1, V]
            drafts = torch.tensor(draft.tokens, dtype=torch.long)  # [K]
            n_acc, nxt = verifier(p, draft.probs, drafts, verify_generator)
    # 5. Roll the target back past the rejected drafts (the new last token is not cached).
    if n_acc < k_r:
        with stopwatch.section("verify"):
            target.truncate(len(ctx) + n_acc)
    # 6. Cut at end-of-sequence and at the requested length.
    emitted = [*draft.tokens[:n_acc], nxt]
    eos = False
    if stop_on_eos:
        for j, t in enumerate(emitted):
            if t in target.eos_token_ids:
                emitted, eos = emitted[: j + 1], True
                break
    emitted = emitted[:remaining]
    ctx.extend(emitted)
    # 7. Roll the drafter back to the accepted context (it catches up next round).
    if drafter is not None and n_acc < k_r:
        with stopwatch.section("draft"):
            drafter.rollback(ctx)
    return RoundOutcome(k=k_r, n_accepted=n_acc, tokens=emitted, eos=eos, source=draft.source)


def _round_stats(
    outcome: RoundOutcome, before: dict[str, float], after: dict[str, float], t_round: float
) -> RoundStats:
    return RoundStats(
        k=outcome.k,
        n_accepted=outcome.n_accepted,
        n_emitted=len(outcome.tokens),
        t_draft=delta(after, before, "draft"),
        t_verify=delta(after, before, "verify"),
        t_sampling=delta(after, before, "sampling"),
        t_round=t_round,
        source=outcome.source,
    )


def _prefill(
    target: CausalLM, drafter: Drafter | None, ctx: Sequence[int], reuse_prefix: bool
) -> None:
    """Make the target cache ctx[:-1] and the drafter ctx[:-1]: with reuse_prefix, keep what
    the caches already share with the prompt (backends that report ``cached_tokens``)."""
    keep = cached_prefix_len(target, ctx[:-1]) if reuse_prefix else 0
    if target.n_cached > keep:
        target.truncate(keep)
    if len(ctx) - 1 > keep:
        extend_last(target, ctx[keep:-1])
    if drafter is not None:
        drafter.reset()
        if not reuse_prefix:
            drafter.rollback([])
        drafter.prefill(ctx[:-1])


def _run(
    target: CausalLM,
    drafter: Drafter | None,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    policy: KPolicy,
    sampling: SamplingConfig,
    seed: int,
    draft_seed: int | None,
    stop_on_eos: bool,
    reuse_prefix: bool,
    verifier: Verifier,
    n_ctx: int,
    control: _Control,
) -> Generator[RoundEvent, None, GenerationResult]:
    verify_gen = make_generator(seed)
    draft_gen = verify_gen if draft_seed is None else make_generator(draft_seed)
    sw = Stopwatch()
    ctx = list(prompt_ids)
    out: list[int] = []
    rounds: list[RoundStats] = []
    finish = "length"
    t_start = time.perf_counter()
    with sw.section("prefill"):
        _prefill(target, drafter, ctx, reuse_prefix)
    t_prefill = time.perf_counter() - t_start

    while len(out) < max_new_tokens and control.stop_reason is None:
        if len(ctx) >= n_ctx:
            finish = "context"
            break
        t0 = time.perf_counter()
        before = sw.snapshot()
        outcome = speculative_round(
            target,
            drafter,
            ctx,
            k=policy.next_k(),
            remaining=max_new_tokens - len(out),
            n_ctx=n_ctx,
            sampling=sampling,
            verifier=verifier,
            draft_generator=draft_gen,
            verify_generator=verify_gen,
            stopwatch=sw,
            stop_on_eos=stop_on_eos,
        )
        stats = _round_stats(outcome, before, sw.snapshot(), time.perf_counter() - t0)
        out.extend(outcome.tokens)
        rounds.append(stats)
        policy.observe(
            RoundObservation(
                stats.k, stats.n_accepted, stats.t_draft, stats.t_verify, stats.t_round
            )
        )
        yield RoundEvent(outcome.tokens, stats)
        if outcome.eos:
            finish = "eos"
            break

    if control.stop_reason is not None:  # the caller ended it (it saw the last round)
        finish = control.stop_reason
    return GenerationResult(
        prompt_ids=list(prompt_ids),
        tokens=out,
        rounds=rounds,
        finish_reason=finish,
        t_prefill=t_prefill,
        t_total=time.perf_counter() - t_start,
        drafter=getattr(drafter, "name", "none") if drafter is not None else "none",
        extra={**drafter_report(drafter), **numerics_report(target)},
    )


@dataclass
class _Control:
    """What the caller of a running generation asks of the loop (read between rounds)."""

    stop_reason: str | None = None


class Generation:
    """A running generation: iterate it for one ``RoundEvent`` per round; ``result`` is the
    ``GenerationResult`` once the iteration has ended (None while running, or when the
    caller closed it). ``run()`` drains it and returns the result; ``stop(reason)`` ends it
    after the round just seen (a stop string, a cancelled request) and returns the result."""

    def __init__(
        self,
        rounds: Generator[RoundEvent, None, GenerationResult],
        control: _Control | None = None,
    ) -> None:
        self._rounds = rounds
        self._control = control if control is not None else _Control()
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[RoundEvent]:
        return self

    def __next__(self) -> RoundEvent:
        if self.result is not None:  # ended (stop() drains it from inside an iteration)
            raise StopIteration
        try:
            return next(self._rounds)
        except StopIteration as stop:
            self.result = stop.value
            raise

    def run(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def stop(self, reason: str = "stop") -> GenerationResult:
        """End the generation after the last round yielded (no further round runs) and return
        its result, whose ``finish_reason`` is ``reason`` unless it had already ended."""
        if self.result is None:
            self._control.stop_reason = reason
            for _ in self:  # the loop reads the request before starting another round
                raise AssertionError("a round ran after stop()")
        assert self.result is not None
        return self.result

    def close(self) -> None:
        """Stop early (the caches stay as the last round left them)."""
        self._rounds.close()


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
    verifier: Verifier = rejection_verifier,
    draft_seed: int | None = None,
) -> Generation:
    """Start generating up to ``max_new_tokens`` after ``prompt_ids``; iterate the returned
    ``Generation`` for one ``RoundEvent`` per round, then read ``.result``.

    target:         the model whose distribution the output has (a ``CausalLM``).
    draft:          a draft ``CausalLM`` (wrapped in a ``ModelDrafter``), any ``Drafter``
                    (n-gram, ...), or None for plain decoding.
    prompt_ids:     the prompt's token ids (non-empty, shorter than the context window).
    max_new_tokens: the most tokens to generate (>= 1).
    k:              drafts per round (0 = plain decoding) or a ``KPolicy`` (``AdaptiveK``).
    sampling:       temperature / top-k / top-p (default: greedy), applied identically to
                    draft and target rows.
    seed:           seeds the generator of the verifier (and of the drafter, see draft_seed).
    stop_on_eos:    stop after an end-of-sequence token (it is included in the output).
    reuse_prefix:   keep cache entries that the prompt shares with what the models already
                    hold (backends that report ``cached_tokens``); False prefills from scratch.
    verifier:       which drafts are kept (``specdec.core.verifiers``; default: the lossless
                    accept/reject walk).
    draft_seed:     seed of a separate generator for the drafter (None: the drafter shares
                    the verifier's generator, one stream per generation).

    Arguments are checked here, before the first round, so errors surface at the call.
    """
    sampling = sampling if sampling is not None else SamplingConfig()
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    drafter = as_drafter(draft, target)
    n_ctx = context_limit(target, drafter)
    validate_request(prompt_ids, max_new_tokens, n_ctx)
    for t in prompt_ids:
        if not 0 <= int(t) < target.vocab_size:
            raise ConfigError(f"prompt token id {t} outside the vocabulary")
    control = _Control()
    return Generation(
        _run(
            target,
            drafter,
            [int(t) for t in prompt_ids],
            max_new_tokens=max_new_tokens,
            policy=policy,
            sampling=sampling,
            seed=seed,
            draft_seed=draft_seed,
            stop_on_eos=stop_on_eos,
            reuse_prefix=reuse_prefix,
            verifier=verifier,
            n_ctx=n_ctx,
            control=control,
        ),
        control,
    )


_P = ParamSpec("_P")


def _drained(stream: Callable[_P, Generation]) -> Callable[_P, GenerationResult]:
    """The whole-result form of a streaming function: same parameters by construction."""

    def run_to_end(*args: _P.args, **kwargs: _P.kwargs) -> GenerationResult:
        return stream(*args, **kwargs).run()

    run_to_end.__doc__ = (
        "Generate to the end and return the ``GenerationResult``; the arguments are those "
        "of ``generate_stream``:\n\n" + (stream.__doc__ or "")
    )
    # what help() and IDEs show: the stream's own parameters
    run_to_end.__signature__ = inspect.signature(stream).replace(  # type: ignore[attr-defined]
        return_annotation="GenerationResult"
    )
    return run_to_end


generate = _drained(generate_stream)
generate.__name__ = generate.__qualname__ = "generate"
