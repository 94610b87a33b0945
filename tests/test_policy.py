"""K policies and the speed model (pure; synthetic timings, no clocks)."""

from __future__ import annotations

import pytest

from specdec.core.loop import generate
from specdec.core.policy import AdaptiveK, FixedK
from specdec.core.result import Round
from specdec.errors import ConfigError
from specdec.models.mock import mock_pair
from specdec.theory import (
    best_k,
    draft_model_ceiling,
    expected_tokens_per_round,
    geometric_tokens_per_round,
    predicted_speedup,
)


def feed(
    policy: AdaptiveK, rounds: int, accept_p: float, t_draft: float, t_verify: callable
) -> list[int]:  # type: ignore[valid-type]
    """Drive the policy with deterministic synthetic rounds; returns the Ks it chose."""
    ks = []
    credit = 0.0
    for _ in range(rounds):
        k = policy.next_k()
        ks.append(k)
        n = 0
        while n < k:  # deterministic acceptance: accept while the running credit allows
            credit += accept_p
            if credit >= 1.0:
                credit -= 1.0
                n += 1
            else:
                break
        tv = t_verify(k + 1)  # type: ignore[misc]
        t_round = t_draft * k + tv + 0.001
        policy.observe(Round(k, n, [0] * (n + 1), t_draft * k, tv, 0.0, t_round))
    return ks


def test_adaptive_goes_long_when_verification_is_parallel_and_drafts_cheap() -> None:
    pol = AdaptiveK(k_max=8)
    ks = feed(pol, 200, accept_p=0.95, t_draft=0.01, t_verify=lambda n: 0.25)
    assert sorted(ks[-50:])[25] >= 6


def test_adaptive_falls_back_to_plain_when_speculation_loses() -> None:
    pol = AdaptiveK(k_max=8)
    # serial verification and a draft half as expensive as the target: never pays
    ks = feed(pol, 200, accept_p=0.4, t_draft=0.2, t_verify=lambda n: 0.4 * n)
    assert ks[-50:].count(0) >= 40  # plain, apart from the periodic probes


def test_adaptive_is_lossless_on_mocks() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    prompt = [0, 4, 5]
    plain = generate(target, None, prompt, max_new_tokens=60, k=0, stop_on_eos=False)
    spec = generate(
        target, draft, prompt, max_new_tokens=60, k=AdaptiveK(k_max=6), stop_on_eos=False
    )
    assert spec.tokens == plain.tokens
    assert len({r.k for r in spec.rounds}) > 1  # it did adapt


def test_policy_validation() -> None:
    with pytest.raises(ConfigError):
        FixedK(-1)
    with pytest.raises(ConfigError):
        AdaptiveK(k_max=-2)
    with pytest.raises(ConfigError):
        AdaptiveK(k_max=3, decay=1.0)


def test_expected_tokens_by_hand() -> None:
    assert expected_tokens_per_round([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_per_round([1.0] * 4, 4) == 5
    assert geometric_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    # decaying acceptance: the geometric formula with the pooled rate overestimates
    accept = [0.9, 0.5, 0.2]
    pooled = (0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.2) / (1 + 0.9 + 0.9 * 0.5)
    assert geometric_tokens_per_round(pooled, 3) > expected_tokens_per_round(accept, 3) - 1


def test_predicted_speedup_and_best_k() -> None:
    # perfect drafts, free drafting, parallel verification: K + 1 tokens per target pass
    assert predicted_speedup([1.0] * 4, 4, c=0.0) == 5
    # serial verification (cost K + 1) with c = 0.5 never beats plain
    serial = [float(n) for n in range(1, 10)]
    assert best_k([0.6] * 8, 0.5, serial, 8) == 0
    assert best_k([0.9] * 8, 0.05, [1.0] * 9, 8) == 8


# verify(n) / verify(1), n = 1..8, of the 1.5B Q4_K_M target on the 2-core development machine
# (benchmarks/results/verify-curve-1.5b-q4_k_m-wide.json, setting "default", n = 7 interpolated)
THIS_MACHINE = [1.00, 1.54, 2.07, 2.34, 2.96, 3.34, 4.50, 5.66]


def test_draft_model_ceiling_flat_curve_cheap_draft_pays() -> None:
    # K = 1: 2 / 1.1 = 1.82, K = 2: 3 / 1.2 = 2.5, K = 3: 4 / 1.3 = 3.08 -> the longest wins
    k, ceiling = draft_model_ceiling(0.1, [1.0, 1.0, 1.0, 1.0])
    assert k == 3
    assert ceiling == pytest.approx(4 / 1.3)
    assert ceiling > 1.0


def test_draft_model_ceiling_this_machine_stays_below_plain() -> None:
    # c = 0.66: K = 1: 2 / 2.20 = 0.909, K = 2: 3 / 3.39 = 0.885, K = 3: 4 / 4.32 = 0.926,
    # K = 4: 5 / 5.60 = 0.893, K = 5: 6 / 6.64 = 0.904, K = 6: 7 / 8.46, K = 7: 8 / 10.28
    k, ceiling = draft_model_ceiling(0.66, THIS_MACHINE)
    assert k == 3
    assert ceiling == pytest.approx(4 / 4.32)
    assert ceiling < 1.0
    # a free draft on the same curve: K = 5 gives 6 / 3.34 = 1.80, the best of 2 / 1.54 ..
    assert draft_model_ceiling(0.0, THIS_MACHINE) == (5, pytest.approx(6 / 3.34))


def test_draft_model_ceiling_serial_curve_free_draft_is_parity() -> None:
    # verify(n) = n: K + 1 tokens for K + 1 steps at every K; the tie keeps K = 1
    assert draft_model_ceiling(0.0, [1.0, 2.0, 3.0]) == (1, pytest.approx(1.0))
    # any draft cost at all then loses: 2 / (0.2 + 2) = 0.909 beats 3 / (0.4 + 3) = 0.882
    assert draft_model_ceiling(0.2, [1.0, 2.0, 3.0]) == (1, pytest.approx(2 / 2.2))


@pytest.mark.parametrize(
    ("c", "curve"),
    [
        (-0.1, [1.0, 1.5]),
        (float("nan"), [1.0, 1.5]),
        (float("inf"), [1.0, 1.5]),
        (0.5, [1.0]),
        (0.5, []),
        (0.5, [1.0, 0.0]),
        (0.5, [1.0, float("nan")]),
        (0.5, [2.0, 3.0]),
    ],
)
def test_draft_model_ceiling_rejects_bad_input(c: float, curve: list[float]) -> None:
    with pytest.raises(ValueError):
        draft_model_ceiling(c, curve)
