"""The batch-invariance probe, the prefix-reuse wrapper and the shape-matched baseline, on
mock models (offline, seeded, a few seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from specdec.certify.common import torch_threads
from specdec.certify.faults import BatchVariantLM
from specdec.certify.invariance import batch_invariance
from specdec.certify.prefix_cache import PrefixReuseLM
from specdec.certify.shape_matched import shape_matched_generate
from specdec.core.loop import generate
from specdec.core.sampling import SamplingConfig
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import ConfigError
from specdec.mock_runs import exact_window_distribution
from specdec.models.mock import MockLM, mock_pair
from specdec.stats.chisquare import chisquare_gof


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Mock-sized tensors: one thread (a second one only adds synchronisation)."""
    with torch_threads(1):
        yield


PROMPTS = [[0, 5, 6, 7, 8], [0, 9], [0, 3, 3, 4, 5, 6, 7, 8, 9, 10]]


def test_probe_reports_exact_zero_for_a_batch_invariant_mock() -> None:
    """MockLM computes every row independently: every difference must be exactly 0.0."""
    r = batch_invariance(MockLM(vocab_size=32), PROMPTS, ns=(2, 5, 9), label="mock")
    assert r.max_abs == 0.0 and r.argmax_flips == 0 and r.rollback_max_abs == 0.0
    assert r.batch_invariant and r.tie_threshold == 0.0
    assert [row.n for row in r.per_n] == [2, 5, 9]
    assert [row.rows for row in r.per_n] == [6, 15, 27]
    assert all(row.tv_max == 0.0 and row.row_offset_max_abs == 0.0 for row in r.per_n)
    d = r.to_dict()
    assert d["max_abs"] == 0.0 and "| 9 | 27 |" in r.to_markdown()


def test_probe_detects_a_batch_size_dependent_wrapper() -> None:
    """A wrapper adding up to +-0.3 to passes of n > 1 tokens: the probe must see a max
    difference in (0.2, 0.3], a positive TV, no row-index effect; with row dependence on,
    a positive row-index difference."""
    model = BatchVariantLM(MockLM(vocab_size=32), scale=0.3)
    r = batch_invariance(model, PROMPTS, ns=(2, 5))
    assert 0.2 < r.max_abs <= 0.3 + 1e-6
    assert all(row.tv_max > 0 for row in r.per_n)
    assert r.row_offset_max_abs == 0.0 and r.rollback_max_abs == 0.0
    assert r.tie_threshold == pytest.approx(2 * r.max_abs)
    rd = batch_invariance(
        BatchVariantLM(MockLM(vocab_size=32), scale=0.3, row_dependent=True), PROMPTS, ns=(5,)
    )
    assert rd.row_offset_max_abs > 0.1


def test_probe_rejects_bad_sizes() -> None:
    """n < 2, or a probe that would overflow the context window: ConfigError."""
    with pytest.raises(ConfigError):
        batch_invariance(MockLM(), PROMPTS, ns=(1, 2))
    with pytest.raises(ConfigError):
        batch_invariance(MockLM(vocab_size=8, n_ctx=8), [[0, 1, 2, 3, 4]], ns=(5,))


def test_prefix_reuse_is_exact_and_reuses() -> None:
    """Through the wrapper, generate gives the same tokens as on the bare models for 20
    seeds, while the prompt prefill is computed once."""
    draft, target = mock_pair("close", vocab_size=16)
    d2, t2 = mock_pair("close", vocab_size=16)
    wd, wt = PrefixReuseLM(d2), PrefixReuseLM(t2)
    cfg = SamplingConfig(temperature=1.0)
    prompt = [0, 4, 5, 6, 7, 8, 9]
    for seed in range(20):
        a = generate(target, draft, prompt, max_new_tokens=8, k=3, sampling=cfg, seed=seed)
        b = generate(wt, wd, prompt, max_new_tokens=8, k=3, sampling=cfg, seed=seed)
        assert a.tokens == b.tokens
    assert wt.reused == 19 and wd.reused >= 19
    # a different prompt is computed afresh, and the old prefix is not served for it
    other = [0, 4, 5, 6, 7, 8, 10]
    a = generate(target, None, other, max_new_tokens=5, k=0, sampling=cfg, seed=1)
    b = generate(wt, None, other, max_new_tokens=5, k=0, sampling=cfg, seed=1)
    assert a.tokens == b.tokens
    # the prefix was pinned from a last_only prefill: a request for every row recomputes
    wt.truncate(0)
    full = wt.extend(other[:-1])
    expected = torch.stack([t2.logits_for_context(other[: i + 1]) for i in range(len(other) - 1)])
    assert torch.equal(full, expected)


def test_shape_matched_greedy_equals_speculative_greedy() -> None:
    """Greedy shape-matched decoding is the speculative loop's twin: identical tokens for
    every prompt, K and drafter (model and n-gram), also on a batch-variant target."""
    for closeness in ("close", "far"):
        draft, target = mock_pair(closeness, vocab_size=16)
        for wrapped in (target, BatchVariantLM(target, 0.8)):
            for prompt in PROMPTS:
                for k in (1, 3, 5):
                    for drafter in (draft, NgramDrafter()):
                        spec = generate(
                            wrapped,
                            drafter,
                            prompt,
                            max_new_tokens=20,
                            k=k,
                            sampling=SamplingConfig(),
                        ).tokens
                        shaped, _ = shape_matched_generate(
                            wrapped,
                            drafter,
                            prompt,
                            max_new_tokens=20,
                            k=k,
                            sampling=SamplingConfig(),
                            seed=0,
                        )
                        assert spec == shaped, (closeness, prompt, k)


def test_shape_matched_sampling_has_the_target_distribution() -> None:
    """2,000 independent shape-matched sequences: the first two tokens fit the exactly
    computed distribution (chi-square p > 0.001), and the batches really have K + 1 rows."""
    draft, target = mock_pair("close", vocab_size=8)
    cfg = SamplingConfig(temperature=1.0)
    prompt = [0, 3, 4]
    counts = np.zeros(64)
    sizes = set()
    for seed in range(2000):
        toks, rounds = shape_matched_generate(
            target,
            draft,
            prompt,
            max_new_tokens=6,
            k=4,
            sampling=cfg,
            seed=seed,
            stop_on_eos=False,
        )
        counts[toks[0] + 8 * toks[1]] += 1
        sizes.add(rounds[0].k)
    exact = exact_window_distribution(target, prompt, 1, 2, cfg)
    assert chisquare_gof(counts, exact).pvalue > 0.001
    assert sizes == {4}
