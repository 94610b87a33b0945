from __future__ import annotations

import random

import pytest
import torch

from specdec.models.mock import MockLM, MockSpec, mock_pair


def test_logits_are_a_pure_function_of_the_context() -> None:
    m = MockLM(MockSpec(vocab_size=9, order=3))
    rows = m.extend([1, 4, 2, 7])
    for i in range(4):
        assert torch.equal(rows[i], m.logits_for_context([1, 4, 2, 7][: i + 1]))


@pytest.mark.parametrize("seed", range(5))
def test_cache_consistency_after_random_extend_truncate(seed: int) -> None:
    """After any sequence of extend/truncate, logits equal a fresh model's on that prefix."""
    rnd = random.Random(seed)
    spec = MockSpec(vocab_size=11, order=3, seed=seed)
    m = MockLM(spec)
    for _ in range(60):
        if m.n_cached and rnd.random() < 0.4:
            m.truncate(rnd.randrange(0, m.n_cached + 1))
        else:
            toks = [rnd.randrange(11) for _ in range(rnd.randint(1, 5))]
            got = m.extend(toks)
            fresh = MockLM(spec)
            want = fresh.extend(m.cached_tokens)[-len(toks) :]
            assert torch.equal(got, want)


def test_truncate_and_extend_bounds_are_checked() -> None:
    m = MockLM(MockSpec(vocab_size=5, n_ctx=4))
    m.extend([1, 2])
    with pytest.raises(ValueError):
        m.truncate(3)
    with pytest.raises(ValueError):
        m.extend([1, 2, 3])  # 2 + 3 > n_ctx
    with pytest.raises(ValueError):
        m.extend([9])  # outside the vocabulary
    with pytest.raises(ValueError):
        m.extend([])


def test_pair_closeness() -> None:
    ctx = [0, 3, 5]
    for closeness, lo, hi in [("identical", 0.0, 0.0), ("close", 0.01, 3.0), ("far", 1.0, 99)]:
        d, t = mock_pair(closeness, vocab_size=32)
        diff = (d.logits_for_context(ctx) - t.logits_for_context(ctx)).abs().max().item()
        assert lo <= diff <= hi, (closeness, diff)
