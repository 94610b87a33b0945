"""The speculative accept/reject walk (Leviathan et al. 2023; Chen et al. 2023).

Terminology (one verification round):
    K              number of draft tokens proposed this round (K >= 0)
    V              vocabulary size
    draft_tokens   x_1 .. x_K, the tokens the drafter proposed          [K]
    draft_probs    q_i(.), the rows the drafter sampled x_i from        [K, V]
                   (None: a drafter without probabilities; q_i is one-hot at x_i)
    target_probs   p_i(.), the target's rows at the same positions      [K + 1, V]
                   (row K is the distribution of the bonus token)

Walk: for i = 1..K accept x_i when u_i < min(1, p_i(x_i) / q_i(x_i)) (the K ratios are one
tensor expression; the draws u_i are made in order, only as far as the walk goes); at the
first rejection
emit a token from the residual norm(max(0, p_i - q_i)) and stop; if all K are accepted, emit a
bonus token from p_{K+1}. The emitted tokens are distributed exactly as if sampled from the
target one at a time. Greedy decoding is the same walk with one-hot p and q.

The walk is written against a tiny ``RandomSource`` interface (a Bernoulli and a categorical
draw). ``accept_reject`` drives it with a ``torch.Generator``; ``exact_outcome_distribution``
drives the very same code with an enumerator that visits every branch with its probability,
which gives the exact output distribution of the implementation itself (used by the tests and
by ``specdec certify``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np
import torch

from specdec.core.sampling import draw_uniform, sample_from_cdf

T = TypeVar("T")

# Residual mass below this is treated as "p == q numerically": the rejection that led here had
# probability ~0, and the target row itself is used instead of dividing by ~0.
RESIDUAL_EPS = 1e-12


class RandomSource(Protocol):
    """The two random primitives the walk uses."""

    def bernoulli(self, prob: float) -> bool:
        """True with probability ``prob`` (clamped to [0, 1])."""
        ...

    def categorical(self, probs: np.ndarray) -> int:
        """An index drawn from the probability row ``probs`` [V] (float64, need not be
        normalised)."""
        ...


class TorchRandom:
    """``RandomSource`` backed by an explicit ``torch.Generator`` (one uniform per call)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def bernoulli(self, prob: float) -> bool:
        return draw_uniform(self.generator) < prob

    def categorical(self, probs: np.ndarray) -> int:
        return sample_from_cdf(np.cumsum(probs), probs, draw_uniform(self.generator))


def acceptance_probabilities(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p/q) for every drafted token at once: p_x, q_x [K] float64, the target's and the
    drafter's probability of each draft; q = 0 (not a valid draft) accepts iff p > 0."""
    ratio = (p_x / torch.where(q_x > 0.0, q_x, 1.0)).clamp(max=1.0)  # [K]
    return torch.where(q_x > 0.0, ratio, (p_x > 0.0).to(p_x.dtype))  # [K]


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)) for float64 rows [V]; falls back to p when the residual has no
    mass (p == q numerically: the rejection that led here had probability ~0)."""
    r = np.maximum(p - q, 0.0)  # [V]
    mass = float(r.sum())
    if mass <= RESIDUAL_EPS:
        return p / float(p.sum())
    return r / mass


def _check_shapes(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor
) -> int:
    if draft_tokens.ndim != 1:
        raise ValueError(f"draft_tokens must be 1-D [K], got shape {tuple(draft_tokens.shape)}")
    k = int(draft_tokens.shape[0])
    if target_probs.ndim != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"target_probs must be [K+1, V] = [{k + 1}, V], got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (k, target_probs.shape[1]):
        raise ValueError(
            f"draft_probs must be [K, V] = [{k}, {target_probs.shape[1]}], "
            f"got {tuple(draft_probs.shape)}"
        )
    return k


def _row(probs: torch.Tensor) -> np.ndarray:
    """One probability row [V] as float64 numpy (what the categorical draws use)."""
    return probs.detach().cpu().numpy().astype(np.float64)


def walk(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    rng: RandomSource,
) -> tuple[int, int]:
    """The accept/reject walk on explicit randomness; returns (n_accepted, next_token).

    The acceptance test of all K drafts is one tensor expression over K gathered scalars;
    only the row the walk ends on (the first rejected position's residual, or the bonus row)
    is ever read whole. One Bernoulli draw per position reached, in order, so a seeded
    generator gives the same outcome as a scalar walk would."""
    k = _check_shapes(target_probs, draft_probs, draft_tokens)
    xs = draft_tokens.detach().cpu().long()  # [K]
    at = torch.arange(k)
    p_x = target_probs.detach().cpu()[at, xs].double()  # [K]
    q_x = (
        torch.ones(k, dtype=torch.float64)
        if draft_probs is None
        else (draft_probs.detach().cpu()[at, xs].double())
    )  # [K]
    accept = acceptance_probabilities(p_x, q_x).tolist()  # [K]
    for i in range(k):
        if rng.bernoulli(accept[i]):
            continue
        p_i = _row(target_probs[i])  # [V]
        if draft_probs is None:
            q_i = np.zeros_like(p_i)
            q_i[int(xs[i])] = 1.0  # the one-hot row of a drafter without probabilities
        else:
            q_i = _row(draft_probs[i])
        return i, rng.categorical(residual_distribution(p_i, q_i))
    return k, rng.categorical(_row(target_probs[k]))


def accept_reject(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """One verification round: returns (n_accepted in 0..K, next_token).

    target_probs [K+1, V], draft_probs [K, V] or None (one-hot drafts), draft_tokens [K].
    The emitted tokens are draft_tokens[:n_accepted] followed by next_token.
    """
    return walk(target_probs, draft_probs, draft_tokens, TorchRandom(generator))


class _Enumerator:
    """A RandomSource that follows a script of branch choices and records the others."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.taken: list[int] = []
        self.prob = 1.0
        self.pending: list[list[int]] = []

    def _choose(self, options: list[float]) -> int:
        live = [j for j, w in enumerate(options) if w > 0.0]
        assert live, "a draw with no possible outcome"
        depth = len(self.taken)
        if depth < len(self.script):
            choice = self.script[depth]
        else:
            choice = live[0]
            self.pending.extend([*self.taken, j] for j in live[1:])
        self.taken.append(choice)
        self.prob *= options[choice]
        return choice

    def bernoulli(self, prob: float) -> bool:
        p = min(1.0, max(0.0, prob))
        return self._choose([p, 1.0 - p]) == 0

    def categorical(self, probs: np.ndarray) -> int:
        w = probs / float(probs.sum())
        return self._choose([float(v) for v in w])


def enumerate_outcomes(fn: Callable[[RandomSource], T]) -> dict[T, float]:
    """Exact distribution of ``fn``'s result over all branches of its random draws.

    ``fn`` must be deterministic given its draws and make finitely many of them.
    """
    out: dict[T, float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        src = _Enumerator(stack.pop())
        result = fn(src)
        out[result] += src.prob
        stack.extend(src.pending)
    return dict(out)


def exact_outcome_distribution(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor
) -> dict[tuple[int, int], float]:
    """Exact distribution of (n_accepted, next_token) of ``walk`` for fixed draft tokens."""
    return enumerate_outcomes(lambda rng: walk(target_probs, draft_probs, draft_tokens, rng))


def exact_round_distribution(
    target_probs: torch.Tensor, draft_probs: torch.Tensor
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the emitted token sequence of one round, drafts included.

    The drafts x_i are drawn from draft_probs [K, V] (as a model drafter does) and then
    verified against target_probs [K + 1, V]; the result maps each emitted sequence
    (accepted drafts + next token) to its probability. For a lossless walk, the first emitted
    token is distributed as target_probs[0], and, given that the first j tokens were accepted
    drafts, token j + 1 is distributed as target_probs[j].
    """
    k = draft_probs.shape[0]

    def one_round(rng: RandomSource) -> tuple[int, ...]:
        q = draft_probs.detach().cpu().numpy().astype(np.float64)  # [K, V]
        drafts = torch.tensor([rng.categorical(q[i]) for i in range(k)], dtype=torch.long)
        n, nxt = walk(target_probs, draft_probs, drafts, rng)
        return (*(int(t) for t in drafts[:n]), nxt)

    return enumerate_outcomes(one_round)
