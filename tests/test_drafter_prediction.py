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
from specdec.decoding import GenerationResult, generate
from specdec.drafters.base import Draft
from specdec.drafters.prediction import (
    SOURCE,
    PredictionDrafter,
    PredictionIndex,
)
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.mock import MockLM, MockSpec
from specdec.sampling import GREEDY, SamplingConfig
from specdec.theory import Costs

FLAT = Costs(verify_s=tuple(1.0 + 0.02 * n for n in range(32)), prefill_tps=1e3)
SERIAL = Costs(verify_s=tuple(float(n) for n in range(1, 33)), prefill_tps=1e3)
N_SEQ = 20_000


def _propose(d: PredictionDrafter, context: list[int], k: int = 8) -> Draft:
    return d.propose(context, k, GREEDY, torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------- the index
def test_resync_prefers_the_longest_match_then_the_nearest_ahead() -> None:
    index = PredictionIndex([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 7])
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
