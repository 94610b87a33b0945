"""Levels 1 and 2 of `specdec certify`: the correct decoder passes, deliberately broken ones
fail. Small seeded configurations (a few seconds each).

Thresholds (fixed before running): exact deviation <= 1e-6; Monte Carlo and sampled tests
Holm-corrected at family-wise alpha 0.01; greedy: zero mismatches. The broken walks are
"residual replaced by p" and "drafts always accepted", injected by replacing the functions in
specdec.core.rejection for the duration of one call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from specdec.certify.common import torch_threads
from specdec.certify.faults import injected_fault
from specdec.certify.mock_level import Level2Config, run_level2
from specdec.certify.progress import ProgressLog
from specdec.certify.synthetic import (
    KINDS,
    Level1Config,
    WalkCase,
    conditional_deviation,
    make_case,
    round_outcomes,
    run_level1,
)
from specdec.core.rejection import walk
from specdec.core.sampling import SamplingConfig, logits_to_probs, make_generator
from specdec.errors import ConfigError
from specdec.mock_runs import PREDICTIONS, SampledSetup, exact_window_distribution
from specdec.models.mock import MockLM


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Mock-sized tensors: one thread (a second one only adds synchronisation)."""
    with torch_threads(1):
        yield


L1 = Level1Config(ks=(0, 1, 2, 3), exact_vocab=4, mc_vocabs=(12,), mc_trials=1500)
L2 = Level2Config(
    greedy_closeness=("close", "far"),
    greedy_vocabs=(16,),
    greedy_prompts=2,
    greedy_ks=(0, 1, 3, 5),
    greedy_max_new_tokens=12,
    setups=(
        SampledSetup("close-K3", "close", 3),
        SampledSetup("far-K2", "far", 2),
        SampledSetup("ngram-K2", "close", 2, drafter="ngram"),
        SampledSetup("planned-K6", "close", 6, drafter="planned"),
        SampledSetup("close-K3-sparse", "close", 3, temperature=0.8, top_k=5, top_p=0.9),
        SampledSetup("padded-close-K3", "close", 3, draft_vocab_delta=-2),
    ),
    windows=((1, 2),),
    sequences=600,
)


# ---------------------------------------------------------------- Level 1
def test_case_kinds_have_the_promised_shapes() -> None:
    """Every kind gives valid rows; sparse kinds have zeros; one_hot_q has no q."""
    g = make_generator(0)
    for kind in KINDS:
        case = make_case(g, 10, 3, kind, kind)
        assert case.p.shape == (4, 10)
        assert torch.allclose(case.p.sum(-1), torch.ones(4), atol=1e-5)
        if kind == "one_hot_q":
            assert case.q is None
        else:
            assert case.q is not None and case.q.shape == (3, 10)
        if kind.startswith("sparse_p") or kind in ("disjoint", "one_hot_p", "one_hot_both"):
            assert bool((case.p == 0).any())


def test_conditional_deviation_on_a_hand_made_round() -> None:
    """p0 = (0.6, 0.4), q = (0.9, 0.1), draft 0 accepted w.p. 2/3, residual (0, 1): the exact
    round distribution deviates < 1e-6 (float32 inputs); a wrong one (always emit p0's
    argmax) is off by exactly 0.4."""
    p = torch.tensor([[0.6, 0.4], [0.2, 0.8]])
    q = torch.tensor([[0.9, 0.1]])
    case = WalkCase("hand", "dense", 1, 2, p, q)
    dev, wtv = conditional_deviation(round_outcomes(walk, case), p.double().numpy())
    assert dev < 1e-6 and wtv < 1e-6
    wrong = {(0,): 1.0}
    dev, wtv = conditional_deviation(wrong, p.double().numpy())
    assert dev == pytest.approx(0.4) and wtv == pytest.approx(0.4)


def test_level1_passes_for_the_real_walk() -> None:
    """All exact cases within 1e-6 and no Monte Carlo rejection at family-wise 0.01."""
    r = run_level1(L1)
    s = r.summary()
    assert r.status == "pass", s
    assert s["exact_cases"] == len(KINDS) * 4 and s["exact_max_deviation"] < 1e-6
    assert s["mc_tests"] > 40 and s["mc_rejected"] == 0
    # every test with degrees of freedom states its power (one-hot rows have none: any
    # token outside the row's support is an impossible outcome, p = 0)
    assert all(np.isfinite(t.min_detectable_tv) for t in r.tests if t.dof > 0)
    assert "max deviation" in r.shown()[0]


@pytest.mark.parametrize("fault", ["residual-is-p", "always-accept"])
def test_level1_catches_a_broken_walk(fault: str) -> None:
    """The broken walk must fail both parts: exact deviation > 1e-3 on some case, and at
    least one Holm-rejected Monte Carlo test."""
    with injected_fault(fault):
        r = run_level1(L1)
    s = r.summary()
    assert r.status == "fail"
    assert s["exact_max_deviation"] > 1e-3 and s["exact_failed"] > 0
    assert s["mc_rejected"] > 0


def test_injected_fault_is_restored() -> None:
    """The patched function is restored even when the block raises; unknown names are
    a ConfigError."""
    from specdec.core import rejection

    before = rejection.residual_distribution
    with pytest.raises(RuntimeError), injected_fault("residual-is-p"):
        assert rejection.residual_distribution is not before
        raise RuntimeError("boom")
    assert rejection.residual_distribution is before
    with pytest.raises(ConfigError), injected_fault("no-such-fault"):
        pass


# ---------------------------------------------------------------- Level 2
def test_exact_window_distribution_matches_brute_force() -> None:
    """The DP over mock states equals the product of next-token probabilities summed over
    every path (V = 4, positions 2..3, T = 0.9 with top-k 3): max difference < 1e-12."""
    model = MockLM(vocab_size=4, order=2)
    cfg = SamplingConfig(temperature=0.9, top_k=3)
    prompt = [0, 2]
    dp = exact_window_distribution(model, prompt, 2, 2, cfg)
    brute = np.zeros(16)
    for y1 in range(4):
        for y2 in range(4):
            for y3 in range(4):
                ctx, prob = list(prompt), 1.0
                for y in (y1, y2, y3):
                    prob *= float(logits_to_probs(model.logits_for_context(ctx), cfg)[y])
                    ctx.append(y)
                brute[y2 + 4 * y3] += prob
    assert np.abs(dp - brute).max() < 1e-12 and dp.sum() == pytest.approx(1.0)


def test_the_reference_greedy_path_follows_the_argmax() -> None:
    """Each reference token (``MockLM.greedy_continuation``) is the exact argmax of
    logits_for_context (equality)."""
    model = MockLM(vocab_size=16)
    out = model.greedy_continuation([0, 5], 6)
    ctx = [0, 5]
    for t in out:
        assert t == int(torch.argmax(model.logits_for_context(ctx)))
        ctx.append(t)


def test_level2_passes_for_the_real_decoder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Zero greedy mismatches; no sampled test rejected at family-wise 0.01. Resuming from
    the progress log reproduces the same result without recomputation."""
    log = ProgressLog(tmp_path / "p.jsonl", {"x": 1}, resume=False)
    r = run_level2(L2, log=log)
    s = r.summary()
    assert r.status == "pass", s
    assert s["greedy_units"] == 2 * 2 * 7 * 4 and s["greedy_mismatches"] == 0  # 7 drafters
    assert s["sampled_tests"] == 6 and s["sampled_rejected"] == 0  # incl. padded, planned
    resumed = ProgressLog(tmp_path / "p.jsonl", {"x": 1}, resume=True)
    with injected_fault("always-accept"):  # would fail if anything were recomputed
        r2 = run_level2(L2, log=resumed)
    assert r2.summary()["sampled_min_p"] == s["sampled_min_p"] and r2.status == "pass"


@dataclasses.dataclass
class _Unit:
    name: str
    value: float


def test_a_progress_unit_is_computed_once_and_read_back_on_resume(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``ProgressLog.unit`` / ``units`` compute a unit that is not done, store it, and on a
    resumed log return what was stored without computing again; a stored value that does not
    fit the unit's type is one ConfigError naming the unit (a fixture that must fail)."""
    calls: list[str] = []

    def make(name: str) -> _Unit:
        calls.append(name)
        return _Unit(name, 0.5)

    log = ProgressLog(tmp_path / "p.jsonl", {"x": 1}, resume=False)
    assert log.unit("a", lambda: make("a"), _Unit) == _Unit("a", 0.5)
    assert log.units("b", lambda: [make("b"), make("c")], _Unit) == [
        _Unit("b", 0.5),
        _Unit("c", 0.5),
    ]
    assert calls == ["a", "b", "c"]
    resumed = ProgressLog(tmp_path / "p.jsonl", {"x": 1}, resume=True)
    assert resumed.unit("a", lambda: make("again"), _Unit) == _Unit("a", 0.5)
    assert resumed.units("b", lambda: [make("again")], _Unit) == [_Unit("b", 0.5), _Unit("c", 0.5)]
    assert calls == ["a", "b", "c"]  # nothing was recomputed
    assert resumed.unit("d", lambda: make("d"), _Unit) == _Unit("d", 0.5)
    assert calls[-1] == "d"  # a unit not done is computed on a resumed log too
    resumed.put("bad", {"nope": 1})
    with pytest.raises(ConfigError, match="'bad'"):
        resumed.unit("bad", lambda: make("bad"), _Unit)


L2_PREDICTIONS = dataclasses.replace(
    L2,
    greedy_closeness=("close",),
    greedy_ks=(4, 8),
    greedy_drafters=PREDICTIONS,
    setups=tuple(
        SampledSetup(f"{kind}-K6", "close", 6, drafter=kind)
        for kind in ("prediction", "prediction-wrong", "prediction-shifted")
    ),
)


def test_level2_covers_predictions_right_wrong_shifted_and_foreign() -> None:
    """A prediction drafter (a deterministic draft: kept with the target's probability of
    the token, else resampled without it) keeps greedy output exact and sampled output the
    target's, whether the prediction is right, wrong at every position, shifted by one
    token or of another language."""
    r = run_level2(L2_PREDICTIONS)
    s = r.summary()
    assert r.status == "pass", s
    assert s["greedy_units"] == 2 * 4 * 2 and s["greedy_mismatches"] == 0
    assert s["sampled_tests"] == 3 and s["sampled_rejected"] == 0


def test_level2_catches_a_wrong_residual_under_predictions() -> None:
    """The fixture that must fail: after rejecting a predicted token, resampling from p
    (which can give that token again) instead of p without it."""
    with injected_fault("residual-is-p"):
        r = run_level2(L2_PREDICTIONS)
    assert r.status == "fail" and r.summary()["sampled_rejected"] >= 1


def test_level2_catches_residual_is_p() -> None:
    """Greedy cannot see this bug (the residual of one-hot rows is the target row); the
    sampled goodness-of-fit tests must reject."""
    with injected_fault("residual-is-p"):
        r = run_level2(L2)
    s = r.summary()
    assert r.status == "fail" and s["greedy_mismatches"] == 0 and s["sampled_rejected"] >= 2


def test_level2_catches_always_accept() -> None:
    """Accepting every draft breaks the sampled tests. (Greedy rounds take the argmax matches
    directly, ``verifiers.greedy_verify``, so a fault in the walk cannot reach them.)"""
    with injected_fault("always-accept"):
        r = run_level2(L2)
    s = r.summary()
    assert r.status == "fail" and s["sampled_rejected"] >= 2
