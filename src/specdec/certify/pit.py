"""The per-token test's pure math: randomised probability integral transform (PIT), tests of
uniformity, and their power by simulation. No model code, no global random state: every
random draw takes an explicit ``torch.Generator`` or ``numpy.random.Generator``.

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

Uniformity is tested with Anderson-Darling (tails and shifts) and a binned chi-square (bumps),
each at alpha / 2 (family-wise alpha by Bonferroni).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats as sps

N_BINS = 20


# ------------------------------------------------------------------ the transform
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


# ------------------------------------------------------------------ tests of uniformity
def _adinf(z: np.ndarray) -> np.ndarray:
    """Asymptotic CDF of the Anderson-Darling statistic for a fully specified continuous
    distribution (Marsaglia & Marsaglia 2004, 'Evaluating the Anderson-Darling distribution',
    J. Stat. Softw. 9(2), function ADinf; absolute error < 2e-6)."""
    z = np.asarray(z, dtype=np.float64)
    out = np.zeros_like(z)
    small = (z > 0) & (z < 2)
    zs = z[small]
    out[small] = (np.exp(-1.2337141 / zs) / np.sqrt(zs)) * (
        2.00012
        + (0.247105 - (0.0649821 - (0.0347962 - (0.011672 - 0.00168691 * zs) * zs) * zs) * zs) * zs
    )
    big = z >= 2
    zb = z[big]
    out[big] = np.exp(
        -np.exp(
            1.0776
            - (2.30695 - (0.43424 - (0.082433 - (0.008056 - 0.0003146 * zb) * zb) * zb) * zb) * zb
        )
    )
    return np.clip(out, 0.0, 1.0)


def anderson_darling(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AD statistic and asymptotic p-value against U(0, 1) for samples u [..., n] (last axis;
    vectorised over leading axes). Returns (statistic [...], pvalue [...])."""
    s = np.sort(np.clip(u, 1e-300, 1 - 1e-16), axis=-1)  # [..., n]
    n = s.shape[-1]
    i = np.arange(1, n + 1, dtype=np.float64)  # [n]
    terms = (2 * i - 1) * (np.log(s) + np.log1p(-s[..., ::-1]))  # [..., n]
    a2 = -n - terms.sum(-1) / n  # [...]
    return a2, 1.0 - _adinf(a2)


def binned_chisquare(u: np.ndarray, bins: int = N_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Pearson chi-square of u [..., n] against U(0, 1) in ``bins`` equal bins (dof bins - 1).
    Returns (statistic [...], pvalue [...])."""
    n = u.shape[-1]
    idx = np.minimum((u * bins).astype(np.int64), bins - 1)  # [..., n]
    flat = idx.reshape(-1, n) + bins * np.arange(idx.reshape(-1, n).shape[0])[:, None]
    counts = np.bincount(flat.ravel(), minlength=bins * flat.shape[0]).reshape(-1, bins)
    e = n / bins
    stat = ((counts - e) ** 2 / e).sum(-1).reshape(u.shape[:-1])
    return stat, sps.chi2.sf(stat, bins - 1)


@dataclass(frozen=True)
class UniformityResult:
    """Tests of H0: the PIT values are i.i.d. U(0, 1), each at alpha / 2 (Bonferroni)."""

    n: int  # PIT values tested
    impossible: int  # tokens with reference probability 0 (reject outright)
    ad_statistic: float
    ad_pvalue: float
    chi2_statistic: float
    chi2_pvalue: float
    bins: int
    alpha: float
    ks_statistic: float  # sup |F_n(u) - u|: a lower bound on the U distribution's TV
    tv_lower: float  # one-sided (1 - alpha) lower confidence bound on that TV (DKW)

    @property
    def pvalue(self) -> float:
        """Bonferroni-combined p-value of the two tests (0 with an impossible token)."""
        if self.impossible:
            return 0.0
        return min(1.0, 2 * min(self.ad_pvalue, self.chi2_pvalue))

    @property
    def rejected(self) -> bool:
        return not self.pvalue > self.alpha  # a NaN p-value is rejected, never passed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(pvalue=self.pvalue, rejected=self.rejected)
        return d


def uniformity_test(u: np.ndarray, alpha: float, bins: int = N_BINS) -> UniformityResult:
    """Test PIT values u [n] (nan = impossible token) for uniformity at family-wise alpha."""
    u = np.asarray(u, dtype=np.float64)
    bad = int(np.isnan(u).sum())
    ok = u[~np.isnan(u)]
    n = int(ok.shape[0])
    if n == 0:
        return UniformityResult(0, bad, 0.0, 1.0, 0.0, 1.0, bins, alpha, 0.0, 0.0)
    a2, pa = anderson_darling(ok)
    c2, pc = binned_chisquare(ok, bins)
    s = np.sort(ok)
    i = np.arange(1, n + 1)
    ks = float(max((i / n - s).max(), (s - (i - 1) / n).max()))
    # DKW: P(sup |F_n - F| > e) <= 2 exp(-2 n e^2); TV(F, U) >= sup |F - U| >= ks - e
    e = math.sqrt(math.log(2 / alpha) / (2 * n))
    return UniformityResult(
        n, bad, float(a2), float(pa), float(c2), float(pc), bins, alpha, ks, max(0.0, ks - e)
    )


def reject_many(u: np.ndarray, alpha: float, bins: int = N_BINS) -> np.ndarray:
    """The decision of ``uniformity_test`` for each row of u [trials, n] (bool [trials])."""
    _, pa = anderson_darling(u)
    _, pc = binned_chisquare(u, bins)
    return np.minimum(1.0, 2 * np.minimum(pa, pc)) <= alpha


# ------------------------------------------------------------------ alternatives and power
@dataclass(frozen=True)
class Alternative:
    """A density on [0, 1] that is constant on each piece [breaks[i], breaks[i+1]): the
    distribution of U under some per-token alternative. ``shape(tv)`` gives the heights."""

    name: str
    description: str
    breaks: tuple[float, ...]  # 0 = b_0 < ... < b_k = 1
    direction: tuple[float, ...]  # [k]: height = 1 + tv * direction (integrates to 0)

    def heights(self, tv: float) -> np.ndarray:
        h = 1.0 + tv * np.asarray(self.direction)
        if (h < -1e-12).any():
            raise ValueError(f"{self.name}: TV {tv} is too large for this shape")
        return np.maximum(h, 0.0)

    def sample(self, tv: float, base: np.ndarray) -> np.ndarray:
        """Samples [...] from the density at this TV by inverting its CDF at uniforms base."""
        b = np.asarray(self.breaks)  # [k+1]
        h = self.heights(tv)  # [k]
        cdf = np.concatenate([[0.0], np.cumsum(h * np.diff(b))])  # [k+1]
        cdf /= cdf[-1]
        j = np.clip(np.searchsorted(cdf, base, side="right") - 1, 0, h.shape[0] - 1)
        return b[j] + (base - cdf[j]) / np.where(h[j] > 0, h[j] / cdf[-1], np.inf)


def _two_piece(name: str, description: str, w: float, start: float = 0.0) -> Alternative:
    """Mass tv moved into [start, start + w) from the rest, evenly: TV exactly tv."""
    lo, hi = start, start + w
    breaks = sorted({0.0, lo, hi, 1.0})
    direction = []
    for a, b in itertools.pairwise(breaks):
        direction.append(1.0 / w if (a >= lo and b <= hi) else -1.0 / (1.0 - w))
    return Alternative(name, description, tuple(breaks), tuple(direction))


def draft_mixture(vocab: int, seed: int) -> Alternative:
    """Q = (1 - e) P + e D for a Zipf-like reference row P and an unrelated Zipf-like row D
    (both over ``vocab`` tokens, a fixed random permutation each), in the q / P order the
    certificate uses: the U density is (1 - e) + e D(y) / P(y) on token y's interval, an
    increasing staircase. Returned normalised so that ``heights(tv)`` has TV = tv."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = rng.permutation(1.0 / ranks**1.1)
    d = rng.permutation(1.0 / ranks**1.1)
    p, d = p / p.sum(), d / d.sum()
    order = np.argsort(d / p, kind="stable")  # ascending q / P
    ps, ds = p[order], d[order]
    breaks = np.concatenate([[0.0], np.cumsum(ps)])  # [V+1]
    breaks[-1] = 1.0
    tv_d = 0.5 * float(np.abs(ds - ps).sum())
    # height at mixture weight e: 1 + e (D/P - 1), TV = e tv_d; per unit of TV: (D/P - 1)/tv_d
    direction = (ds / ps - 1.0) / tv_d  # [V]
    return Alternative(
        "draft-mixture",
        f"output = (1 - e) target + e draft (Zipf rows, V = {vocab}): the shape of a walk that "
        "leaks draft probability (residual or acceptance errors)",
        tuple(float(x) for x in breaks),
        tuple(float(x) for x in direction),
    )


def alternatives() -> list[Alternative]:
    """The alternatives whose power the certificate states (fixed before any data)."""
    return [
        draft_mixture(2000, seed=0),
        _two_piece(
            "shift-half", "mass moved from one half of the order to the other (a shift)", 0.5
        ),
        _two_piece(
            "tail-5%", "mass moved into the first 5 % of the order (e.g. over-sharpening)", 0.05
        ),
        _two_piece(
            "bump-10%", "mass moved into the middle 10 % of the order (a local bump)", 0.1, 0.45
        ),
    ]


def simulated_power(
    alt: Alternative,
    tv: float,
    n: int,
    alpha: float,
    trials: int,
    rng: np.random.Generator,
    bins: int = N_BINS,
) -> float:
    """Fraction of ``trials`` simulated samples of n PIT values under ``alt`` at this TV that
    the uniformity test rejects at alpha."""
    base = rng.random((trials, n))  # [trials, n]
    return float(reject_many(alt.sample(tv, base), alpha, bins).mean())


def min_detectable_tv(
    alt: Alternative,
    n: int,
    alpha: float,
    power: float,
    trials: int,
    seed: int,
    bins: int = N_BINS,
    tv_max: float = 0.5,
) -> float:
    """Smallest TV (to within 2 %) at which the test on n PIT values rejects ``alt`` with
    probability >= power, by simulation with common random numbers (the same base uniforms at
    every TV, so the estimated power is monotone in TV). nan if not reached by tv_max."""
    if n <= 0:
        return math.nan
    base = np.random.default_rng(seed).random((trials, n))  # [trials, n]

    def pw(tv: float) -> float:
        return float(reject_many(alt.sample(tv, base), alpha, bins).mean())

    if pw(tv_max) < power:
        return math.nan
    lo, hi = 0.0, tv_max
    while hi - lo > 0.02 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if pw(mid) >= power else (mid, hi)
    return hi


@dataclass(frozen=True)
class PowerRow:
    alternative: str
    description: str
    min_detectable_tv: float


def power_table(
    n: int, alpha: float, power: float, trials: int, seed: int, bins: int = N_BINS
) -> list[PowerRow]:
    """The smallest per-token TV detected with ``power`` for each stated alternative."""
    return [
        PowerRow(a.name, a.description, min_detectable_tv(a, n, alpha, power, trials, seed, bins))
        for a in alternatives()
    ]


def sequence_mean_interval(
    values: Sequence[float], confidence: float
) -> tuple[float, float, float]:
    """Mean of per-sequence values (independent units) and its two-sided Student-t interval
    (mean, low, high); (nan, nan, nan) for no data, (m, nan, nan) for one value: one
    sequence gives no interval, and its value is not a bound on the mean (taking it as one
    let a single sequence below a threshold pass a rule stated for the upper 95 % bound)."""
    x = np.asarray(values, dtype=np.float64)
    if x.shape[0] == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.shape[0] == 1:
        return m, math.nan, math.nan
    half = float(sps.t.ppf(0.5 + confidence / 2, x.shape[0] - 1) * x.std(ddof=1)) / math.sqrt(
        x.shape[0]
    )
    return m, max(0.0, m - half), min(1.0, m + half)
