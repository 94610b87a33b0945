"""Level 2: the whole decoding loop on mock models whose distributions are known exactly.

- Greedy: speculative output must be bit-identical to plain output AND to a reference greedy
  path computed directly from the mock's logits (``MockLM.greedy_continuation``, independent
  of the loop),
  for many mock pairs (identical / close / far drafts, two vocabularies), prompts, K and both
  drafters (model, n-gram). Threshold: zero mismatches.
- Sampled: for each configuration (pair, K, drafter, sampling transform) N independent
  sequences, one seed each (the unit); the tokens in a window of positions are one
  categorical variable whose exact distribution comes from the mock (a forward pass over the
  mock's finite context windows, applying the same sampling transform). Chi-square goodness
  of fit per (configuration, window), Holm over all of them at family-wise alpha, TV with a
  distribution-free CI and the smallest TV detectable with 80 % power. One setup uses a
  padded pair (the draft's vocabulary 2 ids smaller than the target's).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from specdec.mock_runs import SampledSetup, greedy_runs, setup_windows
from specdec.stats.chisquare import chisquare_gof
from specdec.stats.family import TestRecord, apply_holm
from specdec.stats.thresholds import ALPHA, POWER

from .common import FAIL, PASS, first_difference, fmt
from .progress import ProgressLog
from .seeds import SeedPlan

# ------------------------------------------------------------------ configuration
# (a setup is run by ``mock_runs.setup_windows``)
DEFAULT_SETUPS: tuple[SampledSetup, ...] = (
    SampledSetup("plain-K0", "close", 0),
    SampledSetup("close-K1", "close", 1),
    SampledSetup("close-K4", "close", 4),
    SampledSetup("far-K4", "far", 4),
    SampledSetup("identical-K4", "identical", 4),
    SampledSetup("close-K4-T0.8-topk5-topp0.9", "close", 4, temperature=0.8, top_k=5, top_p=0.9),
    SampledSetup("ngram-K3", "close", 3, drafter="ngram"),
    SampledSetup("planned-K8", "close", 8, drafter="planned"),
    SampledSetup("padded-close-K4", "close", 4, draft_vocab_delta=-2),
    SampledSetup("prediction-K8", "close", 8, drafter="prediction"),
    SampledSetup("prediction-wrong-K8", "close", 8, drafter="prediction-wrong"),
    SampledSetup("prediction-shifted-K8", "close", 8, drafter="prediction-shifted"),
)


@dataclass(frozen=True)
class Level2Config:
    greedy_closeness: tuple[str, ...] = ("identical", "close", "far")
    greedy_vocabs: tuple[int, ...] = (16, 64)
    greedy_prompts: int = 6
    greedy_ks: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    greedy_drafters: tuple[str, ...] = (
        "model",
        "ngram",
        "planned",
        "prediction",
        "prediction-wrong",
        "prediction-shifted",
        "prediction-foreign",
    )
    greedy_max_new_tokens: int = 24
    sampled_vocab: int = 8
    setups: tuple[SampledSetup, ...] = DEFAULT_SETUPS
    windows: tuple[tuple[int, int], ...] = ((1, 2), (6, 1))  # (start position, length)
    sequences: int = 1500
    alpha: float = ALPHA
    power: float = POWER
    seed: int = 0


def mock_prompts(g: torch.Generator, n: int, vocab: int) -> list[list[int]]:
    """n prompts drawn with ``g``: random tokens (lengths 1..12) and repetitive ones (so n-gram
    lookup drafts)."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            length = 1 + int(torch.randint(12, (), generator=g))
            out.append([int(t) for t in torch.randint(3, vocab, (length,), generator=g)])
        else:
            motif = [int(t) for t in torch.randint(3, vocab, (3,), generator=g)]
            out.append(motif * 3)
    return out


# the foreign predictions' stream (``mock_runs.PREDICTIONS``): fixed, not the run's --seed
FOREIGN = SeedPlan(0)


def foreign_seed(prompt: list[int]) -> int:
    """The seed of ``prompt``'s foreign prediction (the same in every run)."""
    return FOREIGN.seed("l2-foreign", *prompt)


# ------------------------------------------------------------------ results
@dataclass
class GreedyUnit:
    unit: str
    match_plain: bool
    match_reference: bool
    first_divergence: int | None  # index into the generated tokens, None when identical


def mismatches(greedy: list[GreedyUnit]) -> list[GreedyUnit]:
    """The greedy runs that differ from plain decoding or from the reference path."""
    return [u for u in greedy if not (u.match_plain and u.match_reference)]


def loop_status(greedy: list[GreedyUnit], tests: list[TestRecord]) -> str:
    """PASS when no greedy run differs and no sampled test rejects (level 2, constrained)."""
    return PASS if not mismatches(greedy) and not any(t.rejected for t in tests) else FAIL


def loop_figures(
    greedy: list[GreedyUnit], tests: list[TestRecord], sequences: int
) -> dict[str, Any]:
    """The summary figures of a loop-on-mocks level (level 2, constrained): greedy counts and
    the sampled tests' extremes."""
    mdt = [t.min_detectable_tv for t in tests if np.isfinite(t.min_detectable_tv)]
    return {
        "greedy_units": len(greedy),
        "greedy_mismatches": len(mismatches(greedy)),
        "sampled_tests": len(tests),
        "sequences_per_setup": sequences,
        "sampled_rejected": sum(t.rejected for t in tests),
        "sampled_min_p": min((t.pvalue for t in tests), default=1.0),
        "sampled_max_tv": max((t.tv for t in tests), default=0.0),
        "sampled_max_tv_upper": max((t.tv_high for t in tests), default=0.0),
        "min_detectable_tv_max": max(mdt) if mdt else float("nan"),
    }


@dataclass
class Level2Result:
    config: Level2Config
    greedy: list[GreedyUnit] = field(default_factory=list)
    tests: list[TestRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def greedy_mismatches(self) -> list[GreedyUnit]:
        return mismatches(self.greedy)

    @property
    def status(self) -> str:
        return loop_status(self.greedy, self.tests)

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            **loop_figures(self.greedy, self.tests, self.config.sequences),
            "alpha": self.config.alpha,
            "seconds": self.seconds,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "config": asdict(self.config),
            "greedy_mismatches": [asdict(u) for u in self.greedy_mismatches[:50]],
            "tests": [t.to_dict() for t in self.tests],
        }

    def shown(self) -> list[str]:
        s = self.summary()
        c = self.config
        bad = self.greedy_mismatches
        return [
            f"Greedy on mock models: {s['greedy_units'] - len(bad)}/{s['greedy_units']} runs "
            f"bit-identical to plain decoding and to the exact reference path "
            f"({len(c.greedy_closeness)} draft closenesses x {len(c.greedy_vocabs)} "
            f"vocabularies x {c.greedy_prompts} prompts x K in {list(c.greedy_ks)} x drafters "
            f"{list(c.greedy_drafters)}, {c.greedy_max_new_tokens} tokens)"
            + (f"; first mismatch: {bad[0].unit}" if bad else "."),
            f"Sampled on mock models: {s['sampled_tests']} goodness-of-fit tests "
            f"({len(c.setups)} setups x windows {list(c.windows)}, {c.sequences} independent "
            f"sequences each, one seed per sequence) against the exactly computed distribution;"
            f" Holm at alpha {c.alpha:g}: {s['sampled_rejected']} rejected (min p "
            f"{fmt(s['sampled_min_p'])}); largest TV estimate {fmt(s['sampled_max_tv'])} "
            f"(95 % upper bound {fmt(s['sampled_max_tv_upper'])}); every test detects a TV on "
            f"its pooled categories >= {fmt(s['min_detectable_tv_max'])} with 80 % power.",
        ]


# ------------------------------------------------------------------ running
# The model work of each unit is done below, in ``mock_runs`` (``greedy_runs``,
# ``setup_windows``), and gives plain token lists and counts; the checks and statistics are
# made here on those.


def greedy_units(
    name: str, ref: list[int], plain: list[int], spec: dict[tuple[str, int], list[int]]
) -> list[GreedyUnit]:
    """One unit per speculative output: bit-identical to plain decoding and to the reference?"""
    return [
        GreedyUnit(
            f"{name}/{kind}/K{k}", tokens == plain, tokens == ref, first_difference(tokens, ref)
        )
        for (kind, k), tokens in spec.items()
    ]


def greedy_batch(
    cfg: Level2Config, closeness: str, vocab: int, prompts: list[list[int]], seeds: SeedPlan
) -> list[GreedyUnit]:
    """The greedy units of one (closeness, vocabulary) pair over ``prompts``."""
    runs = greedy_runs(
        closeness,
        vocab,
        seeds.base,
        prompts,
        [foreign_seed(p) for p in prompts],
        cfg.greedy_max_new_tokens,
        cfg.greedy_drafters,
        cfg.greedy_ks,
    )
    return [
        unit
        for pi, outputs in enumerate(runs)
        for unit in greedy_units(f"{closeness}-V{vocab}/prompt{pi}", *outputs)
    ]


def run_greedy(cfg: Level2Config, seeds: SeedPlan, log: ProgressLog) -> list[GreedyUnit]:
    units: list[GreedyUnit] = []
    for vocab in cfg.greedy_vocabs:
        prompts = mock_prompts(seeds.generator("l2-prompts", vocab), cfg.greedy_prompts, vocab)
        for closeness in cfg.greedy_closeness:
            key = f"l2/greedy/{closeness}-V{vocab}"
            compute = partial(greedy_batch, cfg, closeness, vocab, prompts, seeds)
            units.extend(log.units(key, compute, GreedyUnit))
    return units


def sampled_records(
    cfg: Level2Config, setup: SampledSetup, prompt: list[int], seeds: SeedPlan
) -> list[TestRecord]:
    """The goodness-of-fit tests of one sampled setup, one per window (before Holm)."""
    found = setup_windows(
        setup,
        prompt,
        cfg.sampled_vocab,
        cfg.windows,
        seeds.base,
        [seeds.seed("l2", setup.name, i) for i in range(cfg.sequences)],
        foreign_seed(prompt),
    )
    return [
        TestRecord.from_test(f"{setup.name}/pos{s}+{m}", chisquare_gof(counts, exact))
        for (s, m), counts, exact in found
    ]


def run_sampled(cfg: Level2Config, seeds: SeedPlan, log: ProgressLog) -> list[TestRecord]:
    """Goodness-of-fit tests of every sampled setup (before Holm)."""
    prompts = mock_prompts(seeds.generator("l2-sampled-prompt"), 2, cfg.sampled_vocab)
    raw: list[TestRecord] = []
    for si, setup in enumerate(cfg.setups):
        compute = partial(sampled_records, cfg, setup, prompts[si % 2], seeds)
        raw.extend(log.units(f"l2/sampled/{setup.name}", compute, TestRecord))
    return raw


def run_level2(cfg: Level2Config, *, log: ProgressLog | None = None) -> Level2Result:
    """Greedy bit-exactness and sampled goodness of fit of the decoding loop on mocks."""
    t0 = time.perf_counter()
    res = Level2Result(cfg)
    log = ProgressLog.memory() if log is None else log
    seeds = SeedPlan(cfg.seed)
    res.greedy = run_greedy(cfg, seeds, log)
    res.tests = apply_holm(run_sampled(cfg, seeds, log), cfg.alpha, cfg.power)
    res.seconds = time.perf_counter() - t0
    return res
