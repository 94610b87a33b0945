"""The decoding loop: prefill, then ``speculative_round`` (``core.round``) until the request
is done (its length, an end-of-sequence token, the context window, or the caller's stop).
``generate_stream`` checks the request and returns a ``Generation`` to iterate for one
``Round`` per round (``core.result``); ``generate`` runs one to the end.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.core.drafter import Drafter
from specdec.core.logprobs import LogprobSpec, TokenLogprob, check_top, rows_logprobs
from specdec.core.model import CausalLM, extend_last, reuse_prefix_len
from specdec.core.model_drafter import ModelDrafter
from specdec.core.policy import FixedK, KPolicy
from specdec.core.processors import RowProcessor
from specdec.core.result import GenerationResult, Round
from specdec.core.round import speculative_round
from specdec.core.sampling import SamplingConfig, make_generator
from specdec.core.verifiers import Verifier, rejection_verifier
from specdec.errors import ConfigError, ContextOverflowError, EmptyPromptError
from specdec.util.signatures import drained
from specdec.util.timing import Stopwatch


def as_drafter(draft: CausalLM | Drafter | None, target: CausalLM) -> Drafter | None:
    """A Drafter as is; a draft model wrapped in a ``ModelDrafter``; None stays None."""
    if draft is None:
        return None
    if hasattr(draft, "propose"):
        return draft  # type: ignore[return-value]
    model: CausalLM = draft
    if model is target:
        raise ConfigError("draft and target must be separate model instances (own caches)")
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


# prompt rows scored per target pass: a bound on the memory scoring takes (64 rows of a
# 151,936-token vocabulary are 39 MB of float32), whatever the prompt's length
PROMPT_ROWS_PER_PASS = 64


def score_prompt(
    target: CausalLM, ctx: Sequence[int], top: int, rows_per_pass: int = PROMPT_ROWS_PER_PASS
) -> list[TokenLogprob | None]:
    """Prefill the target with ctx[:-1] from an empty cache, ``rows_per_pass`` tokens a pass,
    and score each prompt token under the row of the tokens before it (``core.logprobs``,
    raw, with its rank and ``top`` alternatives): None for the first token, whose row no
    pass computes. Only one pass's rows are held at a time. A backend that keeps earlier
    prompts' caches (``reuse_prefix``) snapshots what its cache held first."""
    assert rows_per_pass >= 1
    if target.n_cached:
        reuse_prefix_len(target, ())  # snapshots the content about to be lost, keeps none
        target.truncate(0)  # every position's row is needed: no cached prefix is kept
    scored: list[TokenLogprob | None] = [None]
    n = len(ctx) - 1
    for start in range(0, n, rows_per_pass):
        piece = ctx[start : min(n, start + rows_per_pass)]
        rows = target.extend(piece)  # [len(piece), V]
        nexts = ctx[start + 1 : start + 1 + len(piece)]
        scored.extend(rows_logprobs(rows, nexts, top, with_rank=True))
    return scored


def _prefill(
    target: CausalLM,
    drafter: Drafter | None,
    ctx: Sequence[int],
    reuse_prefix: bool,
    prompt_top: int | None = None,
) -> list[TokenLogprob | None] | None:
    """Make the target cache ctx[:-1] and the drafter ctx[:-1]: with reuse_prefix, keep what
    the caches already share with the prompt (backends that report ``cached_tokens``), or
    what a snapshot of an earlier prompt's cache shares with it (``reuse_prefix``). With
    ``prompt_top``, the target's prefill scores the prompt (``score_prompt``), returned."""
    scored = None
    if prompt_top is not None:
        scored = score_prompt(target, ctx, prompt_top)
    else:
        keep = reuse_prefix_len(target, ctx[:-1]) if reuse_prefix else 0
        if target.n_cached > keep:
            target.truncate(keep)
        if len(ctx) - 1 > keep:
            extend_last(target, ctx[keep:-1])
    if drafter is not None:
        drafter.reset()
        if not reuse_prefix:
            drafter.rollback([])
        drafter.prefill(ctx[:-1])
    return scored


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
    processor: RowProcessor | None,
    logprobs: LogprobSpec | None,
    prompt_logprobs: int | None,
) -> Generator[Round, None, GenerationResult]:
    verify_gen = make_generator(seed)
    draft_gen = verify_gen if draft_seed is None else make_generator(draft_seed)
    sw = Stopwatch()
    ctx = list(prompt_ids)
    out: list[int] = []
    rounds: list[Round] = []
    finish = "length"
    t_start = time.perf_counter()
    with sw.section("prefill"):
        control.prompt_logprobs = _prefill(
            target, drafter if max_new_tokens else None, ctx, reuse_prefix, prompt_logprobs
        )
    t_prefill = time.perf_counter() - t_start

    while len(out) < max_new_tokens and control.stop_reason is None:
        if len(ctx) >= n_ctx:
            finish = "context"
            break
        rnd = speculative_round(
            target,
            drafter,
            ctx,
            policy=policy,
            remaining=max_new_tokens - len(out),
            n_ctx=n_ctx,
            sampling=sampling,
            verifier=verifier,
            draft_generator=draft_gen,
            verify_generator=verify_gen,
            stopwatch=sw,
            stop_on_eos=stop_on_eos,
            processor=processor,
            logprobs=logprobs,
        )
        out.extend(rnd.tokens)
        rounds.append(rnd)
        policy.observe(rnd)
        yield rnd
        if rnd.eos:
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
        prompt_logprobs=control.prompt_logprobs,
    )


@dataclass
class _Control:
    """What the caller of a running generation asks of the loop (read between rounds), and
    what the loop tells it before the end (the prompt's scores, once the prefill ran)."""

    stop_reason: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


class Generation:
    """A running generation: iterate it for one ``Round`` per round; ``result`` is the
    ``GenerationResult`` once the iteration has ended (None while running, or when the
    caller closed it). ``run()`` drains it and returns the result; ``stop(reason)`` ends it
    after the round just seen (a stop string, a cancelled request) and returns the result."""

    def __init__(
        self,
        rounds: Generator[Round, None, GenerationResult],
        control: _Control | None = None,
    ) -> None:
        self._rounds = rounds
        self._control = control if control is not None else _Control()
        self.result: GenerationResult | None = None

    @property
    def prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """The prompt's scores (``generate_stream(prompt_logprobs=)``) once the prefill ran
        (before the first round is yielded); None before, or when not asked for."""
        return self._control.prompt_logprobs

    def __iter__(self) -> Iterator[Round]:
        return self

    def __next__(self) -> Round:
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
    processor: RowProcessor | None = None,
    logprobs: LogprobSpec | None = None,
    prompt_logprobs: int | None = None,
) -> Generation:
    """Start generating up to ``max_new_tokens`` after ``prompt_ids``; iterate the returned
    ``Generation`` for one ``Round`` per round, then read ``.result``.

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
    processor:      changes the logits before sampling as a function of the context (a
                    logit bias, penalties, a grammar: ``core.processors``), for the target's
                    rows and the draft model's alike; the output has the distribution of
                    plain decoding with the same processor.
    logprobs:       the log-probability of each generated token and its top alternatives
                    (``core.logprobs``: raw or processed), from the rows the target's passes
                    computed (``Round.logprobs``, ``GenerationResult.logprobs``).
    prompt_logprobs: score the prompt too, with this many alternatives per token (0..20;
                    raw log-probabilities): the prefill runs from an empty cache in passes of
                    ``PROMPT_ROWS_PER_PASS`` rows (``GenerationResult.prompt_logprobs``).
                    max_new_tokens may then be 0: the prompt is scored, nothing generated.

    Arguments are checked here, before the first round, so errors surface at the call.
    """
    sampling = sampling if sampling is not None else SamplingConfig()
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    drafter = as_drafter(draft, target)
    n_ctx = context_limit(target, drafter)
    if prompt_logprobs is not None:
        check_top(prompt_logprobs, "prompt_logprobs")
    scoring_only = prompt_logprobs is not None and max_new_tokens == 0
    validate_request(prompt_ids, 1 if scoring_only else max_new_tokens, n_ctx)
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
            processor=processor,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        ),
        control,
    )


generate = drained(generate_stream, "GenerationResult", "generate_stream")
generate.__name__ = generate.__qualname__ = "generate"
