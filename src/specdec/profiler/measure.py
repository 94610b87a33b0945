"""Measure what ``profiler.predict`` needs, on the real models: cost curves and greedy
acceptance probes. Every function leaves the models' caches empty."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from specdec.core.drafter import Drafter
from specdec.core.loop import generate
from specdec.core.model import CausalLM, cached_prefix_len, extend_last
from specdec.core.rejection import accept_reject
from specdec.core.sampling import GREEDY, logits_to_probs, make_generator
from specdec.core.vocab import fit_logits
from specdec.errors import ConfigError
from specdec.profiler.passes import (
    drafter_latency,
    interpolated,
    profile_context,
    step_latency,
    verify_times,
)
from specdec.profiler.predict import Costs, ProbeSequence, runs_from_matches

PREFILL_TOKENS = 256  # the prefill-throughput pass (long enough to be compute-bound)


def _reset(model: CausalLM) -> None:
    if model.n_cached:
        model.truncate(0)


def prefill_throughput(model: CausalLM, repeats: int = 2, n_tokens: int = PREFILL_TOKENS) -> float:
    """Tokens per second of a cold prefill of ``n_tokens`` (median of ``repeats``)."""
    n = min(n_tokens, model.n_ctx - 1)
    ids = profile_context(model, n)
    samples = []
    for _ in range(repeats + 1):  # the first pass warms up
        _reset(model)
        t0 = time.perf_counter()
        extend_last(model, ids)
        samples.append(time.perf_counter() - t0)
    _reset(model)
    return n / float(statistics.median(samples[1:]))


def row_overhead(vocab_size: int, rows: int = 9, repeats: int = 5) -> float:
    """Seconds per verified row spent by the loop outside the model: logits -> probabilities
    and the accept/reject walk (greedy, the profile's mode), measured on random rows."""
    gen = make_generator(0)
    logits = torch.randn(rows, vocab_size, generator=gen)  # [n, V]
    drafts = torch.zeros(rows - 1, dtype=torch.long)  # [K]
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        p = logits_to_probs(logits, GREEDY)  # [n, V]
        accept_reject(p, None, drafts, gen)
        samples.append(time.perf_counter() - t0)
    return float(statistics.median(samples[1:])) / rows


def round_overhead(target: CausalLM, n_tokens: int = 8) -> float:
    """Seconds per round that the loop spends outside the target pass and the row work
    (bookkeeping, between rounds too), from a short plain run after a warm-up one; the row
    work is measured separately (``row_overhead``)."""
    n_tokens = max(1, min(n_tokens, target.n_ctx // 4))
    ctx = profile_context(target, min(64, target.n_ctx - n_tokens))  # fits a small window
    samples = []
    for _ in range(2):
        res = generate(target, None, ctx, max_new_tokens=n_tokens, k=0, reuse_prefix=False)
        decode = res.t_total - res.t_prefill
        inside = sum(r.t_verify + r.t_sampling for r in res.rounds)
        samples.append(max(0.0, decode - inside) / max(len(res.rounds), 1))
    _reset(target)
    return samples[-1]


# verify passes timed by the profile (the others are interpolated): every size drafts of up
# to 6 use, then the coarser points where the curves measured here change slope; past 12
# rows (drafts of a prediction or a copy, up to 64) each side of every 16-row boundary and
# the middle between: llama.cpp's repacked AVX-512 kernels work on blocks of rows, so the
# curve may step up just past a multiple of 16 (15 and 16 rows cost the same 8.07 steps in
# the AVX-512 profile) and interpolating across such a step would misprice the passes there
PROFILE_NS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 15, 16, 17, 24, 31, 32, 33, 40, 47, 48, 49, 56, 63, 64)


def target_costs(
    target: CausalLM,
    *,
    context_tokens: int = 100,
    n_max: int = 16,
    repeats: int = 3,
    ns: Sequence[int] | None = PROFILE_NS,
    prefill_repeats: int = 1,
    prefill: bool = True,
) -> Costs:
    """The target side of the costs: verify curve, prefill throughput, loop overhead.
    ``prefill=False`` leaves the prefill throughput unmeasured (infinite) for a caller that
    times real prompts' prefills instead (``with_prefill_from``)."""
    ctx = profile_context(target, context_tokens)
    times = verify_times(target, ctx, n_max, repeats, ns=ns)
    return Costs(
        verify_s=tuple(times),
        prefill_tps=prefill_throughput(target, repeats=prefill_repeats) if prefill else math.inf,
        row_s=row_overhead(target.vocab_size),
        round_s=round_overhead(target),
    )


# passes timed for the speculative ceiling of a backend (the largest pass is added)
CEILING_NS = (1, 2, 4, 8, 16)


def ceiling_passes(
    target: CausalLM, n_max: int, *, context_tokens: int = 100, repeats: int = 1
) -> list[tuple[int, float]]:
    """A few timed passes of this target [(rows, seconds)], from 1 up to ``n_max`` rows (a
    round's largest): enough for ``predict.pass_ceiling_tps``, the tokens per second no
    drafter can beat on it. A few seconds where ``target_costs`` takes minutes."""
    ctx = profile_context(target, context_tokens)
    ns = sorted({n for n in CEILING_NS if n < n_max} | {n_max})
    times = verify_times(target, ctx, n_max, repeats, ns=ns)
    _reset(target)
    return [(n, times[n - 1]) for n in ns]


def with_model_draft(costs: Costs, draft: CausalLM, *, context_tokens: int = 100) -> Costs:
    """Costs of the target with a draft model: its step (per drafted token) and prefill."""
    ctx = profile_context(draft, context_tokens)
    return replace(
        costs,
        draft_token_s=step_latency(draft, ctx, 5),
        draft_prefill_tps=prefill_throughput(draft),
    )


def with_model_free_draft(
    costs: Costs, drafter: Drafter, target: CausalLM, *, context_tokens: int = 100
) -> Costs:
    """Costs of the target with a model-free drafter: its per-round lookup."""
    ctx = profile_context(target, context_tokens)
    return replace(costs, draft_round_s=drafter_latency(drafter, ctx, 5))


def greedy_run(
    target: CausalLM, prompt_ids: Sequence[int], n_new: int, *, keep_cache: bool = False
) -> tuple[list[int], float, float]:
    """The target's own greedy output (what greedy speculative decoding emits too), its
    decode seconds (prefill excluded) and its prefill seconds (len(prompt_ids) - 1 tokens:
    the last prompt token goes into the first decoding pass). ``keep_cache``: leave the
    cache holding the prompt and the output but its last token."""
    res = generate(target, None, prompt_ids, max_new_tokens=n_new, k=0, reuse_prefix=False)
    if not keep_cache:
        _reset(target)
    return res.tokens, res.t_total - res.t_prefill, res.t_prefill


def with_prefill_from(
    costs: Costs, prompt_tokens: Sequence[int], seconds: Sequence[float]
) -> Costs:
    """``costs`` with the prefill throughput of real prompts: ``prompt_tokens[i]`` tokens
    prefilled in ``seconds[i]`` (the probe's own prompts, timed while decoding them), which
    saves the dedicated prefill passes of ``prefill_throughput``."""
    total = sum(seconds)
    if not (total > 0 and sum(prompt_tokens) > 0):
        raise ValueError("no timed prefill to take the throughput from")
    return replace(costs, prefill_tps=sum(prompt_tokens) / total)


def calibrated(costs: Costs, step_s: float) -> Costs:
    """``costs`` with the verify curve scaled so that a plain step costs ``step_s``, the
    time measured in real decoding. The curve's shape comes from the repeated passes of
    ``verify_times``, its level from the real steps: on the development machine the repeated
    passes at a short context came out 5-20 % faster than decoding steps in context, and every
    prediction on that backend inherited the error."""
    if not (step_s > 0 and costs.step_s > 0):
        return costs
    overhead = costs.row_s + costs.round_s
    v1 = max(step_s - overhead, 1e-9)
    f = v1 / costs.verify_s[0]
    return replace(costs, verify_s=tuple(v * f for v in costs.verify_s))


# the sizes ``curve_ratios`` times (1 and n_max always; the others interpolated, which is
# close to exact where the curve is nearly straight, as measured on llama.cpp here). 7 and 8
# both: llama.cpp's curve here steps between them (3.88 and 6.16 times a 1-row pass), and
# interpolating 7 from 6 and 8 charged 7-row passes 5.26. Past 16 both sides of the 16-row
# boundaries, as PROFILE_NS (fewer: each is timed at every probe context)
CURVE_NS = (2, 3, 4, 6, 7, 8, 12, 16, 17, 24, 32, 33, 48, 49, 64)


def _timed_pass(
    target: CausalLM, rows: Sequence[int], base: int, clock: Callable[[], float]
) -> float:
    """Seconds of one pass over ``rows`` after the cached ``base`` tokens, undone after."""
    t0 = clock()
    target.extend(rows)
    t = clock() - t0
    target.truncate(base)
    return t


def curve_ratios(
    target: CausalLM,
    samples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    n_max: int,
    ns: Sequence[int] = CURVE_NS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, list[float]]:
    """The verify curve's shape at real contexts: per timed n (2..n_max), verify(n) /
    verify(1) at each context of ``samples`` [(context, following tokens)], e.g. a probe
    prompt plus part of the target's own continuation of it, and the rest of that
    continuation (``curve_from_ratios`` turns them into the curve).

    Per context the target caches it, keeping what its cache already shares with it (a
    context that extends or shortens the cached one costs no prefill: a greedy run's cache
    truncated to a point of its own continuation costs nothing), then times a 1-row pass, a
    pass of each n in ``ns`` and n_max (ascending and descending on alternate contexts) and
    another 1-row pass, each undone with ``truncate``. A sample of n is its time over the mean
    of that context's two 1-row passes, so drift between contexts cancels. The cache is left
    holding the last context.

    Why: passes repeated at one synthetic context (``verify_times``) gave shapes that differed
    by 5-10 % between two sweeps a minute apart on the development machine (verify(6) /
    verify(1) 3.58 and 3.24), and the cost-aware drafter's marginal decisions sit inside that
    spread."""
    if n_max < 1:
        raise ConfigError(f"n_max must be >= 1, got {n_max}")
    if not samples:
        raise ConfigError("the context curve needs at least one context")
    timed = sorted({n for n in (*ns, n_max) if 2 <= n <= n_max})
    ratios: dict[int, list[float]] = {n: [] for n in timed}
    for i, (context, following) in enumerate(samples):
        ctx = [int(t) for t in context]
        pool = [int(t) for t in following] or ctx[-1:]
        if not ctx or len(ctx) + n_max > target.n_ctx:
            raise ConfigError(
                f"a context of {len(ctx)} tokens leaves no room for {n_max} rows "
                f"(n_ctx {target.n_ctx})"
            )
        rows = [pool[j % len(pool)] for j in range(n_max)]
        keep = cached_prefix_len(target, ctx)
        if target.n_cached > keep:
            target.truncate(keep)
        if len(ctx) > keep:
            extend_last(target, ctx[keep:])
        base = target.n_cached
        _timed_pass(target, rows[:1], base, clock)  # warm-up at this context
        one = _timed_pass(target, rows[:1], base, clock)
        order = timed if i % 2 == 0 else timed[::-1]
        got = {n: _timed_pass(target, rows[:n], base, clock) for n in order}
        one = (one + _timed_pass(target, rows[:1], base, clock)) / 2
        if one > 0:
            for n, t in got.items():
                ratios[n].append(t / one)
    return ratios


def curve_from_ratios(ratios: dict[int, list[float]], n_max: int) -> list[float]:
    """The curve's shape [n_max] from ``curve_ratios``' samples (pooled over calls): per n
    the median, made non-decreasing in n, the n not timed interpolated."""
    med = {1: 1.0}
    for n in sorted(ratios):
        if ratios[n] and n <= n_max:
            med[n] = max(float(statistics.median(ratios[n])), max(med.values()))
    if n_max not in med:  # nothing timed (every pass took no time on a coarse clock)
        med[n_max] = float(n_max)
    return [interpolated(med, n) for n in range(1, n_max + 1)]


def extended(costs: Costs, longer: Costs) -> Costs:
    """``costs`` whose verify curve stops short (a profile measured for drafts of up to 16)
    continued to the length of ``longer``'s with its shape: verify(n) = costs' last pass times
    longer's verify(n) / verify(last), for n past costs' curve; ``costs`` itself when its
    curve is as long."""
    short, long_ = costs.verify_s, longer.verify_s
    n = len(short)
    if n >= len(long_):
        return costs
    scale = short[-1] / long_[n - 1]
    return replace(costs, verify_s=(*short, *(v * scale for v in long_[n:])))


def with_curve_shape(costs: Costs, shape: Sequence[float]) -> Costs:
    """``costs`` with the verify curve ``verify(1) * shape[n - 1]`` (its level kept: see
    ``calibrated`` for the level)."""
    if len(shape) != len(costs.verify_s) or not shape or shape[0] != 1.0:
        raise ValueError(
            f"a curve shape of {len(shape)} points starting at 1.0 is needed for "
            f"{len(costs.verify_s)} points"
        )
    v1 = costs.verify_s[0]
    return replace(costs, verify_s=tuple(v1 * r for r in shape))


def model_draft_probe(
    draft: CausalLM,
    prompt_ids: Sequence[int],
    continuation: Sequence[int],
    k_cap: int,
    vocab_size: int | None = None,
) -> ProbeSequence:
    """Teacher-force the draft on prompt + continuation in one pass and record, for every
    position, how many consecutive draft argmaxes agree with the target's tokens.

    ``vocab_size`` is the target's when the pair's vocabularies differ by padding: the draft
    rows are fitted to it as in decoding (``core.vocab.fit_logits``), and positions after
    an id the draft model lacks count as misses (decoding drafts nothing there)."""
    prompt = [int(t) for t in prompt_ids]
    cont = [int(t) for t in continuation]
    known = next((i for i, t in enumerate(cont) if t >= draft.vocab_size), len(cont))
    _reset(draft)
    if len(prompt) > 1:
        extend_last(draft, prompt[:-1])
    rows = draft.extend([prompt[-1], *cont[: min(known, len(cont) - 1)]])  # row j: cont[j]
    _reset(draft)
    if vocab_size is not None:
        rows = fit_logits(rows, vocab_size)
    matches = (rows.argmax(dim=-1) == torch.tensor(cont[: rows.shape[0]])).tolist()
    matches += [False] * (len(cont) - len(matches))
    return ProbeSequence(len(prompt), len(cont), run=runs_from_matches(matches, k_cap))


def model_free_probe(
    drafter: Drafter, prompt_ids: Sequence[int], continuation: Sequence[int], k_cap: int
) -> ProbeSequence:
    """Ask the drafter at every position what it would propose (up to k_cap tokens) and how
    much of it matches the target's continuation."""
    prompt = [int(t) for t in prompt_ids]
    cont = [int(t) for t in continuation]
    gen = make_generator(0)
    drafter.reset()
    drafter.prefill(prompt[:-1])
    proposals: list[tuple[int, int]] = []
    for t in range(len(cont)):
        ctx = prompt + cont[:t]
        drafter.rollback(ctx)
        toks = drafter.propose(ctx, k_cap, GREEDY, gen).tokens
        matched = 0
        for a, b in zip(toks, cont[t:], strict=False):
            if a != b:
                break
            matched += 1
        proposals.append((len(toks), matched))
    drafter.reset()
    return ProbeSequence(len(prompt), len(cont), proposals=tuple(proposals))


def round_walk_probe(
    drafter: Drafter, prompt_ids: Sequence[int], continuation: Sequence[int], k_cap: int
) -> ProbeSequence:
    """Like ``model_free_probe`` for a drafter that learns from its own rounds (the planned
    suffix drafter): the proposals are made where a greedy run at K = k_cap starts its rounds,
    each round's context being what that run would have, so what the drafter learns matches
    a real run. Positions where no round starts propose nothing; the sequence is only valid
    for ``simulate(seq, k_cap)``."""
    prompt = [int(t) for t in prompt_ids]
    cont = [int(t) for t in continuation]
    gen = make_generator(0)
    drafter.reset()
    drafter.prefill(prompt[:-1])
    proposals: list[tuple[int, int]] = [(0, 0)] * len(cont)
    t = 0
    while t < len(cont):
        ctx = prompt + cont[:t]
        drafter.rollback(ctx)
        toks = drafter.propose(ctx, min(k_cap, len(cont) - t - 1), GREEDY, gen).tokens
        matched = 0
        for a, b in zip(toks, cont[t:], strict=False):
            if a != b:
                break
            matched += 1
        proposals[t] = (len(toks), matched)
        t += matched + 1
    drafter.reset()
    return ProbeSequence(len(prompt), len(cont), proposals=tuple(proposals))
