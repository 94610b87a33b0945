"""The walk checks must fail on broken walks (otherwise they prove nothing)."""

from __future__ import annotations

import pytest
import torch

from specdec.core import rejection
from specdec.core.rejection import RandomSource, walk
from specdec.core.sampling import make_generator
from walk_checks import exact_deviation, monte_carlo_pvalues, random_case, round_distribution


def residual_is_p(p, q, drafts, rng: RandomSource):  # type: ignore[no-untyped-def]
    """Bug: on rejection sample from p instead of norm(max(0, p - q))."""
    orig = rejection.residual_distribution
    rejection.residual_distribution = lambda pp, qq: pp / pp.sum()
    try:
        return walk(p, q, drafts, rng)
    finally:
        rejection.residual_distribution = orig


def always_accept(p, q, drafts, rng: RandomSource):  # type: ignore[no-untyped-def]
    k = drafts.shape[0]
    return k, rng.categorical(p[k].double().numpy())


def no_bonus(p, q, drafts, rng: RandomSource):  # type: ignore[no-untyped-def]
    """Bug: after full acceptance, the 'bonus' comes from the last draft row."""
    n, nxt = walk(p, q, drafts, rng)
    k = drafts.shape[0]
    if n == k and k > 0 and q is not None:
        return n, rng.categorical(q[k - 1].double().numpy())
    return n, nxt


def accept_ratio_inverted(p, q, drafts, rng: RandomSource):  # type: ignore[no-untyped-def]
    orig = rejection.acceptance_probabilities

    def inverted(px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
        return torch.where(px > 0, (qx / px.clamp(min=1e-300)).clamp(max=1.0), 0.0)

    rejection.acceptance_probabilities = inverted
    try:
        return walk(p, q, drafts, rng)
    finally:
        rejection.acceptance_probabilities = orig


BROKEN = [residual_is_p, always_accept, no_bonus, accept_ratio_inverted]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda f: f.__name__)
def test_exact_check_catches(broken) -> None:  # type: ignore[no-untyped-def]
    g = make_generator(3)
    worst = 0.0
    for _ in range(6):
        p, q = random_case(g, 5, 2, "dense")
        worst = max(worst, exact_deviation(round_distribution(broken, p, q), p))
    assert worst > 1e-3


@pytest.mark.parametrize("broken", BROKEN, ids=lambda f: f.__name__)
def test_monte_carlo_check_catches(broken) -> None:  # type: ignore[no-untyped-def]
    g = make_generator(4)
    p, q = random_case(g, 6, 2, "dense")
    pv = monte_carlo_pvalues(broken, p, q, 20_000, seed=9)
    assert min(pv) < 1e-6


def test_real_walk_passes_the_same_small_checks() -> None:
    g = make_generator(4)
    p, q = random_case(g, 6, 2, "dense")
    assert min(monte_carlo_pvalues(walk, p, q, 20_000, seed=9)) > 1e-3
    assert exact_deviation(round_distribution(walk, p, q), p) < 1e-6
