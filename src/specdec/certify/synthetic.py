"""Level 1: the accept/reject walk itself, on many random and adversarial (p, q) pairs.

Claim checked: for one verification round, whatever the draft rows q and the drafts, the
emitted tokens are distributed as if sampled from the target one at a time, i.e. for every
prefix a of j accepted drafts, P(prefix a, token j + 1 = b) = P(prefix a) * p_{j+1}(b).

- Exact part (small vocabularies): the exact output distribution OF THE IMPLEMENTATION,
  obtained by running the very same walk code on an enumerating random source
  (``specdec.core.rejection.enumerate_outcomes``); reported: the largest deviation from the claim
  and the mass-weighted TV between each conditional next-token row and p. Threshold: 1e-6
  (float32 inputs, float64 arithmetic).
- Monte Carlo part (larger vocabularies): independent rounds (the unit), and for each
  position j the emitted token j + 1 (given tokens 1..j were accepted drafts) against
  p_{j+1} with a chi-square goodness-of-fit test; Holm over all tests at family-wise alpha;
  TV with a distribution-free CI and the smallest TV each test detects with 80 % power.

Case kinds: dense, equal (p == q), near_equal, disjoint supports, sparse_p (top-k and top-p
truncated target), sparse_q, peaked, one_hot_p (greedy target), one_hot_both (greedy) and
one_hot_q (drafters without probabilities such as n-gram lookup: q is None and the drafts are
fixed tokens, every tuple checked in the exact part).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from specdec.core import rejection
from specdec.core.rejection import RandomSource, TorchRandom, enumerate_outcomes
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.stats.chisquare import chisquare_gof
from specdec.stats.family import TestRecord, apply_holm
from specdec.stats.thresholds import ALPHA, EXACT_TOL, POWER

from .common import FAIL, PASS, fmt
from .common import worst as worst_of
from .progress import ProgressLog
from .seeds import SeedPlan

WalkFn = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, RandomSource], tuple[int, int]]

KINDS: tuple[str, ...] = (
    "dense",
    "equal",
    "near_equal",
    "disjoint",
    "sparse_p_topk",
    "sparse_p_topp",
    "sparse_q",
    "peaked",
    "one_hot_p",
    "one_hot_both",
    "one_hot_q",
)


def default_walk(
    p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor, rng: RandomSource
) -> tuple[int, int]:
    """``specdec.core.rejection.walk``, looked up at call time (so injected faults apply)."""
    return rejection.walk(p, q, drafts, rng)


@dataclass(frozen=True)
class WalkCase:
    """One round's inputs: p [K+1, V], q [K, V] (None: one-hot drafts, fixed tokens)."""

    name: str
    kind: str
    k: int
    vocab: int
    p: torch.Tensor
    q: torch.Tensor | None


def make_case(gen: torch.Generator, vocab: int, k: int, kind: str, name: str) -> WalkCase:
    """A random (p, q) pair of the given kind (see the module docstring)."""

    def logits(n: int, scale: float = 1.5) -> torch.Tensor:
        return scale * torch.randn(n, vocab, generator=gen)  # [n, V]

    t1 = SamplingConfig(temperature=1.0)
    p = logits_to_probs(logits(k + 1), t1)  # [K+1, V]
    q: torch.Tensor | None = logits_to_probs(logits(k), t1) if k else torch.zeros(0, vocab)
    if kind == "dense":
        pass
    elif kind == "equal":
        q = p[:k].clone()
    elif kind == "near_equal":
        q = p[:k] * (1 + 1e-7 * torch.randn(k, vocab, generator=gen))
        q = q / q.sum(-1, keepdim=True)
    elif kind == "disjoint":
        half = vocab // 2
        p[:, half:] = 0
        p = p / p.sum(-1, keepdim=True)
        assert q is not None
        q[:, :half] = 0
        q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    elif kind == "sparse_p_topk":
        p = logits_to_probs(logits(k + 1), SamplingConfig(1.0, top_k=max(1, vocab // 3)))
    elif kind == "sparse_p_topp":
        p = logits_to_probs(logits(k + 1, 3.0), SamplingConfig(1.0, top_p=0.7))
    elif kind == "sparse_q":
        q = logits_to_probs(logits(k), SamplingConfig(1.0, top_k=max(1, vocab // 3)))
    elif kind == "peaked":
        p = logits_to_probs(logits(k + 1, 6.0), t1)
        q = logits_to_probs(logits(k, 6.0), t1)
    elif kind == "one_hot_p":
        p = logits_to_probs(logits(k + 1), SamplingConfig())
    elif kind == "one_hot_both":
        p = logits_to_probs(logits(k + 1), SamplingConfig())
        q = logits_to_probs(logits(k), SamplingConfig())
    elif kind == "one_hot_q":
        q = None
    else:
        raise ValueError(f"unknown case kind {kind!r}")
    return WalkCase(name, kind, k, vocab, p.float(), None if q is None else q.float())


# ------------------------------------------------------------------ exact
def round_outcomes(
    walk_fn: WalkFn, case: WalkCase, fixed_drafts: tuple[int, ...] | None = None
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the emitted token sequence (accepted drafts + next token) of
    one round; drafts drawn from q, or the given fixed drafts (one-hot q)."""
    k = case.k

    def one(rng: RandomSource) -> tuple[int, ...]:
        if fixed_drafts is not None:
            drafts = torch.tensor(fixed_drafts, dtype=torch.long)
        else:
            assert case.q is not None
            qd = case.q.double().numpy()  # [K, V]
            drafts = torch.tensor([rng.categorical(qd[i]) for i in range(k)], dtype=torch.long)
        n, nxt = walk_fn(case.p, case.q, drafts, rng)
        return (*(int(t) for t in drafts[:n]), nxt)

    return enumerate_outcomes(one)


def conditional_deviation(
    dist: Mapping[tuple[int, ...], float], p: np.ndarray
) -> tuple[float, float]:
    """(max deviation, mass-weighted TV) of an exact round distribution from the claim.

    dist maps emitted sequences to probabilities; p [K+1, V]. For every accepted-draft prefix
    a of length j with mass w_a, the joint row P(a, b) is compared with w_a * p_{j+1}(b).
    """
    pd = p / p.sum(-1, keepdims=True)  # [K+1, V]
    joint: dict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.zeros(pd.shape[1]))
    for seq, prob in dist.items():
        for j in range(len(seq)):
            joint[seq[:j]][seq[j]] += prob
    deviations = [abs(sum(dist.values()) - 1.0)]
    wtv = 0.0
    for prefix, row in joint.items():
        mass = float(row.sum())
        target = mass * pd[len(prefix)]
        deviations.append(float(np.abs(row - target).max()))
        wtv += 0.5 * float(np.abs(row - target).sum())
    return worst_of(deviations), wtv  # NaN anywhere: NaN, which no tolerance passes


@dataclass
class ExactCaseResult:
    name: str
    kind: str
    k: int
    vocab: int
    draft_tuples: int  # 1 (drafts sampled from q) or the number of fixed tuples checked
    outcomes: int  # distinct emitted sequences
    max_deviation: float
    weighted_tv: float
    passed: bool


def exact_case(
    walk_fn: WalkFn, case: WalkCase, tol: float, max_fixed: int, rng: np.random.Generator
) -> ExactCaseResult:
    """Exact check of one case (all fixed draft tuples, or a sample of max_fixed drawn with
    ``rng``)."""
    p = case.p.double().numpy()
    if case.q is not None:
        dist = round_outcomes(walk_fn, case)
        worst, wtv = conditional_deviation(dist, p)
        tuples, outcomes = 1, len(dist)
    else:
        all_tuples = list(itertools.product(range(case.vocab), repeat=case.k))
        if len(all_tuples) > max_fixed:
            pick = rng.choice(len(all_tuples), size=max_fixed, replace=False)
            all_tuples = [all_tuples[i] for i in sorted(pick)]
        worst, wtv, outcomes = 0.0, 0.0, 0
        for drafts in all_tuples:
            dist = round_outcomes(walk_fn, case, drafts)
            w, t = conditional_deviation(dist, p)
            worst, wtv, outcomes = worst_of([worst, w]), worst_of([wtv, t]), outcomes + len(dist)
        tuples = len(all_tuples)
    return ExactCaseResult(
        case.name, case.kind, case.k, case.vocab, tuples, outcomes, worst, wtv, worst <= tol
    )


# ------------------------------------------------------------------ Monte Carlo
def position_counts(walk_fn: WalkFn, case: WalkCase, trials: int, seeds: SeedPlan) -> np.ndarray:
    """counts [K+1, V]: counts[j, b] = rounds whose token j + 1 was b (reached only when
    tokens 1..j were accepted drafts). Rounds are independent; drafts are drawn from q (or
    uniformly, for one-hot drafts) with their own generator (``seeds``: the case's plan)."""
    k, vocab = case.k, case.vocab
    g_draft = seeds.generator("drafts")
    g_walk = seeds.generator("walk")
    if k == 0:
        drafts = torch.zeros(trials, 0, dtype=torch.long)
    elif case.q is None:
        drafts = torch.randint(vocab, (trials, k), generator=g_draft)
    else:
        drafts = torch.stack(
            [
                torch.multinomial(case.q[i], trials, replacement=True, generator=g_draft)
                for i in range(k)
            ],
            dim=1,
        )  # [trials, K]
    rng = TorchRandom(g_walk)
    counts = np.zeros((k + 1, vocab), dtype=np.int64)
    for t in range(trials):
        n, nxt = walk_fn(case.p, case.q, drafts[t], rng)
        for j, tok in enumerate([*drafts[t, :n].tolist(), nxt]):
            counts[j, tok] += 1
    return counts


def mc_case_tests(
    walk_fn: WalkFn, case: WalkCase, trials: int, min_count: int, seeds: SeedPlan
) -> list[TestRecord]:
    """Goodness-of-fit tests of one case (positions reached at least min_count times)."""
    counts = position_counts(walk_fn, case, trials, seeds)
    out = []
    for j in range(case.k + 1):
        if counts[j].sum() >= min_count:
            res = chisquare_gof(counts[j], case.p[j].double().numpy())
            out.append(TestRecord.from_test(f"{case.name}/pos{j + 1}", res))
    return out


# ------------------------------------------------------------------ level
@dataclass(frozen=True)
class Level1Config:
    """Sizes of Level 1. Cases: cases_per_cell random cases for every (kind, K)."""

    kinds: tuple[str, ...] = KINDS
    ks: tuple[int, ...] = (0, 1, 2, 3, 4)
    exact_vocab: int = 5
    exact_cases_per_cell: int = 1
    max_fixed_drafts: int = 256
    exact_tol: float = EXACT_TOL
    mc_vocabs: tuple[int, ...] = (64,)
    mc_cases_per_cell: int = 1
    mc_trials: int = 4000
    mc_min_count: int = 100
    alpha: float = ALPHA
    power: float = POWER
    seed: int = 0


@dataclass
class Level1Result:
    config: Level1Config
    exact: list[ExactCaseResult] = field(default_factory=list)
    tests: list[TestRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def max_deviation(self) -> float:
        return max((c.max_deviation for c in self.exact), default=0.0)

    @property
    def n_rejected(self) -> int:
        return sum(t.rejected for t in self.tests)

    @property
    def status(self) -> str:
        ok = all(c.passed for c in self.exact) and self.n_rejected == 0
        return PASS if ok else FAIL

    def summary(self) -> dict[str, Any]:
        mdt = [t.min_detectable_tv for t in self.tests if np.isfinite(t.min_detectable_tv)]
        pos1 = [t for t in self.tests if t.unit.endswith("/pos1")]
        pos1_tv = [t.tv for t in pos1]
        return {
            "status": self.status,
            "exact_cases": len(self.exact),
            "exact_failed": sum(not c.passed for c in self.exact),
            "exact_max_deviation": self.max_deviation,
            "exact_tolerance": self.config.exact_tol,
            "mc_cases": len({t.unit.rsplit("/", 1)[0] for t in self.tests}),
            "mc_tests": len(self.tests),
            "mc_trials_per_case": self.config.mc_trials,
            "mc_rejected": self.n_rejected,
            "mc_min_p": min((t.pvalue for t in self.tests), default=1.0),
            # position 1 is reached by every round: the best-powered test of each case
            "mc_pos1_max_tv": max(pos1_tv, default=0.0),
            "mc_pos1_max_tv_upper": max((t.tv_high for t in pos1), default=0.0),
            "mc_min_detectable_tv_median": float(np.median(mdt)) if mdt else float("nan"),
            "mc_min_detectable_tv_max": max(mdt) if mdt else float("nan"),
            "alpha": self.config.alpha,
            "seconds": self.seconds,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "config": asdict(self.config),
            "exact": [asdict(c) for c in self.exact],
            "tests": [t.to_dict() for t in self.tests],
        }

    def shown(self) -> list[str]:
        s = self.summary()
        worst = [c for c in self.exact if not c.passed]
        lines = [
            f"Exact output distribution of the walk implementation on {s['exact_cases']} cases "
            f"({len(self.config.kinds)} kinds, K = {min(self.config.ks)}..{max(self.config.ks)}"
            f", V = {self.config.exact_vocab}): max deviation {s['exact_max_deviation']:.2g} "
            f"(tolerance {self.config.exact_tol:g})"
            + (f"; FAILED on {', '.join(c.name for c in worst[:5])}" if worst else "."),
            f"Monte Carlo: {s['mc_tests']} goodness-of-fit tests on {s['mc_cases']} cases "
            f"(V = {', '.join(map(str, self.config.mc_vocabs))}, {self.config.mc_trials} "
            f"independent rounds each), Holm at alpha {self.config.alpha:g}: "
            f"{s['mc_rejected']} rejected (min p {fmt(s['mc_min_p'])}); at the first "
            f"position (every round) the largest TV estimate is {fmt(s['mc_pos1_max_tv'])}, "
            f"95 % upper bound {fmt(s['mc_pos1_max_tv_upper'])}; each test detects a "
            "TV on its pooled categories >= "
            f"{fmt(s['mc_min_detectable_tv_median'])} (median; worst "
            f"{fmt(s['mc_min_detectable_tv_max'])}) with 80 % power.",
        ]
        return lines


def run_level1(
    cfg: Level1Config, *, walk_fn: WalkFn = default_walk, log: ProgressLog | None = None
) -> Level1Result:
    """Run the exact and Monte Carlo checks of the walk (``walk_fn``: the walk under test)."""
    t0 = time.perf_counter()
    res = Level1Result(cfg)
    log = ProgressLog.memory() if log is None else log
    seeds = SeedPlan(cfg.seed)
    gen = seeds.generator("level1-exact")
    for kind in cfg.kinds:
        for k in cfg.ks:
            for i in range(cfg.exact_cases_per_cell):
                name = f"{kind}-V{cfg.exact_vocab}-K{k}-{i}"
                case = make_case(gen, cfg.exact_vocab, k, kind, name)  # always drawn: stable
                key = f"l1/exact/{name}"
                res.exact.append(
                    log.unit(
                        key,
                        partial(
                            exact_case,
                            walk_fn,
                            case,
                            cfg.exact_tol,
                            cfg.max_fixed_drafts,
                            seeds.rng(key),
                        ),
                        ExactCaseResult,
                    )
                )
    raw: list[TestRecord] = []
    gen = seeds.generator("level1-mc")
    for vocab in cfg.mc_vocabs:
        for kind in cfg.kinds:
            for k in cfg.ks:
                for i in range(cfg.mc_cases_per_cell):
                    name = f"{kind}-V{vocab}-K{k}-{i}"
                    case = make_case(gen, vocab, k, kind, name)
                    key = f"l1/mc/{name}"
                    raw.extend(
                        log.units(
                            key,
                            partial(
                                mc_case_tests,
                                walk_fn,
                                case,
                                cfg.mc_trials,
                                cfg.mc_min_count,
                                seeds.child(key),
                            ),
                            TestRecord,
                        )
                    )
    res.tests = apply_holm(raw, cfg.alpha, cfg.power)
    res.seconds = time.perf_counter() - t0
    return res
