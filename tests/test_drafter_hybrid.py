"""The hybrid drafter: suffix drafts where there is a match, the model's elsewhere; the model's
cache stays a prefix of the accepted context after every round.

Thresholds (fixed before running): the sampled-distribution test uses 20,000 independent
sequences and requires the chi-square p-value of the first-four-token distribution against
the exact one to exceed 1e-3, as in test_decoding.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from seq_dist import first_tokens_pvalue
from specdec.core.loop import generate, generate_stream
from specdec.core.model_drafter import ModelDrafter
from specdec.core.result import GenerationResult
from specdec.core.sampling import GREEDY, SamplingConfig
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.suffix import SuffixDrafter, SuffixOptions
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, MockSpec, mock_pair


def hybrid(
    draft_model: MockLM, *, min_match: int = 2, model_max_k: int | None = None
) -> HybridDrafter:
    suffix = SuffixDrafter(SuffixOptions(min_match=min_match))
    return HybridDrafter(suffix, ModelDrafter(draft_model), model_max_k=model_max_k)


def assert_model_cache_in_sync(h: HybridDrafter, draft_model: MockLM, ctx: list[int]) -> None:
    fed = h.model._fed
    assert draft_model.cached_tokens == fed  # the drafter's record is the cache
    assert fed == ctx[: len(fed)]  # and a prefix of the accepted context
    assert h.suffix.index.tokens == ctx[: len(h.suffix.index)]


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, vocab) for _ in range(rnd.randint(2, 25))] for _ in range(n)]


def test_bad_model_k_is_a_config_error() -> None:
    draft, _ = mock_pair("close")
    with pytest.raises(ConfigError):
        hybrid(draft, model_max_k=-1)


@pytest.mark.parametrize("closeness", ["identical", "close", "far"])
@pytest.mark.parametrize("k", [1, 3, 6, 12])
def test_greedy_is_bit_identical_to_plain_and_the_caches_stay_in_sync(
    closeness: str, k: int
) -> None:
    draft, target = mock_pair(closeness, vocab_size=12, order=2)
    h = hybrid(draft, model_max_k=4)
    used = {"suffix": 0, "model": 0}
    for prompt in _prompts(4, 12, seed=k):
        plain = generate(target, None, prompt, max_new_tokens=50, k=0, stop_on_eos=False)
        ctx = list(prompt)
        got: list[int] = []
        for ev in generate_stream(target, h, prompt, max_new_tokens=50, k=k, stop_on_eos=False):
            ctx += ev.tokens
            got += ev.tokens
            assert target.cached_tokens == ctx[:-1]
            assert_model_cache_in_sync(h, draft, ctx)
            assert ev.k <= (k if h.last_source == "suffix" else min(k, 4))
        assert got == plain.tokens
        used["suffix"] += h.suffix_rounds  # counters restart with each generation
        used["model"] += h.model_rounds
    assert used["suffix"] > 0 and used["model"] > 0  # both sources were used


def test_the_model_is_only_asked_when_the_suffix_drafter_has_nothing() -> None:
    draft, target = mock_pair("close", vocab_size=300, order=3)
    h = hybrid(draft)
    head = [5, 17, 42, 99]
    body = generate(target, None, head, max_new_tokens=60, k=0, stop_on_eos=False).tokens
    prompt = [*head, *body, 7, 8, 9, *head]  # the continuation copies body
    ctx = list(prompt)
    calls_before = draft.extend_calls
    sources = []
    for ev in generate_stream(target, h, prompt, max_new_tokens=40, k=8, stop_on_eos=False):
        ctx += ev.tokens
        sources.append(h.last_source)
        assert_model_cache_in_sync(h, draft, ctx)
    assert set(sources) == {"suffix"}
    assert draft.extend_calls == calls_before + 1  # only the prompt prefill
    # after the copy, novel text: the model drafts and first catches up in ONE batched call
    lag = len(ctx) - 1 - draft.n_cached
    assert lag > 20
    novel = [*ctx, 250, 251, 252]
    gen = torch.Generator().manual_seed(0)
    calls = draft.extend_calls
    d = h.propose(novel, 3, GREEDY, gen)
    assert h.last_source == "model" and len(d) == 3 and d.probs is not None
    assert draft.extend_calls == calls + 1 + 2  # catch-up, then one call per further draft
    assert draft.cached_tokens == [*novel, *d.tokens[:2]]


def test_rollback_prefill_and_reset_reach_both_drafters() -> None:
    draft, _ = mock_pair("close", vocab_size=12)
    h = hybrid(draft)
    gen = torch.Generator().manual_seed(0)
    ctx = [3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5]
    h.prefill(ctx[:-1])
    assert draft.cached_tokens == ctx[:-1] and h.suffix.index.tokens == ctx[:-1]
    h.model.propose(ctx, 4, GREEDY, gen)  # the model cache now holds drafts
    assert draft.n_cached == len(ctx) + 3
    h.rollback(ctx[:6])
    assert draft.cached_tokens == ctx[:6] and h.suffix.index.tokens == ctx[:6]
    h.reset()
    assert len(h.suffix.index) == 0
    assert h.model._fed == draft.cached_tokens  # ModelDrafter keeps the reusable prefix


def test_model_max_k_zero_means_suffix_only() -> None:
    draft, target = mock_pair("close", vocab_size=12, order=2)
    h = hybrid(draft, model_max_k=0)
    prompt = [3, 4, 5, 6, 7]
    res = generate(target, h, prompt, max_new_tokens=30, k=4, stop_on_eos=False)
    plain = generate(target, None, prompt, max_new_tokens=30, k=0, stop_on_eos=False)
    assert res.tokens == plain.tokens and h.model_rounds == 0


def test_a_draft_model_with_a_smaller_window_stops_drafting_instead_of_overflowing() -> None:
    target = MockLM(MockSpec(vocab_size=12, order=2))
    draft = MockLM(MockSpec(vocab_size=12, order=2, n_ctx=24))
    h = hybrid(draft)
    for prompt in ([3, 4, 5, 6, 7, 8], list(range(3, 12)) * 3):  # the second exceeds 24
        plain = generate(target, None, prompt, max_new_tokens=40, k=0, stop_on_eos=False)
        ctx = list(prompt)
        for ev in generate_stream(target, h, prompt, max_new_tokens=40, k=4, stop_on_eos=False):
            ctx += ev.tokens
            assert draft.n_cached <= 24
            assert_model_cache_in_sync(h, draft, ctx)
        assert ctx[len(prompt) :] == plain.tokens


N_SEQ = 20_000


@pytest.mark.slow
def test_sampled_sequences_follow_the_exact_target_distribution() -> None:
    """Rounds drafted by the suffix (one-hot q) and by the model (its q rows) mix within one
    generation; the output must still follow the target exactly."""
    target = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0))
    draft = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0, seed=7919))  # a far draft
    h = hybrid(draft, min_match=2)
    results: list[GenerationResult] = []
    used = {"suffix": 0, "model": 0}

    def record(res: GenerationResult) -> None:
        results.append(res)
        used["suffix"] += h.suffix_rounds  # counters restart with each generation
        used["model"] += h.model_rounds

    p = first_tokens_pvalue(
        target,
        h,
        [3, 4, 2, 3, 4, 0, 2],
        k=2,
        cfg=SamplingConfig(1.0),
        n_tokens=4,
        n_seq=N_SEQ,
        seed0=40_000,
        on_result=record,
    )
    rounds = [r for res in results for r in res.rounds if r.k > 0]
    assert sum(1 for r in rounds if r.n_accepted < r.k) > N_SEQ // 20
    assert p > 1e-3
    # both sources drafted often: more rounds each than 5 % of the sequences
    assert used["suffix"] > N_SEQ // 20 and used["model"] > N_SEQ // 20, used
