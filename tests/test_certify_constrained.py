"""The certificate's constrained level (``specdec.certify.constrained``, runs in
``specdec.constrained_runs``): the decoding loop under a grammar on mock models against the
exact constrained law, and the fixtures that must give the opposite verdict.

Thresholds are the certificate's own, fixed before running: zero greedy mismatches, and the
goodness-of-fit tests Holm-adjusted at family-wise alpha 0.01 (``stats.thresholds.ALPHA``).
The sizes here are cut down (300 sequences per setup, seed 0) so each run takes seconds:
- the decoder as it is must PASS, and so must the control ``constraint-target-only`` (the
  draft model's rows unmasked: the walk is exact for whatever q the drafts came from);
- ``constraint-draft-only`` (the target's rows unmasked) and ``constraint-no-rollback`` (the
  grammar state never rolled back) must FAIL.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

from specdec.certify.common import FAIL, PASS, torch_threads
from specdec.certify.constrained import (
    GRAMMAR_NAMES,
    ConstrainedConfig,
    run_constrained,
    support_only,
)
from specdec.certify.faults import injected_fault
from specdec.cli import main
from specdec.constrained_runs import (
    constrained_greedy_path,
    constrained_pair,
    exact_constrained_window,
    mock_grammar,
)
from specdec.constraints.processor import GrammarProcessor
from specdec.core.sampling import SamplingConfig
from specdec.mock_runs import SampledSetup


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Mock-sized tensors: one thread (a second one only adds synchronisation)."""
    with torch_threads(1):
        yield


# cut down from the quick plan: both grammars, a draft model (the path every fault reaches)
# and the n-gram drafter (drafts cut by the grammar before the pass)
SMALL = ConstrainedConfig(
    greedy_closeness=("close",),
    greedy_prompts=2,
    greedy_ks=(0, 4),
    greedy_drafters=("model", "ngram", "prediction-wrong"),
    setups=(
        SampledSetup("close-K4", "close", 4),
        SampledSetup(
            "close-K4-T0.8-topk3-topp0.9", "close", 4, temperature=0.8, top_k=3, top_p=0.9
        ),
    ),
    sequences=300,
)
ITEMS_ONLY = replace(SMALL, grammars=("items",))


# -- the reference -----------------------------------------------------------------------------


def test_the_reference_masks_are_the_processors_and_follow_the_grammar() -> None:
    """The reference mask after an output (a fresh matcher fed the output) is the mask a
    fresh GrammarProcessor applies there; after "a" only "b", after "d" also "e", EOS only
    after a whole item, only EOS after EOS."""
    on_mock = constrained_pair(mock_grammar("items"), "close", 0)[2]
    rnd = random.Random(0)
    for _ in range(30):
        out: list[int] = []
        for _ in range(rnd.randint(0, 3)):
            out += rnd.choice([[3, 4], [5], [6], [6, 7]])
        if rnd.random() < 0.3:
            out.append(3)  # inside an item
        fresh = on_mock.processor(2).rows([9, 9, *out], [], torch.zeros(1, 8))[0]
        assert torch.equal(on_mock.allowed(out), torch.isfinite(fresh)), out
    allowed = on_mock.allowed
    assert allowed([3]).nonzero().flatten().tolist() == [4]
    assert allowed([6]).nonzero().flatten().tolist() == [1, 3, 5, 6, 7]
    assert allowed([]).nonzero().flatten().tolist() == [3, 5, 6]
    assert allowed([5, 1]).nonzero().flatten().tolist() == [1]


def test_the_exact_law_is_plain_decoding_under_the_grammar() -> None:
    """The exact law of positions 1-2 is a distribution on the grammar's prefixes; its
    probabilities are the products of the masked, renormalised rows; the greedy reference
    follows the masked argmax."""
    _, target, on_mock = constrained_pair(mock_grammar("items"), "close", 0)
    prompt = [5, 6]
    cfg = SamplingConfig(1.0)
    law = exact_constrained_window(target, on_mock, prompt, 1, 2, cfg)  # [64]
    assert law.sum() == pytest.approx(1.0, abs=1e-6)
    support = {(int(i) % 8, int(i) // 8) for i in np.flatnonzero(law)}
    # "ab"; "c" or "d" then EOS or a new item; "d" then "e"
    starts = {(3, 4)} | {(x, y) for x in (5, 6) for y in (1, 3, 5, 6)} | {(6, 7)}
    assert support == starts

    def row(out: list[int]) -> torch.Tensor:
        logits = target.logits_for_context([*prompt, *out])
        return torch.softmax(logits.masked_fill(~on_mock.allowed(out), -torch.inf).double(), 0)

    assert law[6 + 8 * 7] == pytest.approx(float(row([])[6] * row([6])[7]), rel=1e-5)
    path = constrained_greedy_path(target, on_mock, prompt, 8)
    for i, tok in enumerate(path):
        assert tok == int(torch.argmax(row(path[:i])))


def test_categories_outside_the_law_and_the_sample_are_left_out() -> None:
    counts, exact = np.array([5, 0, 0, 2]), np.array([0.5, 0.5, 0.0, 0.0])
    c, e = support_only(counts, exact)
    assert c.tolist() == [5, 0, 2] and e.tolist() == [0.5, 0.5, 0.0]


# -- the verdicts --------------------------------------------------------------------------------


def test_the_decoder_under_a_grammar_passes() -> None:
    """Both grammars: every greedy run is plain decoding's and the reference's, no sampled
    test rejects at family-wise 0.01, nothing falls outside the grammar."""
    r = run_constrained(SMALL)
    s = r.summary()
    assert r.status == PASS, s
    assert s["greedy_units"] == 2 * 2 * 3 * 2  # grammars x prompts x drafters x K
    assert s["greedy_mismatches"] == 0
    assert s["sampled_tests"] == 2 * 2 * 2 and s["sampled_rejected"] == 0
    assert s["outside_support"] == 0
    assert set(r.grammars) == set(GRAMMAR_NAMES)


def test_the_draft_rows_unmasked_is_lossless_and_passes() -> None:
    """The control: the draft model samples from its unmasked rows (ruled-out drafts are
    rejected by the walk, p = 0); the output keeps the constrained law."""
    with injected_fault("constraint-target-only"):
        r = run_constrained(ITEMS_ONLY)
    assert r.status == PASS, r.summary()


@pytest.mark.parametrize("fault", ["constraint-draft-only", "constraint-no-rollback"])
def test_a_grammar_applied_wrongly_fails(fault: str) -> None:
    """The target's rows unmasked, or the grammar state never rolled back: the greedy check
    and the sampled tests both FAIL (outputs leave the grammar)."""
    with injected_fault(fault):
        r = run_constrained(ITEMS_ONLY)
    s = r.summary()
    assert r.status == FAIL
    assert s["greedy_mismatches"] >= 1 and s["sampled_rejected"] >= 1, s
    assert s["outside_support"] >= 1 and s["sampled_min_p"] == 0.0


def test_a_constraint_fault_is_restored_after_the_block() -> None:
    from specdec.core import model_drafter
    from specdec.core import round as core_round

    before = (GrammarProcessor._sync, core_round.process_rows, model_drafter.process_rows)
    for fault in ("constraint-no-rollback", "constraint-draft-only", "constraint-target-only"):
        with injected_fault(fault):
            now = (GrammarProcessor._sync, core_round.process_rows, model_drafter.process_rows)
            assert now != before
    assert (GrammarProcessor._sync, core_round.process_rows, model_drafter.process_rows) == before


# -- the command line ----------------------------------------------------------------------------


CLI = ["certify", "--levels", "constrained", "--quick", "--scale", "0.2", "--constraint", "items"]


def test_certify_constrained_writes_which_grammar(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`--levels constrained --constraint items`: exit 0, the verdict names the grammar, the
    JSON and the markdown say the setup was constrained and by which grammar."""
    assert main([*CLI, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("VERDICT: PASS") and "constrained (items) pass" in out
    doc = json.loads((tmp_path / "certificate.json").read_text())
    assert list(doc["constraints"]) == ["items"] and "Lark" in doc["constraints"]["items"]
    assert doc["plan"]["constrained"]["grammars"] == ["items"]
    assert doc["levels"]["constrained"]["summary"]["status"] == "pass"
    md = (tmp_path / "certificate.md").read_text()
    assert "constrained decoding (the constrained level), grammars: `items`" in md
    assert "--constraint items" in md  # the command that reproduces it


def test_certify_constrained_fails_with_a_constraint_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rc = main([*CLI, "--inject-fault", "constraint-no-rollback", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "injected fault 'constraint-no-rollback': FAIL" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--levels", "1", "--inject-fault", "constraint-draft-only"], "add constrained"),
        (["--levels", "2", "--constraint", "items"], "add constrained to --levels"),
        (["--levels", "constrained", "--constraint", "yaml"], "--constraint takes"),
    ],
)
def test_constrained_usage_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    """A constraint fault without the level that runs grammars (it would change nothing),
    --constraint without that level, an unknown grammar: one error line, exit 2."""
    rc = main(["certify", *argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert err.strip().splitlines()[-1].startswith("specdec: error:")


def test_cli_grammar_list_matches_the_package() -> None:
    from specdec.cli.certify import GRAMMAR_CHOICES

    assert tuple(GRAMMAR_CHOICES) == GRAMMAR_NAMES
