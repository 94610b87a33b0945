"""Shared checkers for the accept/reject walk: exact and Monte Carlo.

Both are used by the tests of the real walk AND by tests that feed them deliberately broken
walks, which shows the checks can fail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
from scipy import stats

from specdec.core.rejection import RandomSource, TorchRandom, enumerate_outcomes
from specdec.core.sampling import make_generator

WalkFn = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, RandomSource], tuple[int, int]]


def random_case(
    gen: torch.Generator, vocab: int, k: int, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(p [K+1, V], q [K, V]) of a given kind."""

    def rows(n: int, scale: float = 1.5) -> torch.Tensor:
        return torch.softmax(scale * torch.randn(n, vocab, generator=gen), dim=-1)

    p = rows(k + 1)
    if kind == "dense":
        q = rows(k)
    elif kind == "equal":
        q = p[:k].clone()
    elif kind == "near_equal":
        q = p[:k] * (1 + 1e-7 * torch.randn(k, vocab, generator=gen))
        q = q / q.sum(-1, keepdim=True)
    elif kind == "disjoint":
        half = vocab // 2
        p[:, half:] = 0
        q = rows(k)
        q[:, :half] = 0
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    elif kind == "sparse_p":  # target truncated by top-k, draft dense
        p[:, : vocab // 2] = 0
        p = p / p.sum(-1, keepdim=True)
        q = rows(k)
    elif kind == "sparse_q":
        q = rows(k)
        q[:, : vocab // 2] = 0
        q = q / q.sum(-1, keepdim=True)
    elif kind == "peaked":
        p, q = rows(k + 1, 6.0), rows(k, 6.0)
    elif kind == "one_hot_both":  # greedy
        p = torch.nn.functional.one_hot(
            torch.randint(vocab, (k + 1,), generator=gen), vocab
        ).float()
        q = torch.nn.functional.one_hot(torch.randint(vocab, (k,), generator=gen), vocab).float()
    else:
        raise ValueError(kind)
    return p.float(), q.float()


def round_distribution(
    walk_fn: WalkFn, p: torch.Tensor, q: torch.Tensor | None, fixed_drafts: list[int] | None = None
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the emitted sequence of one round (drafts from q, or fixed)."""
    k = p.shape[0] - 1

    def one(rng: RandomSource) -> tuple[int, ...]:
        if fixed_drafts is not None:
            drafts = torch.tensor(fixed_drafts, dtype=torch.long)
        else:
            assert q is not None
            drafts = torch.tensor(
                [rng.categorical(q[i].double().numpy()) for i in range(k)], dtype=torch.long
            )
        n, nxt = walk_fn(p, q, drafts, rng)
        return (*(int(t) for t in drafts[:n]), nxt)

    return enumerate_outcomes(one)


def exact_deviation(dist: dict[tuple[int, ...], float], p: torch.Tensor) -> float:
    """Largest |P(prefix a, token j+1 = b) - P(prefix a continues) * p_{j+1}(b)| over all
    accepted-draft prefixes a of length j. Zero (to rounding) for a lossless walk."""
    pd = p.double().numpy()
    pd = pd / pd.sum(-1, keepdims=True)
    joint: dict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.zeros(pd.shape[1]))
    for seq, prob in dist.items():
        for j in range(len(seq)):
            joint[seq[:j]][seq[j]] += prob
    worst = abs(sum(dist.values()) - 1.0)
    for prefix, row in joint.items():
        worst = max(worst, float(np.abs(row - row.sum() * pd[len(prefix)]).max()))
    return worst


def monte_carlo_pvalues(
    walk_fn: WalkFn, p: torch.Tensor, q: torch.Tensor, trials: int, seed: int
) -> list[float]:
    """Goodness-of-fit p-values from `trials` independent rounds (drafts sampled from q):
    for each position j, the emitted token j + 1 (given tokens 1..j were accepted drafts)
    against p_{j+1}; valid because the rows here do not depend on the prefix. Positions
    reached fewer than 500 times are skipped."""
    k = q.shape[0]
    g = make_generator(seed)
    drafts = (
        torch.stack(
            [torch.multinomial(q[i], trials, replacement=True, generator=g) for i in range(k)],
            dim=1,
        )
        if k
        else torch.zeros(trials, 0)
    )
    rng = TorchRandom(g)
    counts = np.zeros((k + 1, p.shape[1]))  # counts[j, b]: token j + 1 was b
    for t in range(trials):
        n, nxt = walk_fn(p, q, drafts[t].long(), rng)
        for j, tok in enumerate([*drafts[t, :n].tolist(), nxt]):
            counts[j, tok] += 1
    return [gof_pvalue(counts[j], p[j]) for j in range(k + 1) if counts[j].sum() >= 500]


def gof_pvalue(counts: np.ndarray, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit; a count where the model says 0 gives p = 0."""
    pr = probs.double().numpy()
    pr = pr / pr.sum()
    if counts[pr == 0].sum() > 0:
        return 0.0
    nz = pr > 0
    if nz.sum() == 1:
        return 1.0
    return float(stats.chisquare(counts[nz], counts.sum() * pr[nz]).pvalue)
