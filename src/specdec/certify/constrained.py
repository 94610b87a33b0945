"""The constrained level: the decoding loop under a grammar on mock models, whose constrained
distribution is known exactly (``--levels constrained``; the grammars: ``--constraint``).

Level 2's design with a grammar applied as a request's constraint is (one
``GrammarProcessor`` per generation, ``specdec.constrained_runs``):

- Greedy: speculative output under the grammar must be bit-identical to plain output under
  it AND to the reference path (argmax of the mock's logits masked by the engine's mask for
  each prefix, computed without the processor), for identical / close / far drafts, several
  prompts, K and drafters (model, n-gram, planned, a right and a wrong prediction: its
  ruled-out tokens are cut before the pass). Threshold: zero mismatches.
- Sampled: per (grammar, setup) N independent sequences, one seed each; the tokens in each
  window of positions are one categorical variable whose exact law under plain decoding with
  the grammar is enumerated (``exact_constrained_window``). Chi-square goodness of fit per
  (grammar, setup, window), Holm over all of them at family-wise alpha, TV with a
  distribution-free CI and the smallest TV detectable with 80 % power; an observation outside
  the law's support (a window the grammar, or top-k / top-p, rules out) is impossible under
  it (p = 0) and is counted.

Needs the grammar engine (the ``structured`` extra).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from specdec.constrained_runs import (
    MOCK_GRAMMARS,
    constrained_greedy_runs,
    constrained_setup_windows,
    mock_grammar,
)
from specdec.mock_runs import SampledSetup
from specdec.stats.chisquare import chisquare_gof
from specdec.stats.family import TestRecord, apply_holm
from specdec.stats.thresholds import ALPHA, POWER

from .common import fmt
from .mock_level import (
    GreedyUnit,
    foreign_seed,
    greedy_units,
    loop_figures,
    loop_status,
    mismatches,
    mock_prompts,
)
from .progress import ProgressLog
from .seeds import SeedPlan

GRAMMAR_NAMES = tuple(MOCK_GRAMMARS)  # the built-in grammars (``--constraint``)

CONSTRAINED_SETUPS: tuple[SampledSetup, ...] = (
    SampledSetup("plain-K0", "close", 0),
    SampledSetup("close-K4", "close", 4),
    SampledSetup("far-K4", "far", 4),
    SampledSetup("close-K4-T0.8-topk3-topp0.9", "close", 4, temperature=0.8, top_k=3, top_p=0.9),
    SampledSetup("ngram-K3", "close", 3, drafter="ngram"),
)


@dataclass(frozen=True)
class ConstrainedConfig:
    grammars: tuple[str, ...] = GRAMMAR_NAMES
    greedy_closeness: tuple[str, ...] = ("identical", "close", "far")
    greedy_prompts: int = 4
    greedy_ks: tuple[int, ...] = (0, 1, 2, 4, 6)
    greedy_drafters: tuple[str, ...] = (
        "model",
        "ngram",
        "planned",
        "prediction",
        "prediction-wrong",
    )
    greedy_max_new_tokens: int = 24
    setups: tuple[SampledSetup, ...] = CONSTRAINED_SETUPS
    windows: tuple[tuple[int, int], ...] = ((1, 2), (6, 1))  # (start position, length)
    sequences: int = 1500
    alpha: float = ALPHA
    power: float = POWER
    seed: int = 0


@dataclass
class GrammarWindowTest:
    """One goodness-of-fit test of a (grammar, setup, window) and how many of its
    observations fall outside the exact law's support (probability 0)."""

    record: TestRecord
    outside: int


@dataclass
class ConstrainedResult:
    config: ConstrainedConfig
    grammars: dict[str, str] = field(default_factory=dict)  # name -> what it is
    greedy: list[GreedyUnit] = field(default_factory=list)
    tests: list[TestRecord] = field(default_factory=list)
    # test unit -> observations outside the law's support
    outside: dict[str, int] = field(default_factory=dict)
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
            "grammars": list(self.config.grammars),
            **loop_figures(self.greedy, self.tests, self.config.sequences),
            "outside_support": sum(self.outside.values()),
            "alpha": self.config.alpha,
            "seconds": self.seconds,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "config": asdict(self.config),
            "grammars": self.grammars,
            "greedy_mismatches": [asdict(u) for u in self.greedy_mismatches[:50]],
            "tests": [t.to_dict() for t in self.tests],
            "outside_support": self.outside,
        }

    def shown(self) -> list[str]:
        s = self.summary()
        c = self.config
        bad = self.greedy_mismatches
        worst = min(self.tests, key=lambda t: t.pvalue, default=None)
        return [
            "Grammars (each applied as a request's constraint: one GrammarProcessor per "
            "generation, the target's rows masked along the draft's path, ruled-out drafts "
            "cut, the draft model's rows masked): "
            + "; ".join(f"`{n}`: {d}" for n, d in self.grammars.items())
            + ".",
            f"Greedy under the grammar: {s['greedy_units'] - len(bad)}/{s['greedy_units']} "
            "runs bit-identical to plain decoding under it and to the reference path (argmax "
            "of the masked logits, masks from a fresh matcher per prefix) "
            f"({len(c.grammars)} grammars x {len(c.greedy_closeness)} draft closenesses x "
            f"{c.greedy_prompts} prompts x K in {list(c.greedy_ks)} x drafters "
            f"{list(c.greedy_drafters)}, {c.greedy_max_new_tokens} tokens)"
            + (f"; first mismatch: {bad[0].unit}" if bad else "."),
            f"Sampled under the grammar: {s['sampled_tests']} goodness-of-fit tests "
            f"({len(c.grammars)} grammars x {len(c.setups)} setups x windows "
            f"{list(c.windows)}, {c.sequences} independent sequences each, one seed per "
            "sequence) against the exact constrained law (every prefix enumerated, target "
            f"rows masked and renormalised); Holm at alpha {c.alpha:g}: "
            f"{s['sampled_rejected']} rejected (min p {fmt(s['sampled_min_p'])}"
            + (f", {worst.unit}" if worst is not None else "")
            + f"); {s['outside_support']} observations outside the law's support (the "
            "grammar, top-k / top-p); largest TV estimate "
            f"{fmt(s['sampled_max_tv'])} (95 % upper bound {fmt(s['sampled_max_tv_upper'])}); "
            f"every test detects a TV on its pooled categories >= "
            f"{fmt(s['min_detectable_tv_max'])} with 80 % power.",
        ]


# ------------------------------------------------------------------ the tests
def support_only(counts: np.ndarray, exact: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """counts [C], exact [C] -> the categories the law allows or the sample holds [C']: the
    others (probability 0, never observed) add nothing to the test, and the TV interval's
    support is then the grammar's, not V^m."""
    keep = (exact > 0) | (counts > 0)  # [C]
    return counts[keep], exact[keep]


def window_test(unit: str, counts: np.ndarray, exact: np.ndarray) -> GrammarWindowTest:
    """The goodness-of-fit test of one window's counts [V^m] against its exact law [V^m]."""
    c, e = support_only(counts, exact)
    outside = int(counts[exact <= 0].sum())
    return GrammarWindowTest(TestRecord.from_test(unit, chisquare_gof(c, e)), outside)


# ------------------------------------------------------------------ running
def greedy_batch(
    cfg: ConstrainedConfig, grammar: str, closeness: str, prompts: list[list[int]], seeds: SeedPlan
) -> list[GreedyUnit]:
    """The greedy units of one (grammar, closeness) over ``prompts``."""
    runs = constrained_greedy_runs(
        mock_grammar(grammar),
        closeness,
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
        for unit in greedy_units(f"{grammar}/{closeness}/prompt{pi}", *outputs)
    ]


def sampled_tests(
    cfg: ConstrainedConfig, grammar: str, setup: SampledSetup, prompt: list[int], seeds: SeedPlan
) -> list[GrammarWindowTest]:
    """The goodness-of-fit tests of one (grammar, setup), one per window (before Holm)."""
    found = constrained_setup_windows(
        mock_grammar(grammar),
        setup,
        prompt,
        cfg.windows,
        seeds.base,
        [seeds.seed("constrained", grammar, setup.name, i) for i in range(cfg.sequences)],
        foreign_seed(prompt),
    )
    return [
        window_test(f"{grammar}/{setup.name}/pos{s}+{m}", counts, exact)
        for (s, m), counts, exact in found
    ]


def run_constrained(cfg: ConstrainedConfig, *, log: ProgressLog | None = None) -> ConstrainedResult:
    """Greedy bit-exactness and sampled goodness of fit of the loop under each grammar."""
    t0 = time.perf_counter()
    res = ConstrainedResult(cfg)
    log = ProgressLog.memory() if log is None else log
    seeds = SeedPlan(cfg.seed)
    raw: list[GrammarWindowTest] = []
    for name in cfg.grammars:
        grammar = mock_grammar(name)
        res.grammars[name] = grammar.description
        vocab = grammar.vocab
        prompts = mock_prompts(
            seeds.generator("constrained-prompts", name), cfg.greedy_prompts, vocab
        )
        for closeness in cfg.greedy_closeness:
            compute = partial(greedy_batch, cfg, name, closeness, prompts, seeds)
            key = f"constrained/greedy/{name}/{closeness}"
            res.greedy.extend(log.units(key, compute, GreedyUnit))
        sampled = mock_prompts(seeds.generator("constrained-sampled-prompt", name), 2, vocab)
        for si, setup in enumerate(cfg.setups):
            compute_tests = partial(sampled_tests, cfg, name, setup, sampled[si % 2], seeds)
            key = f"constrained/sampled/{name}/{setup.name}"
            raw.extend(log.units(key, compute_tests, GrammarWindowTest))
    res.tests = apply_holm([w.record for w in raw], cfg.alpha, cfg.power)
    res.outside = {w.record.unit: w.outside for w in raw}
    res.seconds = time.perf_counter() - t0
    return res
