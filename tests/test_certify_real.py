"""Level 3 on mock models loaded through load_model(ModelConfig) as if they were real, with
the permanent fault fixtures of specdec.certify.faults.

Thresholds (fixed before running): per-token test at family-wise alpha 0.01 per reference
(Anderson-Darling and binned chi-square at 0.005 each); near-tie threshold = 2 x the probe's
max logit difference; per-token TV vs plain decoding: upper 95 % bound < 0.02. Every verdict
below has a fixture that must produce the opposite one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdec.certify.common import torch_threads
from specdec.certify.faults import (
    BatchVariantLM,
    PositionalLM,
    StaleRollbackLM,
    WrongRowsLM,
    fault_models,
    injected_fault,
)
from specdec.certify.mock_level import mock_prompts
from specdec.certify.pertoken import RecordingLM, recorded_rows
from specdec.certify.real import (
    Level3Config,
    Level3Result,
    classify_divergence,
    run_level3,
    top2_gap,
)
from specdec.core.drafter import Drafter
from specdec.core.loop import generate
from specdec.core.model import CausalLM
from specdec.core.rows import replay_rows, rows_both_ways
from specdec.core.sampling import SamplingConfig, make_generator
from specdec.models.loader import ModelConfig, load_model


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Mock-sized tensors: one thread (a second one only adds synchronisation)."""
    with torch_threads(1):
        yield


PROMPTS = mock_prompts(make_generator(7), 6, 32)  # 4 greedy + 2 probe, disjoint
CFG = Level3Config(
    k=3,
    greedy_prompts=4,
    greedy_max_new_tokens=16,
    probe_prompts=2,
    sampled_prompts=3,
    seeds=10,
    sample_tokens=32,
    power_trials=100,
)


def _pair(draft: str = "mock:far:32") -> tuple[CausalLM, CausalLM]:
    """V = 32 mocks (EOS ends sequences less often than at V = 8)."""
    return load_model(ModelConfig(draft)), load_model(ModelConfig("mock:target:32"))


def _run(
    draft: CausalLM | Drafter, target: CausalLM, fault: str | None = None, **kw: object
) -> Level3Result:
    with injected_fault(fault):
        return run_level3(draft, target, PROMPTS, CFG, **kw)  # type: ignore[arg-type]


def test_correct_decoder_passes_every_part() -> None:
    """Batch-invariant mocks: probe 0, rollback exact, greedy 4/4 agree with plain and
    shape-matched, the per-token test rejects neither reference, the measured TV vs plain is
    exactly 0, and the report states the detectable per-token TV."""
    r = _run(*_pair())
    s = r.summary()
    assert r.status == "pass", s
    assert s["invariance_max_abs"] == 0.0 and s["rollback_max_abs"] == 0.0
    assert s["greedy_agree_plain"] == s["greedy_agree_shape_matched"] == 4
    pt = s["pertoken"]
    assert not pt["shape_matched_rejected"] and not pt["plain_rejected"]
    assert pt["sequences"] == 30 and 30 <= pt["tokens"] <= 960  # EOS ends many early
    assert pt["tv_plain"] == 0.0 and pt["tv_plain_high"] == 0.0
    assert 0 < pt["min_detectable_tv_shape_matched"] < 0.15
    assert r.probe_overlaps_greedy is False  # 6 prompts: probe on the last 2, greedy first 4
    assert any("detected with 80 % probability" in line for line in r.shown())


@pytest.mark.parametrize(
    "fault", ["residual-is-p", "always-accept", "residual-is-p-after-first-round", "wrong-q"]
)
def test_walk_faults_fail_the_per_token_test(fault: str) -> None:
    """Decoder faults: the per-token test against the shape-matched replay rejects (no
    backend numerics are involved: the reference has the very pass shapes of the run)."""
    draft, target = fault_models(fault, *_pair())
    r = _run(draft, target, fault)
    assert r.pertoken is not None and r.pertoken.decoder_rejected, r.summary()
    assert r.status == "fail"
    assert any("A decoder bug" in n for n in r.notes())


def test_residual_after_first_round_is_invisible_in_the_first_round() -> None:
    """The fault only bites from the second round on: the first tokens of a sequence (its
    first round) has the right distribution: a test of first tokens only cannot see the fault,
    which the per-token test above catches in later rounds."""
    draft, target = fault_models("residual-is-p-after-first-round", *_pair())
    cfg = Level3Config(k=3, probe_prompts=0, sampled_prompts=3, seeds=30, sample_tokens=1)
    with injected_fault("residual-is-p-after-first-round"):
        r = run_level3(draft, target, PROMPTS, cfg, parts=("pertoken",))
    assert r.pertoken is not None and not r.pertoken.decoder_rejected


def test_level3_with_predictions_passes_and_a_wrong_walk_fails() -> None:
    """Predictions in Level 3 (``--prompts code_predict``): each prompt's prediction drafted
    in front of the draft, right (the target's greedy output) for one prompt, wrong at every
    position for another, none for the rest. A correct decoder passes; the always-accept
    walk, which keeps every predicted token, fails."""
    draft, target = _pair()
    right = generate(target, None, PROMPTS[0], max_new_tokens=16, k=0).tokens
    wrong = [(t + 1) % target.vocab_size for t in right]
    predictions = [right, wrong] + [None] * (len(PROMPTS) - 2)
    r = _run(draft, target, predictions=predictions)
    assert r.status == "pass", r.summary()
    assert _run(draft, target, "always-accept", predictions=predictions).status == "fail"


def test_always_accept_fails_level3() -> None:
    """A walk that accepts every draft fails the sampled per-token test. (Greedy rounds take
    the argmax matches directly, ``verifiers.greedy_verify``, so the fault cannot reach the
    greedy comparison: its divergences would be real bugs, but there are none to see.)"""
    r = _run(*_pair(), fault="always-accept")
    assert r.status == "fail" and not r.real_bugs


def test_wrong_rows_fail_vs_plain_as_batch_shape_numerics() -> None:
    """Multi-token passes return the previous position's row. The decoder uses its rows
    correctly (the shape-matched test passes), greedy divergences look like near-ties against
    the probe's huge difference, but the measured per-token TV vs plain decoding is far above
    0.02: FAIL with 'batch-shape numerics' as the cause (it was PASS WITH CAVEATS before)."""
    draft, target = _pair("mock:close:32")
    r = _run(draft, WrongRowsLM(target))
    pt = r.pertoken
    assert pt is not None and not pt.decoder_rejected
    assert pt.plain_effect_too_large and pt.tv_plain_low > 0.02
    assert r.status == "fail"
    assert any("batch-shape numerics" in n and "FAILS" in n for n in r.notes())


def test_large_batch_variance_is_a_failure_not_a_caveat() -> None:
    """Logits that move by up to 1.5 with the pass size (the old 'caveat' fixture) change
    outputs by far more than 0.02 per token: FAIL vs plain, not a caveat."""
    draft, target = _pair("mock:close:32")
    r = _run(draft, BatchVariantLM(target, 1.5))
    assert r.pertoken is not None and not r.pertoken.decoder_rejected
    assert r.pertoken.plain_effect_too_large and r.status == "fail"


def test_noisy_numerics_are_a_caveat_not_a_failure() -> None:
    """Correct but noisy backend (deterministic logit noise of 0.05 that depends on the pass
    size, the row and the position): the shape-matched test passes, outputs differ from plain
    decoding measurably but below the threshold: warn or pass, never fail."""
    draft, target = fault_models("noisy-numerics", *_pair("mock:close:32"))
    r = _run(draft, target)
    pt = r.pertoken
    assert pt is not None and not pt.decoder_rejected
    assert pt.tv_plain > 0 and pt.tv_plain_high < 0.02
    assert r.status in ("warn", "pass") and r.real_bugs == []


@pytest.mark.parametrize("wrapper", ["stale-rollback", "position-after-truncate"])
def test_rollback_errors_fail_the_level(wrapper: str) -> None:
    """A cache that is wrong after truncate(): the probe's rollback error is > 0 and that
    alone FAILS Level 3 (the probe alone used to pass)."""
    draft, target = fault_models(wrapper, *_pair("mock:close:32"))
    r = _run(draft, target, parts=("probe",))
    assert r.probe is not None and r.probe.rollback_max_abs > 0
    assert r.status == "fail" and any("Rollback is not exact" in n for n in r.notes())
    full = _run(draft, target)
    assert full.status == "fail"


def test_correct_position_dependent_backend_passes() -> None:
    """The control for the two rollback faults: logits that depend on the absolute position,
    kept right across truncate(), pass every part."""
    draft, target = _pair("mock:close:32")
    r = _run(draft, PositionalLM(target))
    assert r.status == "pass", r.summary()
    stale = StaleRollbackLM(target)
    assert isinstance(stale, CausalLM)


def test_tie_threshold_is_not_taken_from_the_divergence() -> None:
    """A target whose multi-token rows are wrong diverges from plain decoding under greedy.
    With the tie threshold from an independent probe (0 here: a batch-invariant probe), the
    divergence is a real bug even though the logit difference at that very position is large
    (the old rule, 2 x max(probe, diff here), called it a near-tie)."""
    draft, base = _pair("mock:close:32")
    target = WrongRowsLM(base)
    greedy = SamplingConfig()
    for ids in PROMPTS:
        spec = generate(target, draft, ids, max_new_tokens=16, k=3, sampling=greedy)
        plain = generate(target, None, ids, max_new_tokens=16, k=0, sampling=greedy)
        i = next(
            (j for j, (a, b) in enumerate(zip(spec.tokens, plain.tokens, strict=False)) if a != b),
            None,
        )
        if i is None:
            continue
        rows = rows_both_ways(target, ids, spec.tokens, spec.rounds, i)
        d = classify_divergence(*rows, spec.tokens, plain.tokens, i, tie_threshold=0.0)
        assert d.logit_diff > 0.5 and d.threshold == 0.0
        assert d.cause == "real bug"
        return
    pytest.fail("no greedy divergence on any prompt")


def test_recorded_rows_are_the_replay_and_are_checked_against_the_output() -> None:
    """The rows recorded from the run's verify passes equal the full shape-matched replay bit
    for bit on a deterministic backend; a recorded pass whose first token is not the one the
    output implies (a decoder feeding the target the wrong context) is flagged."""
    draft, target = _pair("mock:close:32")
    ids = PROMPTS[0]
    rec = RecordingLM(target)
    res = generate(rec, draft, ids, max_new_tokens=20, k=3, sampling=SamplingConfig(1.0), seed=1)
    rows, ok = recorded_rows(rec.passes, ids, res.tokens, res.rounds)
    assert ok and rows.shape == (len(res.tokens), 32)
    assert torch.equal(rows, replay_rows(target, ids, res.tokens, res.rounds))
    start, fed, logits = rec.passes[-1]
    bad = [*rec.passes[:-1], (start, [(fed[0] + 1) % 32, *fed[1:]], logits)]
    assert not recorded_rows(bad, ids, res.tokens, res.rounds)[1]
    shifted = [*rec.passes[:-1], (start + 1, fed, logits)]
    assert not recorded_rows(shifted, ids, res.tokens, res.rounds)[1]


def test_probe_bound_accounts_for_temperature_and_truncation() -> None:
    """The probe's logit difference eps is turned into a per-token TV bound at the sampling
    temperature (1 - exp(-2 eps / T)), and no bound is offered under top-k / top-p."""
    draft, target = _pair("mock:close:32")
    noisy = BatchVariantLM(target, 0.05)
    hot = run_level3(draft, noisy, PROMPTS, replace(CFG, temperature=0.5), parts=("probe",))
    assert hot.probe is not None
    eps = hot.probe.max_abs
    assert f"{1 - math.exp(-2 * eps / 0.5):.3g}" in hot.probe_tv_bound_sentence()
    cut = run_level3(draft, noisy, PROMPTS, replace(CFG, top_k=5), parts=("probe",))
    assert "bounds nothing" in cut.probe_tv_bound_sentence()
    assert any("bounds nothing" in line for line in cut.shown())


def test_top2_gap() -> None:
    """Largest minus second-largest logit, exactly."""
    assert top2_gap(torch.tensor([1.0, 3.0, 2.5])) == 0.5


def test_code_predict_prompts_come_with_their_predictions() -> None:
    """``--prompts code_predict``: the texts and, in the same order, their predictions; a set
    without predictions gives None."""
    from specdec.certify.prompts import load_certify_prompts

    loaded = load_certify_prompts("code_predict", 5)
    texts, predictions = loaded.texts, loaded.predictions
    assert predictions is not None and len(texts) == len(predictions) == 5
    assert all(p for p in predictions) and "prediction" in loaded.where
    assert all(p in t for t, p in zip(texts, predictions, strict=True))  # the code edited
    assert load_certify_prompts("spec_bench", 5).predictions is None
    assert len(load_certify_prompts("spec_bench", 5).texts) == 5


def test_a_prompt_file_is_read_once_with_its_predictions(tmp_path: Path) -> None:
    """A user's JSONL file: texts and predictions in order, the first n; a file without any
    prediction gives None; plain text is one prompt per line; an empty file is an error."""
    from specdec.certify.prompts import load_certify_prompts
    from specdec.errors import ConfigError

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": "b", "prediction": "x"}\n{"text": "c"}\n')
    loaded = load_certify_prompts(str(f), 2)
    assert loaded.texts == ["a", "b"] and loaded.predictions == [None, "x"]
    assert loaded.where == str(f)
    assert load_certify_prompts(str(f), 0).texts == ["a", "b", "c"]
    g = tmp_path / "p.txt"
    g.write_text("one\n\ntwo\n")
    assert load_certify_prompts(str(g), 0) == type(loaded)(["one", "two"], None, str(g))
    empty = tmp_path / "e.txt"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="holds no prompts"):
        load_certify_prompts(str(empty), 0)
