"""Earlier prompts' caches kept as snapshots (models.prompt_cache): a request that shares a
long prefix with any earlier one, not only the last, skips that prefix's prefill; bounded in
bytes; the output is what a fresh prefill gives."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from specdec.core.loop import generate
from specdec.models.mock import MockLM, MockSpec
from specdec.models.prompt_cache import PromptCache, reuse_prefix
from tiny_models import llama_cpp_or_skip, store_model_or_skip


def test_the_pool_keeps_the_longest_match_and_stays_under_its_bound() -> None:
    pool = PromptCache(max_bytes=100, min_tokens=4)
    a = list(range(10))
    pool.keep(a, b"x" * 40)
    pool.keep([9] * 10, b"y" * 40)
    assert pool.best([*a[:8], 99], have=0) is not None
    snap, n = pool.best([*a[:8], 99], have=0) or (None, 0)
    assert snap is not None and snap.tokens == tuple(a) and n == 8
    assert pool.best([*a[:8], 99], have=5) is None  # saves fewer than min_tokens more
    pool.keep([1] * 10, b"z" * 40)  # 120 bytes > 100: the least recently used goes
    assert pool.size <= 100 and len(pool.snapshots) == 2
    assert [s.tokens[0] for s in pool.snapshots] == [0, 1]  # [9]*10 was used least recently
    pool.keep([*a, 10, 11], b"w" * 50)  # covers a: a is dropped
    assert all(s.tokens != tuple(a) for s in pool.snapshots)
    pool.keep([2] * 10, b"v" * 101)  # larger than the bound: not kept
    assert all(s.tokens[0] != 2 for s in pool.snapshots)
    with pytest.raises(ValueError):
        PromptCache(max_bytes=-1)


def test_content_about_to_be_lost_is_snapshotted_and_brought_back() -> None:
    pool = PromptCache(max_bytes=1000, min_tokens=4)
    taken: list[tuple[int, ...]] = []
    state = {"cache": list(range(20))}

    def take() -> bytes:
        taken.append(tuple(state["cache"]))
        return json.dumps(state["cache"]).encode()

    def put(tokens: tuple[int, ...], blob: bytes) -> bool:
        state["cache"] = json.loads(blob)
        assert tuple(state["cache"]) == tokens
        return True

    other = [50, 51, 52, 53, 54, 55]
    assert reuse_prefix(pool, state["cache"], other, take, put) == 0
    assert taken == [tuple(range(20))]  # 20 tokens would be lost: snapshotted
    state["cache"] = list(other)
    back = [*range(16), 77]
    assert reuse_prefix(pool, state["cache"], back, take, put) == 16
    assert state["cache"] == list(range(20))  # the snapshot brought in; the caller truncates
    assert reuse_prefix(None, [1, 2, 3], [1, 2, 9], take, put) == 2  # no pool: what it holds


class SnapshotMock(MockLM):
    """A mock backend with the snapshot capability, as the llama.cpp backend has it."""

    def __init__(self, spec: MockSpec, pool: PromptCache) -> None:
        super().__init__(spec)
        self.prompt_cache = pool

    def _state(self) -> bytes:
        return json.dumps([self._tokens, [list(k) for k in self._keys]]).encode()

    def _restore(self, tokens: tuple[int, ...], state: bytes) -> bool:
        toks, keys = json.loads(state)
        self._tokens, self._keys = list(toks), [tuple(k) for k in keys]
        return True

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        return reuse_prefix(self.prompt_cache, self._tokens, tokens, self._state, self._restore)


def test_an_edit_after_another_request_skips_its_prefill() -> None:
    spec = MockSpec(vocab_size=32, seed=3, n_ctx=4096)
    file = [(7 * i) % 29 + 3 for i in range(300)]  # the file, then the instruction
    first, second = [*file, 1, 2], [*file, 1, 5]
    unrelated = [(5 * i) % 31 for i in range(200)]

    def run(model: MockLM, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
        out = []
        for p in prompts:
            before = model.tokens_processed
            res = generate(model, None, p, max_new_tokens=12, k=0, stop_on_eos=False)
            out.append((res.tokens, model.tokens_processed - before))
        return out

    pool = PromptCache(max_bytes=1 << 20)
    cached = run(SnapshotMock(spec, pool), [first, unrelated, second])
    fresh = [run(MockLM(spec), [p])[0] for p in (first, unrelated, second)]
    assert [t for t, _ in cached] == [t for t, _ in fresh]  # the same output
    assert pool.hits == 1
    # the second edit processed its last prompt tokens and output only, not the file again
    assert cached[2][1] < 20 and fresh[2][1] > 300
    # without snapshots, the request in between costs the whole file again
    single = run(MockLM(spec), [first, unrelated, second])
    assert single[2][1] > 300


def test_scoring_a_prompt_keeps_the_cache_it_replaces_as_a_snapshot() -> None:
    """A scoring request (prompt_logprobs: every row from an empty cache) between two edits
    of a file: the file's cache is snapshotted before the scoring drops it, so the second
    edit still skips the file's prefill."""
    spec = MockSpec(vocab_size=32, seed=3, n_ctx=4096)
    file = [(7 * i) % 29 + 3 for i in range(300)]
    pool = PromptCache(max_bytes=1 << 20)
    model = SnapshotMock(spec, pool)
    generate(model, None, [*file, 1, 2], max_new_tokens=4, k=0, stop_on_eos=False)
    scored = generate(model, None, [9, 8, 7, 6, 5], max_new_tokens=0, prompt_logprobs=2)
    assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == 5
    before = model.tokens_processed
    generate(model, None, [*file, 1, 5], max_new_tokens=4, k=0, stop_on_eos=False)
    assert pool.hits == 1 and model.tokens_processed - before < 20


@pytest.mark.llamacpp
@pytest.mark.real_model
def test_llama_cpp_snapshots_give_a_fresh_prefills_output() -> None:
    llama_cpp_or_skip()
    path = store_model_or_skip("smollm2-135m-instruct-q4_1")
    from specdec.models.llamacpp import LlamaCppLM

    text = "def add(a, b):\n    return a + b\n\n" * 12
    lm = LlamaCppLM(path, n_ctx=1024, n_threads=2, check_kernels=False)
    file = lm.tokenizer.encode(text, add_special_tokens=False)
    first = [*file, *lm.tokenizer.encode("# test add", add_special_tokens=False)]
    second = [*file, *lm.tokenizer.encode("# doc add", add_special_tokens=False)]
    other = lm.tokenizer.encode("Once upon a time " * 20, add_special_tokens=False)
    outs = [generate(lm, None, p, max_new_tokens=16, k=0).tokens for p in (first, other, second)]
    assert lm.prompt_cache is not None and lm.prompt_cache.hits == 1
    fresh = LlamaCppLM(path, n_ctx=1024, n_threads=2, check_kernels=False, prompt_cache_bytes=0)
    assert fresh.prompt_cache is None
    assert generate(fresh, None, second, max_new_tokens=16, k=0).tokens == outs[2]
    assert lm.cache_pos_max() == lm.n_cached - 1  # nothing stale left in llama.cpp's cache
