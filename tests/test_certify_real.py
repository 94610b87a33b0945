"""Level 3 on mock models loaded through load_model(ModelConfig) as if they were real.

Thresholds (fixed before running): family-wise alpha 0.01 per comparison (Holm over prompts
at 0.005 plus the combined chi-square at 0.005); near-tie threshold = 2 x the measured max
logit difference. Broken decoders are injected by replacing functions of specdec.rejection.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specdec.certify.common import torch_threads
from specdec.certify.faults import BatchVariantLM, injected_fault
from specdec.certify.mock_level import mock_prompts
from specdec.certify.real import Level3Config, Level3Result, run_level3, top2_gap
from specdec.models.base import CausalLM
from specdec.models.loader import ModelConfig, load_model


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Mock-sized tensors: one thread (a second one only adds synchronisation)."""
    with torch_threads(1):
        yield


PROMPTS = mock_prompts(5, 4, 8)
CFG = Level3Config(
    k=3,
    greedy_prompts=4,
    greedy_max_new_tokens=16,
    probe_prompts=2,
    sampled_prompts=3,
    seeds=300,
    m=2,
)


def _pair(draft: str = "mock:far:8") -> tuple[CausalLM, CausalLM]:
    return load_model(ModelConfig(draft)), load_model(ModelConfig("mock:target:8"))


def _run(draft: CausalLM, target: CausalLM, fault: str | None = None) -> Level3Result:
    with injected_fault(fault):
        return run_level3(draft, target, PROMPTS, CFG)


def test_correct_decoder_passes_every_part() -> None:
    """Batch-invariant mocks: probe 0, greedy 4/4 agree with plain and shape-matched, both
    sampled comparisons not rejected; the report states the detectable TV."""
    r = _run(*_pair())
    s = r.summary()
    assert r.status == "pass", s
    assert s["invariance_max_abs"] == 0.0
    assert s["greedy_agree_plain"] == s["greedy_agree_shape_matched"] == 4
    for key in ("spec_vs_shape_matched", "spec_vs_plain"):
        assert not s[key]["rejected"]
        assert s[key]["sequences_per_method"] == 900
        assert 0 < s[key]["min_detectable_tv_every_prompt"] < 0.3
    assert any("would detect a TV >=" in line for line in r.shown())


def test_residual_is_p_is_caught_by_the_sampled_test() -> None:
    """Greedy cannot see it; both sampled comparisons must reject and the level fails."""
    r = _run(*_pair(), fault="residual-is-p")
    s = r.summary()
    assert s["greedy_real_bugs"] == 0
    assert s["spec_vs_shape_matched"]["rejected"] and s["spec_vs_plain"]["rejected"]
    assert r.status == "fail"


def test_always_accept_is_caught_by_greedy_as_a_real_bug() -> None:
    """On a batch-invariant target the tie threshold is 0, so divergences are real bugs."""
    r = _run(*_pair(), fault="always-accept")
    assert r.status == "fail" and r.real_bugs
    for g in r.real_bugs:
        assert g.divergence is None or g.divergence.cause == "real bug"


def test_batch_variant_backend_is_a_caveat_not_a_bug() -> None:
    """A target whose logits move by up to 1.5 with the pass size: speculative vs plain
    differs (greedy near-ties, sampled rejection), speculative vs shape-matched does not;
    the verdict is 'warn' with the batch-shape explanation."""
    draft, target = _pair("mock:close:8")
    r = _run(draft, BatchVariantLM(target, 1.5))
    s = r.summary()
    assert 0 < s["invariance_max_abs"] <= 1.5 + 1e-6
    assert s["greedy_real_bugs"] == 0 and s["greedy_agree_shape_matched"] == 4
    assert s["greedy_near_ties"] == 4 - s["greedy_agree_plain"] > 0
    for g in r.near_ties:
        d = g.divergence
        assert d is not None and max(d.gap_batched, d.gap_single) <= d.threshold
        assert d.reproduced  # the replay recomputes exactly the two rows that were used
    assert s["spec_vs_plain"]["rejected"] and not s["spec_vs_shape_matched"]["rejected"]
    assert r.status == "warn"
    assert any("pass size" in n and "numerics may explain it" in n for n in r.notes())


def test_a_real_bug_on_a_batch_variant_backend_still_fails() -> None:
    """Batch variance must not hide a loss: always-accept on the batch-variant target fails."""
    draft, target = _pair()
    r = _run(draft, BatchVariantLM(target, 0.5), fault="always-accept")
    assert r.status == "fail"


def test_tiny_numerics_do_not_excuse_a_sampled_difference() -> None:
    """On a backend whose logits move by only 1e-5 with the pass size (like fp32), a sampled
    difference cannot be put down to numerics: residual-is-p fails the level."""
    draft, target = _pair()
    r = _run(draft, BatchVariantLM(target, 1e-5, row_dependent=True), fault="residual-is-p")
    assert 0 < r.summary()["invariance_max_abs"] <= 1.1e-5
    assert r.summary()["spec_vs_shape_matched"]["rejected"]
    assert r.status == "fail" and any("a decoder bug" in n for n in r.notes())


def test_top2_gap() -> None:
    """Largest minus second-largest logit, exactly."""
    import torch

    assert top2_gap(torch.tensor([1.0, 3.0, 2.5])) == 0.5
