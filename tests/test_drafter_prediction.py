"""The prediction drafter (``drafters.prediction``, OpenAI's Predicted Outputs): where it drafts
from, how it re-synchronises after the output leaves the prediction, its counts, and
exactness of the loop with it.

Thresholds (fixed before running): each sampled-distribution test uses 20,000 independent
sequences and requires the chi-square p-value of the first-three-token distribution against
the exact one to exceed 1e-3 (as test_drafter_planned.py); the seeds are fixed, so the
outcome is deterministic.
"""

from __future__ import annotations

import random

import pytest
import torch

from seq_dist import first_tokens_pvalue
from specdec.core.drafter import Draft
from specdec.core.loop import generate
from specdec.core.result import GenerationResult
from specdec.core.sampling import GREEDY, SamplingConfig
from specdec.drafters.prediction import (
    SOURCE,
    PredictionDrafter,
)
from specdec.drafters.span_index import SpanIndex
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.mock import MockLM, MockSpec
from specdec.theory import Costs

FLAT = Costs(verify_s=tuple(1.0 + 0.02 * n for n in range(32)), prefill_tps=1e3)
SERIAL = Costs(verify_s=tuple(float(n) for n in range(1, 33)), prefill_tps=1e3)
N_SEQ = 20_000


def _propose(d: PredictionDrafter, context: list[int], k: int = 8) -> Draft:
    return d.propose(context, k, GREEDY, torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------- the index
def test_resync_prefers_the_longest_match_then_the_nearest_ahead() -> None:
    index = SpanIndex([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 7])
    # "1 2" ends at 2, 6 and 11; "9 1 2" only at 6 -> the longer match wins
    assert index.resync([9, 1, 2], expected=0) == (6, 3)
    # equal length: the nearest at or ahead of where the output left wins, then behind
    assert index.resync([8, 1, 2], expected=5) == (6, 2)
    assert index.resync([8, 1, 2], expected=7) == (11, 2)
    assert index.resync([8, 1, 2], expected=11) == (11, 2)
    assert index.resync([8, 1, 2], expected=12) == (11, 2)  # nothing ahead: nearest behind
    assert index.resync([8, 6], expected=0) is None
    assert index.resync([1], expected=0) is None  # one token is not a match
    assert index.skip_to(4, 2) == 8 and index.skip_to(4, 9) is None


# --------------------------------------------------------------------------- the drafter
def test_drafts_the_prediction_in_sync_and_follows_the_kept_tokens() -> None:
    d = PredictionDrafter([10, 11, 12, 13, 14, 15, 16], costs=None)
    d.reset()
    prompt = [1, 2, 3]
    assert _propose(d, prompt, k=4).tokens == [10, 11, 12, 13]
    draft = _propose(d, [*prompt, 10, 11, 12, 13, 14], k=4)  # all kept + a bonus equal to P
    assert draft.tokens == [15, 16] and draft.source == SOURCE


def test_begin_places_the_output_after_the_prompt_for_an_engine_that_drafts_late() -> None:
    """vLLM's first proposal comes after the first output token: with ``begin`` the drafter
    continues from there; without it, it takes that token for the prompt and drafts the
    prediction one token too early (the wrong-offset fault, every draft rejected)."""
    prediction, prompt = [10, 11, 12, 13, 14, 15, 16], [1, 2, 3]
    late = PredictionDrafter(prediction, costs=None)
    late.begin(prompt)
    assert _propose(late, [*prompt, 10], k=4).tokens == [11, 12, 13, 14]
    unaware = PredictionDrafter(prediction, costs=None)
    assert _propose(unaware, [*prompt, 10], k=4).tokens == [10, 11, 12, 13]
    with pytest.raises(AssertionError):
        late.begin(prompt)  # only before the first proposal


def test_set_costs_resizes_drafts_and_keeps_what_was_learned() -> None:
    d = PredictionDrafter(list(range(10, 60)), costs=None)
    prompt = [1, 2, 3]
    assert len(_propose(d, prompt, k=16).tokens) == 16  # no costs: as far as K allows
    d.set_costs(SERIAL)  # a verified row costs a full step: no draft pays
    context = [*prompt, *range(10, 27)]
    assert _propose(d, context, k=16).tokens == []
    assert d.planners is not None
    learned = [r.trials for p in d.planners.values() for r in p.first]
    assert sum(learned) == 1  # the 16-token draft, kept whole, was learned from
    d.set_costs(FLAT)  # nearly free rows: 16 again, the learned rates kept
    assert len(_propose(d, context, k=16).tokens) == 16
    assert [r.trials for p in d.planners.values() for r in p.first] == learned
    assert all(p.costs is FLAT for p in d.planners.values())


def test_resynchronises_after_an_insertion_a_deletion_and_a_replacement() -> None:
    pred = list(range(100, 140))
    d = PredictionDrafter(pred, costs=None)
    d.reset()
    prompt = [1, 2]
    _propose(d, prompt)
    # insertion: the output leaves P after 100 101 with 7 8, then rejoins with 102 103
    ctx = [*prompt, 100, 101, 7]
    d.rollback(ctx)
    assert _propose(d, ctx).tokens == []  # lost, no fallback
    ctx += [8, 102, 103]
    assert _propose(d, ctx, k=3).tokens == [104, 105, 106]
    # deletion: 107..109 skipped, the output goes on with 110: one token re-anchors ahead
    ctx += [104, 105, 106, 110]
    assert _propose(d, ctx, k=2).tokens == [111, 112]
    # replacement: 113 replaced by 5, then 114: the token after re-anchors at its place
    ctx += [111, 112, 5]
    ctx += [114]
    assert _propose(d, ctx, k=2).tokens == [115, 116]


def test_the_fallback_drafts_where_the_prediction_has_no_match() -> None:
    d = PredictionDrafter([50, 51, 52], costs=None, fallback=SuffixDrafter())
    d.reset()
    prompt = [7, 8, 9, 3, 7, 8]
    assert _propose(d, prompt).tokens == [50, 51, 52]  # the prediction first
    ctx = [*prompt, 1, 7, 8]  # left it at once
    draft = _propose(d, ctx)
    alone = SuffixDrafter().propose(ctx, 8, GREEDY, torch.Generator())
    assert draft.source is None and draft.tokens == alone.tokens and len(alone.tokens) > 0


def test_a_wrong_prediction_gets_short_drafts_on_a_serial_target() -> None:
    """On a target where a verified row costs a full step, the planner stops drafting a
    prediction that is never kept (exploring drafts are 1 token long)."""
    target = MockLM(MockSpec(vocab_size=64, order=2, seed=3, sharpness=6.0))
    wrong = [(t + 7) % 64 for t in range(200)]  # nothing like the target's output
    res = generate(
        target, PredictionDrafter(wrong, costs=SERIAL), [5, 6, 7], max_new_tokens=60, k=16
    )
    assert max(r.k for r in res.rounds) <= 1
    accepted, rejected = res.prediction_tokens()
    assert accepted + rejected == sum(r.k for r in res.rounds if r.source == SOURCE)


# ------------------------------------------------------------------------ exactness
def _greedy(target: MockLM, drafter: object, prompt: list[int], k: int = 12) -> GenerationResult:
    return generate(  # type: ignore[arg-type]
        target, drafter, prompt, max_new_tokens=64, k=k, stop_on_eos=False
    )


def _predictions(truth: list[int], vocab: int, seed: int) -> dict[str, list[int]]:
    rnd = random.Random(seed)
    edited = list(truth)
    for _ in range(4):  # a few insertions, deletions and replacements
        i = rnd.randrange(len(edited))
        op = rnd.choice("idr")
        if op == "i":
            edited.insert(i, rnd.randrange(vocab))
        elif op == "d":
            del edited[i]
        else:
            edited[i] = rnd.randrange(vocab)
    return {
        "exact": truth,
        "edited": edited,
        "wrong everywhere": [(t + 1) % vocab for t in truth],
        "shifted by one": truth[1:],
        "another language": [rnd.randrange(vocab) for _ in truth],
        "empty": [],
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_output_with_any_prediction_is_the_output_without_it(seed: int) -> None:
    target = MockLM(MockSpec(vocab_size=48, order=2, seed=seed, sharpness=3.0))
    prompt = [3, 9, 4, 1]
    plain = _greedy(target, None, prompt, k=0).tokens
    for name, pred in _predictions(plain, 48, seed).items():
        for costs in (None, FLAT, SERIAL):
            for fallback in (None, SuffixDrafter()):
                d = PredictionDrafter(pred, costs=costs, fallback=fallback)
                res = _greedy(target, d, prompt)
                assert res.tokens == plain, (name, costs, fallback)
                acc, rej = res.prediction_tokens()
                assert acc + rej == sum(r.k for r in res.rounds if r.source == SOURCE)
                if name == "exact" and costs is not SERIAL:  # nearly all from the prediction
                    assert acc == len(plain) - res.n_rounds and rej == 0


def test_counts_follow_openai_definitions() -> None:
    """accepted = prediction tokens that appear in the completion; rejected = prediction
    tokens proposed that do not (rejected by the verifier or cut by the length limit)."""
    target = MockLM(MockSpec(vocab_size=32, order=2, seed=5, sharpness=8.0))
    prompt = [1, 2, 3]
    truth = _greedy(target, None, prompt, k=0).tokens
    pred = [*truth[:10], (truth[10] + 1) % 32, *truth[11:]]
    res = generate(
        target,
        PredictionDrafter(pred, costs=None),
        prompt,
        max_new_tokens=20,
        k=32,
        stop_on_eos=False,
    )
    acc, rej = res.prediction_tokens()
    assert res.tokens == truth[:20]
    assert 10 <= acc <= len(res.tokens)  # tokens 0..9 kept in the first round
    assert rej >= 1  # the replaced token at least
    drafted = sum(r.k for r in res.rounds if r.source == SOURCE)
    assert acc + rej == drafted


@pytest.mark.parametrize("name", ["exact", "shifted by one", "wrong everywhere"])
def test_sampled_output_follows_the_exact_target_distribution(name: str) -> None:
    target = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0))
    prompt = [1, 3, 2, 4]
    cfg = SamplingConfig(0.9, top_k=4)
    # a prediction from one likely continuation, so its drafts are often kept and often not
    likely = _greedy(target, None, prompt, k=0).tokens[:8]
    pred = _predictions(likely, 5, 0)[name]
    results: list[GenerationResult] = []
    p = first_tokens_pvalue(
        target,
        PredictionDrafter(pred, costs=FLAT, fallback=SuffixDrafter()),
        prompt,
        k=4,
        cfg=cfg,
        n_tokens=3,
        n_seq=N_SEQ,
        seed0={"exact": 50_000, "shifted by one": 60_000, "wrong everywhere": 70_000}[name],
        on_result=results.append,
    )
    rounds = [r for res in results for r in res.rounds if r.source == SOURCE]
    assert len(rounds) > N_SEQ // 4  # it drafted from the prediction
    assert sum(r.n_accepted < r.k for r in rounds) > N_SEQ // 20  # and was rejected
    assert p > 1e-3


# --------------------------------------------------- bounded re-synchronisation (42.3)
class CountingTokens(list[int]):
    """The prediction's tokens, counting every read (what re-synchronising scans)."""

    reads = 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        got = super().__getitem__(i)
        CountingTokens.reads += len(got) if isinstance(i, slice) else 1
        return got


def _most_reads_per_round(n_tokens: int) -> int:
    """Prediction reads of the busiest round, replaying an output that follows a periodic
    prediction (1 2 3 4 5 ...) but leaves it every 7 tokens with three tokens it lacks (9):
    it rejoins on a token pair that occurs at every period of the prediction."""
    from specdec.profiler.measure import round_walk_probe

    pattern = [1, 2, 3, 4, 5]
    prediction = pattern * (n_tokens // len(pattern))
    output = [
        t for i, t in enumerate(prediction[:300]) for t in ((t, 9, 9, 9) if i % 7 == 6 else (t,))
    ]
    d = PredictionDrafter(prediction, costs=FLAT)
    d.index.tokens = CountingTokens(d.index.tokens)
    reads: list[int] = []
    propose = d.propose

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        before = CountingTokens.reads
        draft = propose(*args, **kwargs)
        reads.append(CountingTokens.reads - before)
        return draft

    d.propose = counted  # type: ignore[method-assign]
    seq = round_walk_probe(d, [7, 8], output, 16)
    assert sum(drafted for drafted, _ in seq.proposals or ()) > 0  # it drafted the prediction
    return max(reads)


def test_resync_costs_an_index_lookup_whatever_the_predictions_length() -> None:
    """A periodic prediction holds its last two tokens at every period: walking every
    occurrence (as re-synchronising did) reads the whole prediction each round. The busiest
    round must read no more of a 100,000-token prediction than of a 1,000-token one, and at
    most a bound fixed in advance (the draft and its edits plus the index's bounded lookups:
    ``span_index.resync_bound`` counts the lookups themselves)."""
    from specdec.drafters.span_index import SKIP_WINDOW, resync_bound

    small, large = _most_reads_per_round(1_000), _most_reads_per_round(100_000)
    bound = 2 * 17 * (1 + 4 * 16) + SKIP_WINDOW + resync_bound(2**32)  # K = 16
    assert large <= bound and small <= bound, (small, large, bound)
    assert large <= 2 * small + 64, (small, large)


def test_the_index_counts_a_bounded_number_of_probes_per_lookup() -> None:
    from specdec.drafters.span_index import resync_bound

    for n in (100, 100_000):
        index = SpanIndex([1, 2, 3, 4, 5] * (n // 5))
        index.resync([9, 4, 5], expected=n // 2)
        assert 0 < index.probes <= resync_bound(n)
    assert resync_bound(2**32) < 1_000  # a few hundred probes, for any prediction


# ------------------------------------------- re-synchronising in the same round (41.2)
def _walk(d: object, prompt: list[int], output: list[int], k: int = 16) -> list[tuple[int, int]]:
    """(drafted, kept) of each round of a greedy run whose output is ``output``."""
    from specdec.profiler.measure import round_walk_probe

    seq = round_walk_probe(d, prompt, output, k)  # type: ignore[arg-type]
    rounds, t = [], 0
    assert seq.proposals is not None
    while t < len(output):
        drafted, kept = seq.proposals[t]
        rounds.append((drafted, kept))
        t += kept + 1
    return rounds


def test_after_a_replaced_token_the_next_round_drafts_where_the_output_rejoins() -> None:
    """One token of the prediction replaced: the round the rejection ends with emits the new
    token, and the very next round drafts the rest of the prediction from after it (no plain
    round in between, as waiting for the output to show a matching pair took)."""
    pred = list(range(100, 160))
    output = [*pred[:20], 7, *pred[21:]]
    rounds = _walk(PredictionDrafter(pred, costs=FLAT), [1, 2], output)
    first_miss = next(i for i, (d, kept) in enumerate(rounds) if kept < d)
    assert rounds[first_miss + 1][0] > 0 and rounds[first_miss + 1][1] > 0  # drafted, kept
    assert all(d > 0 for d, _ in rounds[:-1])  # never a plain round


def test_an_inserted_token_costs_no_plain_round_either() -> None:
    pred = list(range(100, 160))
    output = [*pred[:20], 7, *pred[20:]]
    rounds = _walk(PredictionDrafter(pred, costs=FLAT), [1, 2], output)
    assert all(d > 0 for d, _ in rounds[:-1])
    assert sum(kept < d for d, kept in rounds) <= 2  # the edit, and at most one wrong guess


def test_an_edit_repeated_through_the_prediction_is_drafted_where_it_repeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rename through a text (one token replaced by two wherever it occurs): after the
    first occurrence the edit is replayed, so the later ones are drafted and kept instead of
    each costing a rejected draft (the fixture: with replays switched off, every use does)."""
    from specdec.drafters import prediction_state

    old, new = 50, (60, 61)
    pred = [t for i in range(8) for t in (*range(10 + 5 * i, 15 + 5 * i), old)]  # 8 uses
    output = [u for t in pred for u in (new if t == old else (t,))]

    def rejected() -> int:
        rounds = _walk(PredictionDrafter(pred, costs=FLAT), [1, 2], output)
        return sum(kept < d for d, kept in rounds)

    assert rejected() <= 3  # the first use (and its rejoin), not all 8
    monkeypatch.setattr(prediction_state, "EDIT_MIN_RATE", 2.0)  # no edit is ever replayed
    assert rejected() >= 8


# ---------------------------------------------------- drafts up to 64 where they pay (41.1)
def _longest(costs: Costs, k: int = 64) -> int:
    pred = list(range(100, 400))
    return max(d for d, _ in _walk(PredictionDrafter(pred, costs=costs), [1, 2], pred, k))


def test_drafts_grow_past_16_where_the_curve_pays_and_only_there() -> None:
    flat65 = Costs(verify_s=tuple(1.0 + 0.01 * n for n in range(65)), prefill_tps=1e3)
    assert _longest(flat65) == 64  # a flat curve: drafts of 64 once the copy is trusted
    assert _longest(flat65, k=16) == 16  # the old cap, as a switch
    # a curve that is flat to 17 rows and doubles after: no draft needs more than 17 rows
    step = Costs(
        verify_s=tuple(1.0 + 0.01 * n if n < 17 else 2.0 * (n + 1) for n in range(65)),
        prefill_tps=1e3,
    )
    assert _longest(step) == 16
    # a curve measured only to 17 rows: never a longer pass (no extrapolation)
    short = Costs(verify_s=tuple(1.0 + 0.01 * n for n in range(17)), prefill_tps=1e3)
    assert _longest(short) == 16
