"""The cost-aware suffix drafter (``drafters.planned``): the length rule, what it learns, and
exactness of the loop with it.

Thresholds (fixed before running): the sampled-distribution test uses 20,000 independent
sequences and requires the chi-square p-value of the first-three-token distribution against
the exact one to exceed 1e-3, as in test_drafter_suffix.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from seq_dist import first_tokens_pvalue
from specdec.core.loop import generate
from specdec.core.result import GenerationResult
from specdec.core.sampling import GREEDY, SamplingConfig
from specdec.drafters.planned import (
    BUCKETS,
    COPY,
    EXPLORE_BUDGET,
    EXPLORE_CREDIT,
    EXPLORE_LEN,
    EXPLORE_TRIALS,
    REPEAT,
    MatchPlanner,
    PlannedSuffixDrafter,
    Rate,
    best_length,
    bucket_of,
    planned_suffix,
)
from specdec.drafters.suffix import SuffixDrafter, SuffixOptions
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, MockSpec
from specdec.pairs import is_model_free, is_planned, load_pair
from specdec.theory import Costs

# a pass over n tokens costs n steps (serial) / about one step (batch-parallel)
SERIAL = Costs(verify_s=tuple(float(n) for n in range(1, 17)), prefill_tps=1e3)
FLAT = Costs(verify_s=tuple(1.0 + 0.02 * n for n in range(16)), prefill_tps=1e3)
# the measured llama.cpp curve of the 1.5B Q4_K_M on the 2-core development machine
# (benchmarks/results/verify-curve-1.5b-q4_k_m-wide.json, default setting), as ratios for
# n = 1..17 (linear between the measured n: 1-6, 8, 12, 16, 24); a draft of 16 needs 17 rows
LLAMACPP_HERE = Costs(
    verify_s=(1.0, 1.54, 2.07, 2.34, 2.96, 3.34, 4.5, 5.66, 6.02, 6.39, 6.76, 7.12)
    + (7.12,) * 4
    + (7.59,),
    prefill_tps=1e3,
)


# ------------------------------------------------------------------------- the length rule
def test_serial_verification_never_drafts_even_at_high_acceptance() -> None:
    # with v(n) = n a draft of L costs L + 1 steps and yields at most L + 1 tokens
    assert best_length(0.95, 0.95, 8, SERIAL) == 0


def test_flat_verification_drafts_everything_that_may_be_kept() -> None:
    assert best_length(0.9, 0.9, 8, FLAT) == 8


def test_the_opposite_verdicts_on_the_measured_curve() -> None:
    """On this machine's llama.cpp curve: a likely copy drafts, a coin flip does not."""
    assert best_length(0.9, 0.97, 16, LLAMACPP_HERE) >= 4
    assert best_length(0.4, 0.7, 16, LLAMACPP_HERE) == 0
    # break-even of a one-token draft is at v(2) - 1 = 0.54
    assert best_length(0.5, 0.0, 1, LLAMACPP_HERE) == 0
    assert best_length(0.6, 0.0, 1, LLAMACPP_HERE) == 1


def test_buckets_cover_every_match_length() -> None:
    assert bucket_of(1) == 0
    assert bucket_of(2) == 1
    assert bucket_of(5) == BUCKETS.index(4)
    assert bucket_of(100) == len(BUCKETS) - 1
    with pytest.raises(AssertionError):
        bucket_of(0)


def test_rates_learn_from_their_trials_and_start_optimistic() -> None:
    r = Rate(0.5)
    assert r.mean == pytest.approx(0.5)
    assert r.optimistic > r.mean
    for _ in range(20):
        r.add(True)
    assert r.mean > 0.9
    for _ in range(200):
        r.add(False)
    assert r.mean < 0.1


def test_the_planner_learns_that_a_bucket_pays_or_does_not() -> None:
    good, bad = MatchPlanner(LLAMACPP_HERE), MatchPlanner(LLAMACPP_HERE)
    for _ in range(30):
        good.observe(3, 4, 4)  # every 3-token match was a 4-token copy
        bad.observe(3, 1, 0)  # every 3-token match was wrong at once
    assert good.length(3, 8) >= 4
    assert bad.length(3, 8) == 0
    assert good.length(0, 8) == 0 and good.length(3, 0) == 0


def test_a_draft_only_optimism_justifies_is_short() -> None:
    """A fresh bucket whose prior mean does not pay for a draft on this machine's curve
    (3-token matches: first token 0.4) but whose optimistic rate does explores with one
    token; without the cap (explore_len=None) it drafts three, and a rejected three-token
    draft costs v(4) - v(1) = 1.34 steps instead of v(2) - v(1) = 0.54."""
    assert best_length(Rate(0.4).mean, 0.75, 16, LLAMACPP_HERE) == 0
    assert MatchPlanner(LLAMACPP_HERE).length(3, 16) == EXPLORE_LEN == 1
    assert MatchPlanner(LLAMACPP_HERE, None).length(3, 16) == 3
    # a bucket whose prior mean already pays (8-token matches) drafts its length either way
    assert MatchPlanner(LLAMACPP_HERE).length(8, 16) == 3
    assert MatchPlanner(LLAMACPP_HERE, None).length(8, 16) == 3
    # after EXPLORE_TRIALS trials the mean decides, with no cap: a bucket that kept every
    # first token drafts long
    p = MatchPlanner(LLAMACPP_HERE)
    for _ in range(EXPLORE_TRIALS):
        p.observe(3, 1, 1)
    assert p.length(3, 16) >= 3


def test_exploring_where_nothing_is_kept_costs_at_most_the_cap() -> None:
    """Every draft rejected at its first token: the capped planner drafts at most one token
    per exploring round and stops once the mean decides; uncapped it drafts more."""

    def drafted_when_all_rejected(planner: MatchPlanner) -> int:
        total = 0
        for _ in range(20):
            for m in (2, 3, 4):  # the buckets whose prior mean does not pay here
                n = planner.length(m, 16)
                planner.observe(m, n, 0)
                total += n
        return total

    capped = drafted_when_all_rejected(MatchPlanner(LLAMACPP_HERE))
    assert capped <= 3 * EXPLORE_TRIALS
    assert drafted_when_all_rejected(MatchPlanner(LLAMACPP_HERE, None)) > capped
    with pytest.raises(ConfigError, match="explore_len"):
        PlannedSuffixDrafter(SuffixDrafter(SuffixOptions()), FLAT, explore_len=0)


def test_observe_counts_only_the_tested_positions() -> None:
    p = MatchPlanner(FLAT)
    b = bucket_of(4)
    p.observe(4, 5, 2)  # tokens 1, 2 kept, token 3 rejected, 4-5 never tested
    assert p.first[b].trials == 1 and p.first[b].successes == 1
    assert p.cont[b].trials == 2 and p.cont[b].successes == 1
    p.observe(4, 0, 0)  # a round that drafted nothing teaches nothing
    assert p.first[b].trials == 1


# ------------------------------------------------------------------------- the drafter
def test_it_learns_how_much_of_each_draft_the_context_kept() -> None:
    inner = SuffixDrafter(SuffixOptions(min_match=2))
    d = PlannedSuffixDrafter(inner, FLAT)
    gen = torch.Generator().manual_seed(0)
    ctx = [1, 2, 3, 4, 5, 1, 2, 3]
    draft = d.propose(ctx, 4, GREEDY, gen).tokens
    assert draft and draft[0] == 4
    # the verifier kept one token and emitted 9 where the draft had draft[1]
    d.rollback([*ctx, draft[0], 9])
    assert d.planners[COPY].trace == [(inner.last_match_len, len(draft), 1)]
    assert d.planners[REPEAT].trace == []  # the draft copied the prompt


def test_planned_needs_costs_and_is_a_model_free_reference() -> None:
    assert is_planned("planned") and is_planned("planned:min_match=3")
    assert is_model_free("planned") and not is_planned("suffix")
    with pytest.raises(ConfigError, match="measured costs"):
        load_pair("planned", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        PlannedSuffixDrafter(object(), FLAT)  # type: ignore[arg-type]


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, vocab) for _ in range(rnd.randint(2, 30))] for _ in range(n)]


@pytest.mark.parametrize("costs", [FLAT, LLAMACPP_HERE, SERIAL])
@pytest.mark.parametrize("order,vocab", [(1, 8), (3, 12)])
def test_greedy_output_is_bit_identical_to_plain(order: int, vocab: int, costs: Costs) -> None:
    target = MockLM(MockSpec(vocab_size=vocab, order=order, seed=order))
    for prompt in _prompts(5, vocab, seed=order):
        plain = generate(target, None, prompt, max_new_tokens=60, k=0, stop_on_eos=False)
        drafter = PlannedSuffixDrafter(SuffixDrafter(SuffixOptions(min_match=1)), costs)
        spec = generate(target, drafter, prompt, max_new_tokens=60, k=16, stop_on_eos=False)
        assert spec.tokens == plain.tokens, prompt


def test_a_verbatim_copy_drafts_long_and_novel_text_falls_back_to_plain_steps() -> None:
    """The same copy as in test_drafter_suffix, on this machine's llama.cpp curve: the planner
    learns the copy and drafts it in long runs; on the serial curve it never drafts."""
    target = MockLM(MockSpec(vocab_size=300, order=3, seed=11, sharpness=5.0))
    head = [5, 17, 42, 99]
    body = generate(target, None, head, max_new_tokens=120, k=0, stop_on_eos=False).tokens
    prompt = [*head, *body, 7, 8, 9, *head]
    plain = generate(target, None, prompt, max_new_tokens=100, k=0, stop_on_eos=False)
    here = generate(
        target,
        PlannedSuffixDrafter(SuffixDrafter(), LLAMACPP_HERE),
        prompt,
        max_new_tokens=100,
        k=16,
        stop_on_eos=False,
    )
    assert here.tokens == plain.tokens
    assert max(r.n_accepted for r in here.rounds) >= 8
    assert here.n_rounds <= 100 // 4
    serial = generate(
        target,
        PlannedSuffixDrafter(SuffixDrafter(), SERIAL),
        prompt,
        max_new_tokens=100,
        k=16,
        stop_on_eos=False,
    )
    assert serial.tokens == plain.tokens
    assert all(r.k == 0 for r in serial.rounds)


def test_a_fixed_seed_gives_a_fixed_output_and_length_trace() -> None:
    target = MockLM(MockSpec(vocab_size=6, order=2, sharpness=1.0))
    cfg = SamplingConfig(1.0)
    runs = []
    for _ in range(2):
        d = PlannedSuffixDrafter(SuffixDrafter(SuffixOptions(min_match=1)), FLAT)
        res = generate(target, d, [3, 4, 2, 3, 4], max_new_tokens=40, k=8, sampling=cfg, seed=5)
        runs.append((res.tokens, [r.k for r in res.rounds]))
    assert runs[0] == runs[1]


N_SEQ = 20_000
REPETITIVE_PROMPT = [3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4]


@pytest.mark.slow
def test_sampled_sequences_follow_the_exact_target_distribution() -> None:
    target = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0))
    results: list[GenerationResult] = []
    drafter = PlannedSuffixDrafter(SuffixDrafter(SuffixOptions(min_match=1)), FLAT)
    p = first_tokens_pvalue(
        target,
        drafter,
        REPETITIVE_PROMPT,
        k=4,
        cfg=SamplingConfig(0.8, top_k=4),
        n_tokens=3,
        n_seq=N_SEQ,
        seed0=40_000,
        on_result=results.append,
    )
    rounds = [r for res in results for r in res.rounds if r.k > 0]
    assert len(rounds) > N_SEQ // 2  # it drafted
    assert sum(1 for r in rounds if r.n_accepted < r.k) > N_SEQ // 20  # and was rejected
    assert p > 1e-3


@pytest.mark.parametrize("costs", [FLAT, LLAMACPP_HERE])
def test_the_profiles_round_walk_probe_reproduces_a_real_runs_rounds(costs: Costs) -> None:
    """The profile predicts the planned drafter from ``round_walk_probe`` simulated at its
    cap; for greedy decoding that must be exactly the rounds a real run makes."""
    from specdec.profiler.measure import round_walk_probe
    from specdec.profiler.predict import simulate

    target = MockLM(MockSpec(vocab_size=300, order=3, seed=11, sharpness=5.0))
    head = [5, 17, 42, 99]
    body = generate(target, None, head, max_new_tokens=60, k=0, stop_on_eos=False).tokens
    prompt = [*head, *body[:30], 7, 8, 9, *head]
    real = generate(
        target,
        PlannedSuffixDrafter(SuffixDrafter(), costs),
        prompt,
        max_new_tokens=50,
        k=16,
        stop_on_eos=False,
    )
    seq = round_walk_probe(PlannedSuffixDrafter(SuffixDrafter(), costs), prompt, real.tokens, 16)
    plan = simulate(seq, 16)
    assert list(plan.drafted) == [r.k for r in real.rounds]
    assert list(plan.kept) == [r.n_accepted for r in real.rounds]
    assert any(r.k > 0 for r in real.rounds)  # it drafted: the comparison is not trivial


def test_copies_of_the_prompt_and_repeats_of_the_output_learn_apart_and_draft_up_to_64() -> None:
    """The planned drafter keeps one planner per source: a draft copying the prompt teaches
    the copy planner, one repeating the output's own text the repeat planner. Its suffix
    drafter drafts up to 64 tokens, so on a flat 65-row curve a long verbatim copy of the
    prompt is drafted in passes past 17 rows (``planned:max_draft=16`` keeps the old cap)."""
    from specdec.drafters.planned import planned_suffix
    from specdec.profiler.measure import round_walk_probe

    flat65 = Costs(verify_s=tuple(1.0 + 0.01 * n for n in range(65)), prefill_tps=1e3)
    body = list(range(20, 320))
    prompt = [*body, 7, 8]
    for opts, cap in (("", 64), ("max_draft=16", 16)):
        d = PlannedSuffixDrafter(planned_suffix(opts), flat65)
        seq = round_walk_probe(d, prompt, body, 64)
        assert max(drafted for drafted, _ in seq.proposals or ()) == cap
    d = PlannedSuffixDrafter(planned_suffix(), flat65)
    gen = torch.Generator().manual_seed(0)
    d.propose(prompt, 8, GREEDY, gen)  # the prompt's first context: no match yet
    ctx = [*prompt, *body[:4]]
    d.propose(ctx, 8, GREEDY, gen)  # copies the prompt
    d.rollback([*ctx, *body[4:6], 99])
    assert len(d.planners[COPY].trace) == 1 and d.planners[REPEAT].trace == []
    ctx = [*ctx, *body[4:6], 99, *body[4:6]]  # the output repeats its own "body[4:6] 99"
    draft = d.propose(ctx, 8, GREEDY, gen)
    assert draft.tokens[:1] == [99]
    d.rollback([*ctx, 99, 5])
    assert len(d.planners[REPEAT].trace) == 1


# ------------------------------------------------------------- the fresh-text floor (issue 61)
# a steep verify curve as measured on the 2-core AMD EPYC with AVX-512 (verify(2) about 1.9
# steps, then about 0.45 a row): a rejected draft costs nearly a step per row
STEEP = Costs(verify_s=(1.0, 1.9, *tuple(1.9 + 0.45 * i for i in range(1, 15))), prefill_tps=1e3)


def _lure_trace(seed: int, alphabet: int = 3) -> tuple[list[int], list[int]]:
    """Prompt and output drawn uniformly from a few tokens: suffix matches of every length
    are everywhere, in the prompt and in the output, but what followed a match before follows
    it again only by chance (1 in ``alphabet``). Text with nothing to copy, dressed as text
    with much to copy."""
    rng = random.Random(seed)
    prompt = [100 + rng.randrange(alphabet) for _ in range(300)]
    return prompt, [100 + rng.randrange(alphabet) for _ in range(400)]


def _walk(drafter: PlannedSuffixDrafter, prompt: list[int], out: list[int], costs: Costs):
    from specdec.profiler.measure import round_walk_probe
    from specdec.profiler.predict import plan_seconds, simulate

    plan = simulate(round_walk_probe(drafter, prompt, out, 64), 64)
    return plan, plan_seconds(plan, costs)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("costs", [STEEP, LLAMACPP_HERE], ids=["steep", "measured"])
def test_on_text_where_drafts_do_not_pay_the_planner_stays_within_its_budget(
    costs: Costs, seed: int
) -> None:
    """No timing: the round walk of a greedy run, charged the injected verify curve. Every
    draft is right only by chance, so drafting loses; the regret budget bounds the loss at
    EXPLORE_BUDGET of plain decoding's time (EXPLORE_CREDIT tokens counted up front). The
    fixture that must fail: the same planner without the budget loses more than that (1.7 to
    2.4 times the bound on these texts)."""
    prompt, out = _lure_trace(seed)
    plain = len(out) * costs.round_seconds(0)
    bound = EXPLORE_BUDGET * costs.round_seconds(0) * (len(out) + EXPLORE_CREDIT)
    plan, seconds = _walk(PlannedSuffixDrafter(planned_suffix(), costs), prompt, out, costs)
    assert sum(plan.drafted) > 0  # it did try
    assert seconds - plain <= bound + 1e-9
    assert plain / seconds >= 1 - 2 * EXPLORE_BUDGET  # >= 0.98x plain decoding here
    _, unbounded = _walk(
        PlannedSuffixDrafter(planned_suffix(), costs, explore_budget=None), prompt, out, costs
    )
    assert unbounded - plain > bound  # the opposite verdict without the budget


def test_under_the_budget_a_real_copy_still_drafts_long_on_a_steep_curve() -> None:
    """The budget earns back what paying drafts save: a verbatim copy of the prompt ramps up
    to long drafts and beats plain decoding on the steep curve too."""
    rng = random.Random(3)
    doc = [rng.randrange(1000, 50_000) for _ in range(400)]
    prompt, out = [*doc, 7, 8, 9, *doc[:3]], doc[3:300]
    plan, seconds = _walk(PlannedSuffixDrafter(planned_suffix(), STEEP), prompt, out, STEEP)
    assert max(plan.drafted) == len(STEEP.verify_s) - 1  # the longest the curve covers
    assert sum(plan.kept) >= len(out) // 2
    assert len(out) * STEEP.round_seconds(0) / seconds > 1.5
