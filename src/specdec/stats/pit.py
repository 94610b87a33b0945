"""The per-token test's transform: the randomised probability integral transform (PIT) of a
token against its reference row. No model code, no global random state: the auxiliary
uniforms come from an explicit ``torch.Generator`` (or are given, as the endpoint's are).

Randomised PIT (Rosenblatt 1952; Brockwell 2007). Let x_1, x_2, ... be the tokens of one
sequence and P_t = the reference's next-token distribution given x_<t (a row [V]). Order the
vocabulary by a key that depends only on x_<t (here: the ratio q_t / P_t of a draft row to the
reference row, or -P_t), let F_t(y-) be the reference mass of the tokens ordered before y, and
draw V_t ~ U(0, 1) independently of everything else. Then

    U_t = F_t(x_t-) + V_t * P_t(x_t)

is exactly U(0, 1) given x_<t when x_t ~ P_t, so U_1, U_2, ... of one sequence are i.i.d.
U(0, 1): each is uniform given everything before it (including the earlier U's). Whether a
U_t is observed at all (the sequence stopped at EOS or at its length) depends only on x_<t,
so stopping keeps the result, and independent sequences pool into one i.i.d. sample. Under an
alternative x_t ~ Q_t the density of U_t on the interval of token y is Q_t(y) / P_t(y), so
the TV distance of the U distribution from U(0, 1) is exactly TV(Q_t, P_t): a per-token TV
becomes a departure from uniformity of the same size. What a test of uniformity can see of it
depends on where in the order the excess mass sits (module ``docs/certify.md``): ordering by
q / P makes every mixture of the reference with the draft row a monotone density, which the
Anderson-Darling test detects well; an excess scattered finely over the order is invisible to
every test on U (and to every test with this sample size).

The U are tested for uniformity by ``uniformity``; the power against the stated alternatives
is in ``alternatives``. The endpoint's rows are coarsened (``top_n_pit``): its top-N tokens in
rank order, then one category for the rest of the vocabulary; the transform stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

PIT_CHUNK = 16  # rows per PIT computation (bounds memory at [16, V] float64 temporaries)


def order_keys(p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """Sort keys [T, V] (ascending; ties by token id) for the reference rows p [T, V].

    With draft rows q [T, V]: q / p (tokens the draft over-weights come last; a drift of the
    output toward the draft moves U toward 1). Without: -p (most probable tokens first).
    Tokens with p = 0 carry no mass, so their key does not matter (+inf)."""
    p64 = p.double()
    if q is None:
        return -p64
    ratio = q.double() / torch.where(p64 > 0, p64, torch.ones_like(p64))
    return torch.where(p64 > 0, ratio, torch.full_like(p64, math.inf))


def pit_values(
    p: torch.Tensor, tokens: torch.Tensor, v: torch.Tensor, keys: torch.Tensor
) -> np.ndarray:
    """U [T] for reference rows p [T, V], observed tokens [T] (int64), uniforms v [T] and sort
    keys [T, V] (``order_keys``). U is nan where p[t, x_t] == 0 (impossible under the
    reference)."""
    p64 = p.double()  # [T, V]
    x = tokens.long().view(-1, 1)  # [T, 1]
    px = p64.gather(1, x)  # [T, 1]
    kx = keys.gather(1, x)  # [T, 1]
    ids = torch.arange(p64.shape[1]).view(1, -1)  # [1, V]
    before = (keys < kx) | ((keys == kx) & (ids < x))  # [T, V]
    f_before = (p64 * before).sum(1)  # [T]
    u = f_before + v.double() * px.view(-1)  # [T]
    u = torch.clamp(u, 0.0, 1.0)
    u[px.view(-1) <= 0] = math.nan
    return u.numpy()


def draw_v(n: int, generator: torch.Generator) -> torch.Tensor:
    """The auxiliary uniforms V [n] (float64) from a generator used for nothing else."""
    return torch.rand(n, generator=generator, dtype=torch.float64)


def pit_in_chunks(
    p: torch.Tensor, tokens: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None
) -> list[float]:
    """``pit_values`` of reference rows p [T, V] (order: ``order_keys`` with draft rows q
    [T, V] or None), observed tokens [T] and uniforms v [T], PIT_CHUNK rows at a time."""
    out: list[float] = []
    for i in range(0, p.shape[0], PIT_CHUNK):
        sl = slice(i, i + PIT_CHUNK)
        keys = order_keys(p[sl], None if q is None else q[sl])  # [c, V]
        out.extend(float(x) for x in pit_values(p[sl], tokens[sl], v[sl], keys))
    return out


def top_n_pit(row: Mapping[int, tuple[float, int]], token: int, v: float, top: int) -> float:
    """U of ``token`` against a coarsened row: ``row`` maps token ids to (log-probability,
    rank); its tokens of rank 1..top come first in rank order (ties by id), then one
    category for the rest of the vocabulary (mass 1 - their sum). U = F(x-) + v p(x) for a
    token among them, S + v (1 - S) otherwise (S: their mass); nan for a token of
    probability 0 (impossible under the reference). ``row`` must hold ``token``."""
    ranked = sorted(
        ((rank, t, lp) for t, (lp, rank) in row.items() if 1 <= rank <= top),
        key=lambda x: (x[0], x[1]),
    )
    probs = [math.exp(lp) for _, _, lp in ranked]
    mass = min(1.0, sum(probs))
    p_x = math.exp(row[token][0])
    if p_x <= 0.0:
        return math.nan
    before = 0.0
    for (_, t, _), p in zip(ranked, probs, strict=True):
        if t == token:
            return min(1.0, before + v * p)
        before += p
    return min(1.0, mass + v * (1.0 - mass))  # outside the top N: the rest is one category
