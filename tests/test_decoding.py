"""The decoding loop on mock models: exactness, cache discipline, call counts, errors.

Thresholds (fixed before running): the sampled-distribution test uses 20,000 independent
sequences per configuration (one seed each) and requires the chi-square p-value of the
first-three-token distribution against the exactly computed one to exceed 1e-3.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from scipy import stats

from seq_dist import exact_first_tokens
from specdec.core.loop import generate, generate_stream
from specdec.core.sampling import SamplingConfig
from specdec.drafters import NgramDrafter
from specdec.errors import ConfigError, ContextOverflowError, EmptyPromptError
from specdec.models.mock import MockLM, MockSpec, mock_pair


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, vocab) for _ in range(rnd.randint(1, 12))] for _ in range(n)]


@pytest.mark.parametrize("closeness", ["identical", "close", "far"])
def test_greedy_speculative_is_bit_identical_to_plain(closeness: str) -> None:
    draft, target = mock_pair(closeness, vocab_size=24, order=2)
    seed = {"identical": 0, "close": 1, "far": 2}[closeness]  # hash() changes per process
    for prompt in prompts(12, 24, seed=seed):
        plain = generate(target, None, prompt, max_new_tokens=40, k=0, stop_on_eos=False)
        for k in range(1, 9):
            spec = generate(target, draft, prompt, max_new_tokens=40, k=k, stop_on_eos=False)
            assert spec.tokens == plain.tokens, (prompt, k)
            assert len(spec.tokens) == 40


def test_greedy_with_ngram_drafter_is_identical_to_plain() -> None:
    _, target = mock_pair("close", vocab_size=8, order=1)  # order 1 -> repetitive text
    for prompt in prompts(6, 8, seed=3):
        plain = generate(target, None, prompt, max_new_tokens=50, k=0, stop_on_eos=False)
        spec = generate(target, NgramDrafter(3), prompt, max_new_tokens=50, k=5, stop_on_eos=False)
        assert spec.tokens == plain.tokens
        assert spec.n_rounds < plain.n_rounds  # the lookup does find repeats here


def test_target_is_called_once_per_round_and_never_re_prefilled() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    prompt = [0, 5, 6, 7, 9]
    res = generate(target, draft, prompt, max_new_tokens=30, k=4, stop_on_eos=False)
    assert target.extend_calls == 1 + res.n_rounds  # one prefill + one pass per round
    # tokens the target processed: prompt (prefill + first round) + K + 1 per round at most
    assert target.tokens_processed == len(prompt) - 1 + sum(r.k + 1 for r in res.rounds)
    # the draft model also never reprocesses accepted text
    assert draft.tokens_processed <= len(prompt) + sum(r.k + 1 for r in res.rounds)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_caches_stay_consistent_with_the_context(k: int) -> None:
    draft, target = mock_pair("close", vocab_size=16)
    prompt = [0, 3, 4]
    ctx = list(prompt)
    for ev in generate_stream(
        target,
        draft,
        prompt,
        max_new_tokens=25,
        k=k,
        sampling=SamplingConfig(1.0),
        seed=k,
        stop_on_eos=False,
    ):
        ctx += ev.tokens
        # checked after every round, while the loop is suspended
        assert target.cached_tokens == ctx[:-1]
        assert draft.cached_tokens == ctx[: draft.n_cached]


def test_stream_yields_the_same_tokens_as_generate() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    cfg = SamplingConfig(temperature=0.8, top_k=10, top_p=0.9)
    streamed = [
        t
        for ev in generate_stream(
            target, draft, [0, 4], max_new_tokens=33, k=3, sampling=cfg, seed=5
        )
        for t in ev.tokens
    ]
    res = generate(target, draft, [0, 4], max_new_tokens=33, k=3, sampling=cfg, seed=5)
    assert streamed == res.tokens


def test_stats_are_coherent() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    res = generate(
        target,
        draft,
        [0, 4, 5],
        max_new_tokens=60,
        k=4,
        sampling=SamplingConfig(1.0),
        seed=1,
        stop_on_eos=False,
    )
    assert sum(r.n_emitted for r in res.rounds) == len(res.tokens) == 60
    assert all(0 <= r.n_accepted <= r.k <= 4 for r in res.rounds)
    acc = res.acceptance_by_position()
    assert len(acc) == 4 and all(0 <= a <= 1 for a in acc if not np.isnan(a))
    split = res.time_split()
    assert sum(split.values()) == pytest.approx(res.t_total)
    assert split["verify"] > 0 and split["draft"] > 0 and split["sampling"] > 0


def test_eos_stops_and_max_new_tokens_is_exact() -> None:
    target = MockLM(MockSpec(vocab_size=6, seed=1, eos_token_id=1))
    draft = MockLM(target.spec)
    for seed in range(30):
        res = generate(
            target, draft, [0, 2], max_new_tokens=20, k=3, sampling=SamplingConfig(1.0), seed=seed
        )
        if res.finish_reason == "eos":
            assert res.tokens[-1] == 1 and 1 not in res.tokens[:-1]
        else:
            assert len(res.tokens) == 20 and res.finish_reason == "length"


def test_context_window_is_respected() -> None:
    spec = MockSpec(vocab_size=8, n_ctx=20)
    target, draft = MockLM(spec), MockLM(spec)
    res = generate(target, draft, [0] * 10, max_new_tokens=100, k=6, stop_on_eos=False)
    assert res.finish_reason == "context" and len(res.tokens) == 10
    with pytest.raises(ContextOverflowError):
        generate(target, draft, [0] * 20, max_new_tokens=5, k=2)


def test_bad_requests_are_user_errors() -> None:
    draft, target = mock_pair("close")
    with pytest.raises(EmptyPromptError):
        generate(target, draft, [], max_new_tokens=5)
    with pytest.raises(ConfigError):
        generate(target, draft, [1], max_new_tokens=5, k=-1)
    with pytest.raises(ConfigError):
        generate(target, draft, [1], max_new_tokens=0)
    with pytest.raises(ValueError):
        generate(target, MockLM(MockSpec(vocab_size=16 + 129)), [1], max_new_tokens=5)
    with pytest.raises(ConfigError, match="separate"):
        generate(target, target, [1], max_new_tokens=5)


# ------------------------------------------------------------------- sampled distribution
# exact_first_tokens: the exactly computed law of the first tokens (tests/seq_dist.py)


def sequence_pvalue(
    target: MockLM, draft: MockLM | None, k: int, cfg: SamplingConfig, n_seq: int, seed0: int
) -> float:
    prompt = [0, 2]
    exact = exact_first_tokens(target, prompt, cfg, 3)
    keys = sorted(exact)
    counts = dict.fromkeys(keys, 0)
    for s in range(n_seq):  # one independent sequence per seed: the unit of the test
        res = generate(
            target,
            draft,
            prompt,
            max_new_tokens=3,
            k=k,
            sampling=cfg,
            seed=seed0 + s,
            stop_on_eos=False,
        )
        t = tuple(res.tokens)
        if t not in counts:
            return 0.0  # a sequence the target gives probability 0
        counts[t] += 1
    obs = np.array([counts[key] for key in keys], dtype=float)
    exp = np.array([exact[key] for key in keys])
    exp = exp / exp.sum() * n_seq  # the float32 rows sum to 1 only to ~1e-7
    # pool cells with expected count < 5 into one, as the chi-square approximation needs
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return float(stats.chisquare(obs, exp).pvalue)


N_SEQ = 20_000


@pytest.mark.slow
@pytest.mark.parametrize(
    "closeness,k,cfg",
    [
        ("close", 2, SamplingConfig(1.0)),
        ("far", 3, SamplingConfig(0.7, top_k=3)),
        ("close", 4, SamplingConfig(1.3, top_p=0.8)),
    ],
)
def test_sampled_sequences_follow_the_exact_target_distribution(closeness, k, cfg) -> None:  # type: ignore[no-untyped-def]
    draft, target = mock_pair(closeness, vocab_size=5, order=2, sharpness=1.0)
    assert sequence_pvalue(target, draft, k, cfg, N_SEQ, seed0=10_000) > 1e-3


@pytest.mark.slow
def test_sampled_sequence_test_catches_a_broken_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same test on a decoder whose residual is p: it must fail."""
    from specdec.core import rejection

    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p / p.sum())
    draft, target = mock_pair("far", vocab_size=5, order=2, sharpness=1.0)
    assert sequence_pvalue(target, draft, 2, SamplingConfig(1.0), N_SEQ, seed0=10_000) < 1e-3


def test_exact_helper_sums_to_one() -> None:
    _, target = mock_pair("close", vocab_size=5)
    ex = exact_first_tokens(target, [0], SamplingConfig(1.0, top_k=2), 3)
    assert sum(ex.values()) == pytest.approx(1.0)
    assert len(ex) <= 8
    assert all(len(k) == 3 for k in itertools.islice(ex, 5))


def test_a_repeated_prompt_reuses_the_cached_prefix() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    prompt = [0, 5, 6, 7, 9, 4]
    first = generate(target, draft, prompt, max_new_tokens=12, k=3, stop_on_eos=False)
    calls, processed = target.extend_calls, target.tokens_processed
    again = generate(target, draft, prompt, max_new_tokens=12, k=3, stop_on_eos=False)
    assert again.tokens == first.tokens
    assert target.extend_calls - calls == again.n_rounds  # no prefill call at all
    assert target.tokens_processed - processed == sum(r.k + 1 for r in again.rounds)
    # a different prompt sharing a prefix only processes the new part
    longer = [*prompt, 8, 8]
    calls = target.extend_calls
    res = generate(target, draft, longer, max_new_tokens=5, k=2, stop_on_eos=False)
    fresh_d, fresh_t = mock_pair("close", vocab_size=16)
    assert (
        res.tokens
        == generate(fresh_t, fresh_d, longer, max_new_tokens=5, k=2, stop_on_eos=False).tokens
    )
    no_reuse = generate(
        target, draft, longer, max_new_tokens=5, k=2, stop_on_eos=False, reuse_prefix=False
    )
    assert no_reuse.tokens == res.tokens
