"""The accept/reject walk: hand-made cases, exact distributions, Monte Carlo fit.

Thresholds (fixed before running):
- exact checks: every joint probability within 1e-6 of the target's;
- Monte Carlo: 50,000 independent rounds per case, 24 cases; each chi-square p-value must
  exceed 0.01 / (number of tests) (Bonferroni, family-wise alpha 0.01); seeds are fixed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.core.rejection import (
    accept_reject,
    exact_outcome_distribution,
    exact_round_distribution,
    residual_distribution,
    walk,
)
from specdec.core.sampling import make_generator
from walk_checks import exact_deviation, monte_carlo_pvalues, random_case, round_distribution

KINDS = [
    "dense",
    "equal",
    "near_equal",
    "disjoint",
    "sparse_p",
    "sparse_q",
    "peaked",
    "one_hot_both",
]
EXACT_TOL = 1e-6


def _cases(
    n_per_kind: int, vocab: int, seed: int
) -> list[tuple[str, int, torch.Tensor, torch.Tensor]]:
    g = make_generator(seed)
    out = []
    for kind in KINDS:
        for j in range(n_per_kind):
            k = j % 4  # K = 0, 1, 2, 3
            p, q = random_case(g, vocab, k, kind)
            out.append((kind, k, p, q))
    return out


# ---------------------------------------------------------------- hand-made, exact outcomes
def test_identical_one_hot_rows_accept_everything_and_take_the_bonus() -> None:
    p = torch.eye(4)[[2, 0, 3]]  # [K+1=3, V=4]
    q = torch.eye(4)[[2, 0]]
    for seed in range(20):
        assert accept_reject(p, q, torch.tensor([2, 0]), make_generator(seed)) == (2, 3)


def test_greedy_mismatch_rejects_and_emits_the_target_argmax() -> None:
    p = torch.eye(5)[[1, 4, 0]]
    q = torch.eye(5)[[1, 2]]
    for seed in range(20):
        assert accept_reject(p, q, torch.tensor([1, 2]), make_generator(seed)) == (1, 4)


def test_disjoint_supports_always_reject_at_first_position() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25] * 4])
    q = torch.tensor([[0.0, 0.0, 0.3, 0.7]])
    for seed in range(50):
        n, tok = accept_reject(p, q, torch.tensor([3]), make_generator(seed))
        assert n == 0 and tok in (0, 1)


def test_k_zero_is_a_plain_sample() -> None:
    p = torch.tensor([[0.0, 1.0, 0.0]])
    assert accept_reject(
        p, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), make_generator(0)
    ) == (0, 1)
    assert accept_reject(p, None, torch.zeros(0, dtype=torch.long), make_generator(0)) == (0, 1)


def test_exact_outcomes_of_a_small_case_by_hand() -> None:
    # p = (0.6, 0.4), q = (0.9, 0.1), draft token 0: accept w.p. 0.6 / 0.9 = 2/3;
    # residual = norm(max(0, p - q)) = (0, 1). Bonus row (0.2, 0.8).
    p = torch.tensor([[0.6, 0.4], [0.2, 0.8]])
    q = torch.tensor([[0.9, 0.1]])
    d = exact_outcome_distribution(p, q, torch.tensor([0]))
    assert d.keys() == {(0, 1), (1, 0), (1, 1)}
    assert d[(0, 1)] == pytest.approx(1 / 3, abs=1e-7)
    assert d[(1, 0)] == pytest.approx(2 / 3 * 0.2, abs=1e-7)
    assert d[(1, 1)] == pytest.approx(2 / 3 * 0.8, abs=1e-7)


def test_degenerate_residual_has_no_nan() -> None:
    p = np.array([0.25, 0.25, 0.5])
    r = residual_distribution(p, p.copy())
    assert np.all(np.isfinite(r)) and r.sum() == pytest.approx(1.0)
    # rounding-level differences never produce NaN either
    r = residual_distribution(p, p + np.array([1e-17, -1e-17, 0.0]))
    assert np.all(np.isfinite(r))


def test_shape_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="target_probs"):
        accept_reject(torch.ones(2, 3) / 3, None, torch.tensor([0, 1]), make_generator(0))
    with pytest.raises(ValueError, match="draft_probs"):
        accept_reject(
            torch.ones(3, 3) / 3, torch.ones(2, 4) / 4, torch.tensor([0, 1]), make_generator(0)
        )


def test_same_seed_same_outcome() -> None:
    p, q = random_case(make_generator(5), 50, 4, "dense")
    x = torch.tensor([int(torch.argmax(q[i])) for i in range(4)])
    a = [accept_reject(p, q, x, make_generator(s)) for s in range(30)]
    b = [accept_reject(p, q, x, make_generator(s)) for s in range(30)]
    assert a == b


# ---------------------------------------------------------------- exact distributions
@pytest.mark.parametrize("case", _cases(4, 5, seed=11), ids=lambda c: f"{c[0]}-K{c[1]}")
def test_exact_round_distribution_equals_target(case: tuple) -> None:
    _, _, p, q = case
    dist = exact_round_distribution(p, q)
    assert exact_deviation(dist, p) < EXACT_TOL


@pytest.mark.parametrize("case", _cases(3, 4, seed=12), ids=lambda c: f"{c[0]}-K{c[1]}")
def test_exact_with_one_hot_drafts_for_every_fixed_draft(case: tuple) -> None:
    """Drafters without probabilities (n-gram): q one-hot at whatever they propose."""
    _, k, p, _ = case
    vocab = p.shape[1]
    for flat in range(vocab**k):
        drafts = [(flat // vocab**i) % vocab for i in range(k)]
        dist = round_distribution(walk, p, None, fixed_drafts=drafts)
        assert exact_deviation(dist, p) < EXACT_TOL


# ---------------------------------------------------------------- Monte Carlo
MC_TRIALS = 50_000
MC_CASES = _cases(3, 6, seed=13)  # 24 cases


@pytest.mark.slow
def test_monte_carlo_goodness_of_fit() -> None:
    pvalues = []
    for i, (_, _, p, q) in enumerate(MC_CASES):
        pvalues.extend(monte_carlo_pvalues(walk, p, q, MC_TRIALS, seed=1000 + i))
    assert len(MC_CASES) >= 20
    threshold = 0.01 / len(pvalues)
    assert min(pvalues) > threshold, (min(pvalues), threshold)


def _scalar_walk(p: torch.Tensor, q: torch.Tensor | None, xs: torch.Tensor, rng) -> tuple:
    """The walk as it was written before it worked on tensors: every row to float64, one
    position at a time. The tensor walk must give the same outcome from the same draws."""
    pp = p.numpy().astype(np.float64)
    qq = None if q is None else q.numpy().astype(np.float64)
    for i, x in enumerate(int(t) for t in xs):
        q_x = 1.0 if qq is None else float(qq[i, x])
        p_x = float(pp[i, x])
        a = (1.0 if p_x > 0.0 else 0.0) if q_x <= 0.0 else min(1.0, p_x / q_x)
        if rng.bernoulli(a):
            continue
        q_i = np.zeros_like(pp[i]) if qq is None else qq[i]
        if qq is None:
            q_i[x] = 1.0
        return i, rng.categorical(residual_distribution(pp[i], q_i))
    return len(xs), rng.categorical(pp[len(xs)])


@pytest.mark.parametrize("one_hot", [False, True])
def test_the_tensor_walk_gives_the_scalar_walks_outcomes_seed_for_seed(one_hot: bool) -> None:
    from specdec.core.rejection import TorchRandom

    gen = torch.Generator().manual_seed(7)
    for case in range(300):
        k, v = int(torch.randint(0, 6, (1,), generator=gen)), 12
        p = torch.softmax(torch.randn(k + 1, v, generator=gen) * 2, -1)
        q = None if one_hot else torch.softmax(torch.randn(k, v, generator=gen) * 2, -1)
        if q is not None and case % 5 == 0:
            q[:, 3] = 0.0  # a draft of probability 0 under q
        xs = torch.randint(0, v, (k,), generator=gen)
        a = walk(p, q, xs, TorchRandom(make_generator(case)))
        b = _scalar_walk(p, q, xs, TorchRandom(make_generator(case)))
        assert a == b, (case, a, b)
