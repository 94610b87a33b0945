"""One round of speculative decoding: draft K, verify K + 1 in one target pass, keep what
the verifier keeps, roll back. K = 0 (or no drafter) is a plain target-only step through the
same code. ``speculative_round`` is the one implementation of a round (the loop in
``core.loop`` runs it until done); what decides which tokens are kept is a pluggable
``Verifier`` (``core.verifiers``): the lossless accept/reject walk for generation, exact
matching for the certificate's shape-matched baseline.

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

import time

import torch

from specdec.core.drafter import Draft, Drafter
from specdec.core.logprobs import LogprobSpec, TokenLogprob, rows_logprobs
from specdec.core.model import CausalLM
from specdec.core.policy import KPolicy
from specdec.core.processors import RowProcessor, legal_prefix, process_rows
from specdec.core.result import Round
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.core.verifiers import Verifier, greedy_verify, keeps_argmax_when_greedy
from specdec.util.timing import Stopwatch, delta


def speculative_round(
    target: CausalLM,
    drafter: Drafter | None,
    ctx: list[int],
    *,
    policy: KPolicy,
    remaining: int,
    n_ctx: int,
    sampling: SamplingConfig,
    verifier: Verifier,
    draft_generator: torch.Generator,
    verify_generator: torch.Generator,
    stopwatch: Stopwatch,
    stop_on_eos: bool,
    processor: RowProcessor | None = None,
    logprobs: LogprobSpec | None = None,
) -> Round:
    """One round. Appends the kept tokens to ``ctx`` (the accepted context) in place and
    returns what it did (``Round``, timed by ``stopwatch``'s sections). ``processor``
    (``core.processors``: a logit bias, penalties, a grammar) changes the target's rows along
    the draft's path and the draft model's rows as it drafts. ``logprobs`` (``core.logprobs``)
    asks for the log-probability of each emitted token and its top alternatives, read from
    the rows this round's target pass computed (``Round.logprobs``).

    Before and after: the target caches ctx[:-1] and the drafter a prefix of ctx.
    """
    t0 = time.perf_counter()
    before = stopwatch.snapshot()
    # 1. How many drafts: the policy's K, clamped to the tokens wanted and the window.
    k_r = clamp_k(policy.next_k(), remaining, n_ctx, len(ctx))
    # 2. Draft (a drafter may propose fewer tokens than asked, or none).
    draft = Draft([], None)
    if drafter is not None and k_r > 0:
        with stopwatch.section("draft"):  # the round times the drafter, whatever it does
            draft = drafter.propose(ctx, k_r, sampling, draft_generator, processor=processor)
    k_r = len(draft)  # drafts proposed (those cut below count as rejected)
    if processor is not None and k_r:
        # drafts the processor rules out (a grammar's mask) are rejected without a pass
        with stopwatch.section("sampling"):
            n_legal = legal_prefix(processor, ctx, draft.tokens)
        if n_legal < k_r:
            probs = None if draft.probs is None else draft.probs[:n_legal]
            draft = Draft(draft.tokens[:n_legal], probs, draft.source)
    assert target.n_cached == len(ctx) - 1, "target cache out of sync with the context"
    # 3. Verify: ONE target pass over [last context token, x_1..x_K] -> K + 1 rows.
    with stopwatch.section("verify"):
        logits = target.extend([ctx[-1], *draft.tokens])  # [K+1, V]
    # 4. Decide which drafts are kept and the token after them.
    with stopwatch.section("sampling"):
        keep_raw = processor is not None and logprobs is not None and logprobs.mode == "raw"
        raw = logits.clone() if keep_raw else logits  # the rows raw log-probabilities read
        logits = process_rows(processor, ctx, draft.tokens, logits)  # row i: ctx + x_1..x_i
        p: torch.Tensor | None = None
        if sampling.greedy and keeps_argmax_when_greedy(verifier):  # no rows needed
            n_acc, nxt = greedy_verify(logits, draft.tokens)
        else:
            p = logits_to_probs(logits, sampling)  # [K+1, V]
            drafts = torch.tensor(draft.tokens, dtype=torch.long)  # [K]
            n_acc, nxt = verifier(p, draft.probs, drafts, verify_generator)
    # 5. Roll the target back past the rejected drafts (the new last token is not cached).
    if n_acc < len(draft):
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
    scored: tuple[TokenLogprob, ...] | None = None
    if logprobs is not None:
        with stopwatch.section("sampling"):
            scored = emitted_logprobs(logprobs, raw, logits, p, sampling, emitted)
    ctx.extend(emitted)
    # 7. Roll the drafter back to the accepted context (it catches up next round).
    if drafter is not None and n_acc < k_r:
        with stopwatch.section("draft"):
            drafter.rollback(ctx)
    after = stopwatch.snapshot()
    return Round(
        k=k_r,
        n_accepted=n_acc,
        tokens=emitted,
        t_draft=delta(after, before, "draft"),
        t_verify=delta(after, before, "verify"),
        t_sampling=delta(after, before, "sampling"),
        t_round=time.perf_counter() - t0,
        eos=eos,
        source=draft.source,
        logprobs=scored,
    )


def emitted_logprobs(
    spec: LogprobSpec,
    raw: torch.Tensor,  # [K+1, V] the target's logits as the pass returned them
    processed: torch.Tensor,  # [K+1, V] after the processor
    probs: torch.Tensor | None,  # [K+1, V] the rows sampled from (None: greedy, not built)
    sampling: SamplingConfig,
    emitted: list[int],
) -> tuple[TokenLogprob, ...]:
    """The log-probabilities of the emitted tokens (token i from row i), under the raw rows
    or under the distribution each was drawn from (``core.logprobs``)."""
    if spec.mode == "raw":
        return rows_logprobs(raw, emitted, spec.top)
    if probs is None:  # greedy: the one-hot rows of the argmax, built for these rows only
        probs = logits_to_probs(processed[: len(emitted)], sampling)
    with torch.no_grad():
        logs = torch.log(probs[: len(emitted)])  # [n, V], -inf where ruled out
    return rows_logprobs(logs, emitted, spec.top)


def clamp_k(k: int, remaining: int, n_ctx: int, n_context: int) -> int:
    """K for a round: never more drafts than tokens still wanted minus the correction/bonus
    token, and never past the context window (the K + 1 verified positions must fit)."""
    return max(0, min(k, remaining - 1, n_ctx - n_context - 1))
