"""The suffix drafter: index bookkeeping, draft sizing, and exactness of the loop with it.

Thresholds (fixed before running): the sampled-distribution test uses 20,000 independent
sequences and requires the chi-square p-value of the first-three-token distribution against
the exact one to exceed 1e-3 (and the broken-walk control to fall below 1e-3), as in
test_decoding.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from seq_dist import first_tokens_pvalue
from specdec.core.loop import generate, generate_stream
from specdec.core.result import GenerationResult
from specdec.core.sampling import GREEDY, SamplingConfig
from specdec.drafters.suffix import (
    SuffixDrafter,
    SuffixIndex,
    SuffixOptions,
    draft_length_cap,
    parse_suffix_options,
    vote_draft,
)
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, MockSpec


def propose(drafter: SuffixDrafter, context: list[int], k: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    return drafter.propose(context, k, GREEDY, gen).tokens


def fresh_index(tokens: list[int], min_n: int, max_n: int) -> SuffixIndex:
    idx = SuffixIndex(min_n, max_n)
    idx.extend(tokens)
    return idx


def index_state(idx: SuffixIndex) -> tuple[list[int], dict[int, dict[tuple[int, ...], list[int]]]]:
    return list(idx.tokens), {n: dict(m) for n, m in idx.maps.items()}


# ------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_draft": 0},
        {"min_match": 0},
        {"min_match": 4, "max_match": 3},
        {"max_match": 65},
        {"draft_per_match": 0.0},
        {"draft_per_match": float("nan")},
        {"min_confidence": 1.5},
        {"min_confidence": -0.1},
        {"max_candidates": 0},
    ],
)
def test_bad_options_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SuffixOptions(**kwargs)  # type: ignore[arg-type]


def test_options_parse_from_a_command_line_string() -> None:
    assert parse_suffix_options("") == SuffixOptions()
    got = parse_suffix_options("max_draft=12, min_match=3,draft_per_match=1.5")
    assert got == SuffixOptions(max_draft=12, min_match=3, draft_per_match=1.5)
    for bad in ("nonsense=1", "max_draft", "max_draft=x", "min_match=2.5", "max_draft=0"):
        with pytest.raises(ConfigError):
            parse_suffix_options(bad)


# ------------------------------------------------------------------------- the index
@pytest.mark.parametrize("seed", range(4))
def test_index_after_appends_and_truncations_equals_a_fresh_one(seed: int) -> None:
    rnd = random.Random(seed)
    idx = SuffixIndex(1, 4)
    for _ in range(200):
        if idx.tokens and rnd.random() < 0.3:
            idx.truncate(rnd.randrange(len(idx.tokens) + 1))
        else:
            idx.extend([rnd.randrange(4) for _ in range(rnd.randint(1, 5))])
        assert index_state(idx) == index_state(fresh_index(idx.tokens, 1, 4))
        assert all(v for m in idx.maps.values() for v in m.values())  # no empty lists kept


def test_longest_match_finds_the_longest_earlier_suffix() -> None:
    idx = fresh_index([5, 1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 1, 4)
    n, positions = idx.longest_match()
    assert n == 3 and positions == [4]  # [1, 2, 3] occurred once before, followed by 9
    assert fresh_index([1, 2, 3, 4], 1, 3).longest_match() == (0, [])
    assert fresh_index([1, 2, 3, 1], 2, 3).longest_match() == (0, [])  # 1-grams not indexed


# ------------------------------------------------------------------------- drafting
def test_no_match_means_an_empty_draft() -> None:
    d = SuffixDrafter()
    assert propose(d, list(range(3, 60)), 8) == []  # all distinct: nothing to look up
    assert propose(d, [3, 4, 5, 3], 8) == []  # a 1-token match is below min_match = 2
    assert d.last_match_len == 0
    assert propose(SuffixDrafter(), [3, 4, 5, 3, 4], 0) == []  # K = 0


def test_draft_length_follows_the_match_length() -> None:
    opts = SuffixOptions(draft_per_match=1.5, max_draft=10)
    assert draft_length_cap(0, 16, opts) == 0
    assert draft_length_cap(2, 16, opts) == 3
    assert draft_length_cap(5, 16, opts) == 8
    assert draft_length_cap(8, 16, opts) == 10  # max_draft
    assert draft_length_cap(8, 4, opts) == 4  # K
    body = list(range(10, 40))
    # a 2-token match drafts 3 tokens, a 6-token match 9
    assert propose(SuffixDrafter(opts), [*body, 10, 11], 16) == body[2:5]
    assert propose(SuffixDrafter(opts), [*body, *body[:6]], 16) == body[6:15]


def test_inconsistent_continuations_shorten_or_stop_the_draft() -> None:
    a, b = 3, 4
    # three earlier [a, b], each followed by a different token: no majority
    split = [a, b, 5, 20, a, b, 6, 21, a, b, 7, 22, a, b]
    assert propose(SuffixDrafter(), split, 8) == []
    # 2 of 3 continue with 5 (share 2/3), then those two split (share 1/2)
    agree = [a, b, 5, 9, 20, a, b, 5, 8, 21, a, b, 6, 9, 22, a, b]
    assert propose(SuffixDrafter(SuffixOptions(min_confidence=0.5)), agree, 8) == [5]
    assert propose(SuffixDrafter(SuffixOptions(min_confidence=0.0)), agree, 8) == [5, 8, 21, a]
    assert propose(SuffixDrafter(SuffixOptions(min_confidence=0.7)), agree, 8) == []


def test_votes_prefer_the_most_recent_candidate_on_ties() -> None:
    tokens = [1, 2, 5, 1, 2, 6, 1, 2]
    assert vote_draft(tokens, [2, 5], cap=1, min_confidence=0.0) == [6]


def test_periodic_text_drafts_past_the_end_of_the_context() -> None:
    ctx = [7, 3, 4, 5, 3, 4, 5, 3, 4]
    assert propose(SuffixDrafter(SuffixOptions(max_draft=7)), ctx, 7) == [5, 3, 4, 5, 3, 4, 5]


def test_a_draft_stops_at_the_first_end_of_generation_it_copies() -> None:
    """A chat's context runs on from the prompt's end (2 = end of message) through the
    template into the answer; a copy of the prompt's last line drafts up to that end token
    and no further (issue 61), and without the end set the same copy runs on."""
    prompt_end = [5, 6, 7, 8, 9, 2, 1, 4]  # ... last line, end of message, template tokens
    ctx = [*prompt_end, 5, 6, 7]  # the answer repeats the last line so far
    opts = SuffixOptions(max_draft=16, draft_per_match=8.0)
    cut = propose(SuffixDrafter(opts, ends=frozenset({2})), ctx, 16)
    assert cut == [8, 9, 2]
    runs_on = propose(SuffixDrafter(opts), ctx, 16)
    assert runs_on[:5] == [8, 9, 2, 1, 4] and len(runs_on) > 5


def test_load_pair_gives_suffix_drafters_the_targets_end_of_generation_ids() -> None:
    from specdec.drafters.hybrid import HybridDrafter
    from specdec.drafters.planned import PlannedSuffixDrafter
    from specdec.models.loader import ModelConfig
    from specdec.pairs import HybridRef, load_pair
    from specdec.theory import Costs

    target = ModelConfig("mock:target", backend="mock")
    flat = Costs(verify_s=tuple(1.0 + 0.02 * n for n in range(65)), prefill_tps=1e3)
    suffix, lm = load_pair("suffix", target)
    assert isinstance(suffix, SuffixDrafter) and suffix.ends == lm.eos_token_ids != frozenset()
    planned, lm = load_pair("planned", target, costs=lambda *_: flat)
    assert isinstance(planned, PlannedSuffixDrafter) and planned.inner.ends == lm.eos_token_ids
    hybrid, lm = load_pair(HybridRef(ModelConfig("mock:close", backend="mock")), target)
    assert isinstance(hybrid, HybridDrafter) and hybrid.suffix.ends == lm.eos_token_ids


# ------------------------------------------------------------------------- incremental / rollback
def test_indexing_is_incremental_over_a_generation() -> None:
    target = MockLM(MockSpec(vocab_size=8, order=1))
    drafter = SuffixDrafter()
    prompt = [0, 3, 4, 5, 3]
    ctx = list(prompt)
    for ev in generate_stream(target, drafter, prompt, max_new_tokens=80, k=6, stop_on_eos=False):
        ctx += ev.tokens
        idx = drafter.index
        # every context token indexed exactly once (no rescans), and the index is a prefix
        assert idx.appended == len(idx) and idx.tokens == ctx[: len(idx)]
        assert len(idx) >= len(ctx) - 1 - 6 - 1


def test_rollback_restores_exactly_the_state_of_the_shorter_context() -> None:
    rnd = random.Random(1)
    ctx = [rnd.randrange(3, 9) for _ in range(120)]
    d = SuffixDrafter(SuffixOptions(min_match=1, max_match=5))
    propose(d, ctx, 8)
    for cut in (119, 90, 40, 3, 0):
        d.rollback(ctx[:cut])
        fresh = SuffixDrafter(SuffixOptions(min_match=1, max_match=5))
        fresh.prefill(ctx[:cut])
        assert index_state(d.index) == index_state(fresh.index)
        if cut:
            assert propose(d, ctx[:cut], 8) == propose(fresh, ctx[:cut], 8)
    # a context that diverges (within the last SYNC_CHECK shared tokens) from what was
    # indexed is re-synced from the divergence
    other = [*ctx[:70], 99, *ctx[71:80]]
    propose(d, ctx, 4)
    got = propose(d, other, 8)
    fresh = SuffixDrafter(SuffixOptions(min_match=1, max_match=5))
    assert got == propose(fresh, other, 8)
    assert index_state(d.index) == index_state(fresh.index)


def test_reset_forgets_everything() -> None:
    d = SuffixDrafter()
    propose(d, [3, 4, 5, 3, 4], 4)
    d.reset()
    assert len(d.index) == 0 and d.last_match_len == 0
    assert propose(d, [3, 4, 6], 4) == []


# ------------------------------------------------------------------------- the loop
def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, vocab) for _ in range(rnd.randint(2, 30))] for _ in range(n)]


@pytest.mark.parametrize("order,vocab", [(1, 8), (2, 10), (3, 12)])
def test_greedy_speculative_is_bit_identical_to_plain(order: int, vocab: int) -> None:
    target = MockLM(MockSpec(vocab_size=vocab, order=order, seed=order))
    drafted = accepted = 0
    for prompt in _prompts(6, vocab, seed=order):
        plain = generate(target, None, prompt, max_new_tokens=60, k=0, stop_on_eos=False)
        for k in (1, 2, 4, 8, 16):
            drafter = SuffixDrafter(SuffixOptions(min_match=1 if order == 1 else 2))
            spec = generate(target, drafter, prompt, max_new_tokens=60, k=k, stop_on_eos=False)
            assert spec.tokens == plain.tokens, (prompt, k)
            drafted += sum(r.k for r in spec.rounds)
            accepted += sum(r.n_accepted for r in spec.rounds)
    assert drafted > 0 and accepted > 0  # the drafter did draft on this repetitive text


def test_rounds_without_a_match_are_plain_steps() -> None:
    target = MockLM(MockSpec(vocab_size=500, order=3, seed=4, sharpness=4.0))
    prompt = list(range(3, 40))
    res = generate(target, SuffixDrafter(), prompt, max_new_tokens=12, k=8, stop_on_eos=False)
    plain = generate(target, None, prompt, max_new_tokens=12, k=0, stop_on_eos=False)
    assert res.tokens == plain.tokens
    no_match = [r for r in res.rounds if r.k == 0]
    assert no_match and all(r.n_emitted == 1 for r in no_match)


def test_a_verbatim_copy_is_drafted_in_long_accepted_runs() -> None:
    """The target (a function of its last 3 tokens) rewrites text it wrote before once the
    prompt repeats the text's start; the suffix drafter should copy it in long runs."""
    target = MockLM(MockSpec(vocab_size=300, order=3, seed=11, sharpness=5.0))
    head = [5, 17, 42, 99]
    body = generate(target, None, head, max_new_tokens=120, k=0, stop_on_eos=False).tokens
    prompt = [*head, *body, 7, 8, 9, *head]
    plain = generate(target, None, prompt, max_new_tokens=100, k=0, stop_on_eos=False)
    assert plain.tokens == body[:100]  # the premise: the target copies
    res = generate(target, SuffixDrafter(), prompt, max_new_tokens=100, k=16, stop_on_eos=False)
    assert res.tokens == plain.tokens
    drafted = [r for r in res.rounds if r.k > 0]
    assert all(r.n_accepted == r.k for r in drafted)  # every drafted token was right
    assert max(r.n_accepted for r in res.rounds) == 16
    assert res.n_rounds <= 100 // 8  # vs 100 plain rounds


# ------------------------------------------------------------------------- sampled output
N_SEQ = 20_000
REPETITIVE_PROMPT = [3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4]


def _rejections_seen(results: list[GenerationResult]) -> tuple[int, int]:
    rounds = [r for res in results for r in res.rounds if r.k > 0]
    return len(rounds), sum(1 for r in rounds if r.n_accepted < r.k)


@pytest.mark.slow
@pytest.mark.parametrize("k,cfg", [(2, SamplingConfig(1.0)), (4, SamplingConfig(0.7, top_k=3))])
def test_sampled_sequences_follow_the_exact_target_distribution(
    k: int, cfg: SamplingConfig
) -> None:
    target = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0))
    results: list[GenerationResult] = []
    drafter = SuffixDrafter(SuffixOptions(min_match=1))
    p = first_tokens_pvalue(
        target,
        drafter,
        REPETITIVE_PROMPT,
        k=k,
        cfg=cfg,
        n_tokens=3,
        n_seq=N_SEQ,
        seed0=20_000,
        on_result=results.append,
    )
    drafted, rejected = _rejections_seen(results)
    assert drafted > N_SEQ // 2 and rejected > N_SEQ // 20  # both branches exercised
    assert p > 1e-3


@pytest.mark.slow
def test_the_distribution_check_catches_a_broken_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same check with a residual that does not remove the rejected one-hot draft: it fails."""
    from specdec.core import rejection

    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p / p.sum())
    target = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0))
    p = first_tokens_pvalue(
        target,
        SuffixDrafter(SuffixOptions(min_match=1)),
        REPETITIVE_PROMPT,
        k=2,
        cfg=SamplingConfig(1.0),
        n_tokens=3,
        n_seq=N_SEQ,
        seed0=20_000,
    )
    assert p < 1e-3
