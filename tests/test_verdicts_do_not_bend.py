"""Every tie and tolerance decision of the certificate (issue 42, item 1), each with the
fixture that must FAIL it and, beside it, the one that must not.

Endpoint (``specdec.certify.endpoint``): the greedy near-tie on the rows a side reported
(signed gap, the chosen token the row's best), on a follow-up row (both tokens within the
gap of the row's best), and the Holm family (a NaN p-value, an impossible token). Local
(``specdec.certify``): the Level 3 near-tie (both gaps finite, a finite threshold from the
probe), the probe's rollback and the replay check (a NaN is broken, not zero), the per-token
TV bound against plain decoding (one sequence gives no bound), and Level 1's exact check (a
NaN deviation anywhere fails).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
import torch

from specdec.certify.endpoint.greedy import compare_greedy
from specdec.certify.endpoint.sampled import joint_holm
from specdec.endpoint.client import Reply
from specdec.stats.multiple import holm_adjust

TIE = 0.1  # --tie-gap, fixed before any of these replies


def reply(tokens: Sequence[str], rows: Sequence[Mapping[str, float]]) -> Reply:
    return Reply(
        "".join(tokens), "length", 1.0, None, None, "none", 0, None, tuple(tokens), tuple(rows)
    )


ON_A = ["The", " A"]
OFF_B = ["The", " B"]


def test_the_issue_case_a_choice_its_own_row_scores_lower_fails() -> None:
    """The spec-on side picks A at temperature 0 while its own logprobs score A 4.99 nats
    below B; the spec-off side shows a 0.02 gap. The signed gap was -4.99 <= 0.1: a "near-tie"
    (PASS WITH CAVEATS). A side that did not pick its own argmax is a FAIL."""
    on = reply(ON_A, [{"The": -0.1}, {" A": -5.0, " B": -0.01}])
    off = reply(OFF_B, [{"The": -0.1}, {" B": -1.0, " A": -1.02}])
    case = compare_greedy("p", on, off, TIE)
    assert case.status == "differs"
    assert "spec-on side chose ' A'" in case.reason and "4.99 nats higher" in case.reason


def test_a_real_near_tie_still_is_one() -> None:
    """The opposite verdict: both sides chose their own best token, each ahead by <= 0.1."""
    on = reply(ON_A, [{"The": -0.1}, {" A": -1.0, " B": -1.05}])
    off = reply(OFF_B, [{"The": -0.1}, {" B": -1.0, " A": -1.02}])
    case = compare_greedy("p", on, off, TIE)
    assert case.status == "near-tie"
    assert case.gap_on == pytest.approx(0.05) and case.gap_off == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("row_on", "row_off", "why"),
    [
        ({" A": -1.0, " B": -1.02, " C": -0.5}, {" B": -1.0, " A": -1.02}, "spec-on side chose"),
        ({" A": -1.0, " B": -1.02}, {" B": -3.0, " A": -1.0}, "spec-off side chose"),
        ({" A": -math.inf, " B": -1.0}, {" B": -1.0, " A": -1.02}, "spec-on side chose"),
    ],
    ids=["a third token leads the choice", "spec-off not greedy", "a choice of probability 0"],
)
def test_a_non_greedy_side_is_never_a_near_tie(
    row_on: dict[str, float], row_off: dict[str, float], why: str
) -> None:
    on = reply(ON_A, [{"The": -0.1}, row_on])
    off = reply(OFF_B, [{"The": -0.1}, row_off])
    case = compare_greedy("p", on, off, TIE)
    assert case.status == "differs" and why in case.reason


def test_a_follow_up_row_led_by_a_third_token_is_not_a_tie() -> None:
    """A follow-up row (llama-server's drafted tokens have none) counted |A - B|: 0.02 here,
    a "near-tie", though the row's best token C leads both by 2.9 nats: at that position
    neither side's choice is the server's argmax. The gap is the distance to the best."""
    on = reply(ON_A, [{"The": -0.1}, {}])  # the drafted " A" has no row
    off = reply(OFF_B, [{"The": -0.1}, {" B": -1.0, " A": -1.02}])
    led = compare_greedy("p", on, off, TIE, follow_up=({" C": -0.1, " A": -3.0, " B": -3.02}, None))
    assert led.status == "differs" and led.gap_on == pytest.approx(2.92)
    # the opposite verdict: the two tokens are the contest there, 0.04 apart
    tie = compare_greedy("p", on, off, TIE, follow_up=({" B": -0.68, " A": -0.72}, None))
    assert tie.status == "near-tie" and tie.gap_on == pytest.approx(0.04)


def test_a_nan_p_value_is_rejected_not_passed() -> None:
    """Holm with a NaN p-value (a test that could not be computed) used to give NaN, which
    compares false with alpha: not rejected. It counts as 0."""
    assert list(holm_adjust([math.nan, 0.5])) == [0.0, 0.5]
    from specdec.certify.endpoint.pertoken import EndpointPerTokenResult
    from specdec.stats.uniformity import UniformityResult

    def per_token(impossible: int, p: float) -> EndpointPerTokenResult:
        u = UniformityResult(100, impossible, 0.0, p, 0.0, p, 20, 0.01, 0.0, 0.0)
        return EndpointPerTokenResult(u, 10, 20, 1.0, {}, u.pvalue, False)

    _, out = joint_holm([], per_token(0, math.nan), 0.01)
    assert out is not None and out.rejected
    assert not joint_holm([], per_token(0, 0.5), 0.01)[1].rejected  # type: ignore[union-attr]
    assert joint_holm([], per_token(1, 0.5), 0.01)[1].rejected  # type: ignore[union-attr]


# -- local certificate -------------------------------------------------------------------------


def _wrong_rows_divergence(not_token: int | None = None) -> tuple[object, ...]:
    """A target whose multi-token rows are wrong (``faults.WrongRowsLM``) diverges from plain
    decoding under greedy, with the replay reproducing the flip (the first divergence whose
    speculative token is not ``not_token``)."""
    from specdec.certify.faults import WrongRowsLM
    from specdec.certify.mock_level import mock_prompts
    from specdec.core.loop import generate
    from specdec.core.sampling import SamplingConfig, make_generator
    from specdec.models.loader import ModelConfig, load_model

    draft = load_model(ModelConfig("mock:close:32"))
    target = WrongRowsLM(load_model(ModelConfig("mock:target:32")))
    for ids in mock_prompts(make_generator(7), 6, 32):
        spec = generate(target, draft, ids, max_new_tokens=16, k=3, sampling=SamplingConfig())
        plain = generate(target, None, ids, max_new_tokens=16, k=0, sampling=SamplingConfig())
        for i, (a, b) in enumerate(zip(spec.tokens, plain.tokens, strict=False)):
            if a != b and a != not_token:
                return target, ids, spec, plain.tokens, i
    raise AssertionError("no greedy divergence on any prompt")


def test_a_probe_that_measured_inf_excuses_no_flip() -> None:
    """A probe whose logits differed by inf (a backend with inf logits in some pass) gave a
    tie threshold of inf, under which every reproduced flip was a "near-tie". A threshold must
    be finite, and a probe without a finite difference allows no near-tie."""
    from specdec.certify.invariance import InvarianceResult, InvarianceRow
    from specdec.certify.real import classify_divergence
    from specdec.core.rows import rows_both_ways

    target, ids, spec, plain, i = _wrong_rows_divergence()
    rows = rows_both_ways(target, ids, spec.tokens, spec.rounds, i)  # type: ignore[arg-type, attr-defined]
    d = classify_divergence(*rows, spec.tokens, plain, i, tie_threshold=math.inf)  # type: ignore[arg-type, attr-defined]
    assert d.reproduced and d.cause == "real bug"
    wide = classify_divergence(*rows, spec.tokens, plain, i, tie_threshold=1e6)  # type: ignore[arg-type, attr-defined]
    assert wide.cause == "near-tie"  # the opposite verdict: a finite (if silly) threshold
    row = InvarianceRow(2, 4, math.inf, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0)
    probe = InvarianceResult("m", 1, [2], [row], 0.0, 0.0)
    assert probe.tie_threshold == 0.0


class _NanSingleRows:
    """The target with every one-token pass returning NaN logits (a broken kernel): plain
    decoding's rows, as ``core.rows.plain_rows`` recomputes them, are NaN."""

    def __init__(self, model: object) -> None:
        from specdec.models.wrapped import WrappedLM

        self.inner = WrappedLM(model)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        out = self.inner.model.extend(tokens)
        if len(tokens) == 1:
            out = torch.full_like(out, math.nan)
        return out[-1:] if last_only else out


def test_a_nan_row_at_the_divergence_is_a_bug_not_a_tie() -> None:
    """max(gap_batched, gap_single) dropped a NaN that came second: a NaN one-token row at
    the divergence, with a finite batched gap under the threshold, was a "near-tie"."""
    from specdec.certify.real import classify_divergence, top2_gap
    from specdec.core.rows import rows_both_ways

    target, ids, spec, plain, i = _wrong_rows_divergence(not_token=0)
    broken = _NanSingleRows(target)
    batched, single = rows_both_ways(broken, ids, spec.tokens, spec.rounds, i)  # type: ignore[arg-type, attr-defined]
    gb = top2_gap(batched)
    assert math.isfinite(gb)
    nan_plain = list(plain)  # type: ignore[call-overload]
    nan_plain[i] = 0  # argmax of an all-NaN row: the choice plain decoding would make
    d = classify_divergence(batched, single, spec.tokens, nan_plain, i, tie_threshold=gb + 1.0)  # type: ignore[attr-defined]
    assert d.reproduced and math.isnan(d.gap_single)
    assert d.cause == "real bug"


def _level3(**probe: float) -> object:
    from specdec.certify.invariance import InvarianceResult, InvarianceRow
    from specdec.certify.real import Level3Config, Level3Result

    row = InvarianceRow(2, 4, probe.get("max_abs", 0.0), 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0)
    inv = InvarianceResult("m", 1, [2], [row], probe.get("rollback", 0.0), 0.0)
    return Level3Result(Level3Config(), "d", "t", probe=inv)


def test_a_nan_rollback_error_fails_the_level() -> None:
    """rollback_max_abs > 0 is False for NaN: a rollback that gives NaN logits passed."""
    assert _level3(rollback=math.nan).status == "fail"  # type: ignore[attr-defined]
    assert _level3(rollback=0.0).status == "pass"  # type: ignore[attr-defined]
    assert _level3(rollback=1e-3).status == "fail"  # type: ignore[attr-defined]


def test_the_probe_keeps_a_nan_wherever_it_comes() -> None:
    from specdec.certify.common import worst

    assert math.isnan(worst([0.0, 0.5, math.nan])) and math.isnan(worst([math.nan, 0.5]))
    assert max(0.5, math.nan) == 0.5  # what the probe used to aggregate with
    assert worst([0.1, 0.3]) == 0.3 and worst([]) == 0.0


def _scores(tvs: Sequence[float], replay: float | None = 0.0) -> object:
    from specdec.certify.pertoken import SequenceScore
    from specdec.certify.real import Level3Config, summarize_scores
    from specdec.certify.seeds import SeedPlan

    rng = np.random.default_rng(0)
    seqs = [
        SequenceScore(
            n_tokens=200,
            n_rounds=50,
            u_shape_matched=list(rng.random(200)),
            u_plain=list(rng.random(200)),
            tv_plain=tv,
            seconds=0.0,
            replay_max_abs=replay,
        )
        for tv in tvs
    ]
    return summarize_scores(seqs, Level3Config(), "-P", SeedPlan(0))


def test_one_plain_sequence_bounds_nothing() -> None:
    """The rule against plain decoding: FAIL unless the upper 95 % bound of the per-token TV
    is below 0.02. One sequence has no interval, and its value (0.001) was taken as its own
    upper bound: a PASS on one sample. Several sequences well below give a bound."""
    one = _scores([0.001])
    assert one.plain_effect_too_large  # type: ignore[attr-defined]
    many = _scores([0.001, 0.0012, 0.0009, 0.0011])
    assert not many.plain_effect_too_large  # type: ignore[attr-defined]


def test_a_nan_replay_difference_breaks_the_reference() -> None:
    """replay_max_abs > 0 is False for NaN: a replay that gave NaN rows vouched for them."""
    assert _scores([0.001, 0.001], replay=math.nan).reference_broken  # type: ignore[attr-defined]
    assert not _scores([0.001, 0.001], replay=0.0).reference_broken  # type: ignore[attr-defined]


def test_level1_exact_fails_on_a_nan_deviation_anywhere() -> None:
    """The exact check's worst deviation was max() over prefixes: a NaN after the first
    prefix was dropped, and the case passed its tolerance."""
    from specdec.certify.synthetic import conditional_deviation

    p = np.array([[0.5, 0.5], [math.nan, math.nan]])  # the second position's row is NaN
    dist = {(0,): 0.5, (1, 0): 0.25, (1, 1): 0.25}
    worst, _ = conditional_deviation(dist, p)
    assert math.isnan(worst) and not worst <= 1e-9
    fine, _ = conditional_deviation(dist, np.array([[0.5, 0.5], [0.5, 0.5]]))
    assert fine <= 1e-12  # the opposite verdict: the exact distribution passes
