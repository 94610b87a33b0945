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
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from specdec.core.drafter import Drafter
from specdec.core.loop import generate, generate_stream
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.planned import PlannedSuffixDrafter
from specdec.drafters.prediction import PredictionDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.mock import MockLM, mock_pair
from specdec.theory import Costs

from .common import FAIL, PASS, first_difference, fmt
from .progress import ProgressLog, revive
from .seeds import SeedPlan
from .stats.chisquare import chisquare_gof
from .stats.family import TestRecord, apply_holm
from .stats.thresholds import ALPHA, POWER


# ------------------------------------------------------------------ exact distributions
def exact_window_distribution(
    model: MockLM, prompt: Sequence[int], start: int, m: int, sampling: SamplingConfig
) -> np.ndarray:
    """Exact distribution [V^m] of the generated tokens at positions start..start+m-1
    (1-based; category index sum_i y_i * V^i), when every token is sampled from
    logits_to_probs(logits_for_context(context), sampling) with no stop at EOS.

    Exact dynamic programming over the mock's state (its last ``order`` tokens).
    """
    order, vocab = model.spec.order, model.vocab_size
    rows: dict[tuple[int, ...], np.ndarray] = {}

    def row(key: tuple[int, ...]) -> np.ndarray:
        if key not in rows:
            logits = model.logits_for_context(list(key))  # [V]
            p = logits_to_probs(logits, sampling)
            rows[key] = p.double().numpy()  # [V]
        return rows[key]

    # state: (last `order` tokens of the context, window tokens so far) -> probability
    states: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {
        (tuple(int(t) for t in prompt[-order:]), ()): 1.0
    }
    for pos in range(1, start + m):
        nxt: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = defaultdict(float)
        for (key, win), prob in states.items():
            r = row(key)
            for tok in np.flatnonzero(r > 0):
                t = int(tok)
                new_win = (*win, t) if pos >= start else win
                nxt[((*key, t)[-order:], new_win)] += prob * float(r[t])
        states = nxt
    out = np.zeros(vocab**m)
    for (_, win), prob in states.items():
        out[sum(t * vocab**i for i, t in enumerate(win))] += prob
    return out


# ------------------------------------------------------------------ configuration
def level_pair(
    closeness: str, vocab: int, seed: int, draft_vocab_delta: int = 0
) -> tuple[MockLM, MockLM]:
    """The (draft, target) mock pair of a greedy unit or a sampled setup: ``closeness``, the
    target's vocabulary, and a draft with ``draft_vocab_delta`` ids more (a padded pair)."""
    return mock_pair(
        closeness, vocab_size=vocab, seed=seed, draft_vocab_size=vocab + draft_vocab_delta
    )


@dataclass(frozen=True)
class SampledSetup:
    """One sampled configuration of Level 2."""

    name: str
    closeness: str  # mock pair: identical | close | far
    k: int
    drafter: str = "model"  # model | ngram | planned | a PREDICTIONS kind
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # a padded pair (``models.vocab``): the draft has this many ids more (or fewer) than the
    # target; negative is the Qwen2.5 0.5B -> 7B case, where the target can emit ids the
    # draft model lacks
    draft_vocab_delta: int = 0

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


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


# a nearly flat verify curve for the planned drafter on mocks, so that it drafts often and
# its cut drafts are exercised (on a serial curve it would mostly fall back to plain steps)
MOCK_PLANNER_COSTS = Costs(verify_s=tuple(1.0 + 0.05 * n for n in range(16)), prefill_tps=1e3)


# predictions (``drafters.prediction``, OpenAI's predicted outputs) drafted in front of the
# planned drafter: the target's own greedy continuation of the prompt (right), the same with
# every token changed (wrong at every position), shifted by one token, and tokens of another
# "language" (an unrelated random sequence, the same in every run: part of the setup)
PREDICTIONS = ("prediction", "prediction-wrong", "prediction-shifted", "prediction-foreign")
FOREIGN = SeedPlan(0)  # the foreign predictions' stream: fixed, not the run's --seed


def mock_prediction(
    kind: str, right: Sequence[int], prompt: Sequence[int], vocab: int, n: int
) -> list[int]:
    """The prediction of ``kind`` for ``prompt`` from ``right``, the target's greedy
    continuation of it (``MockLM.greedy_continuation``, n tokens or up to EOS); the foreign
    one is n tokens of a fixed stream."""
    if kind == "prediction":
        return list(right)
    if kind == "prediction-wrong":
        return [(t + 1) % vocab for t in right]
    if kind == "prediction-shifted":
        return list(right[1:])
    assert kind == "prediction-foreign", kind
    g = FOREIGN.generator("l2-foreign", *prompt)
    return [int(t) for t in torch.randint(vocab, (n,), generator=g)]


def _drafter(kind: str, draft: MockLM, prediction: Sequence[int] | None = None) -> MockLM | Drafter:
    """A fresh drafter of ``kind`` (a prediction drafter, made for one generation, drafts
    ``prediction``: ``mock_prediction``'s tokens)."""
    if kind == "ngram":
        return NgramDrafter(max_n=3)
    if kind == "planned":
        return PlannedSuffixDrafter(SuffixDrafter(), MOCK_PLANNER_COSTS)
    if kind in PREDICTIONS:
        assert prediction is not None, kind
        fallback = PlannedSuffixDrafter(SuffixDrafter(), MOCK_PLANNER_COSTS)
        return PredictionDrafter(prediction, costs=MOCK_PLANNER_COSTS, fallback=fallback)
    return draft


# ------------------------------------------------------------------ results
@dataclass
class GreedyUnit:
    unit: str
    match_plain: bool
    match_reference: bool
    first_divergence: int | None  # index into the generated tokens, None when identical


@dataclass
class Level2Result:
    config: Level2Config
    greedy: list[GreedyUnit] = field(default_factory=list)
    tests: list[TestRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def greedy_mismatches(self) -> list[GreedyUnit]:
        return [u for u in self.greedy if not (u.match_plain and u.match_reference)]

    @property
    def status(self) -> str:
        ok = not self.greedy_mismatches and not any(t.rejected for t in self.tests)
        return PASS if ok else FAIL

    def summary(self) -> dict[str, Any]:
        mdt = [t.min_detectable_tv for t in self.tests if np.isfinite(t.min_detectable_tv)]
        return {
            "status": self.status,
            "greedy_units": len(self.greedy),
            "greedy_mismatches": len(self.greedy_mismatches),
            "sampled_tests": len(self.tests),
            "sequences_per_setup": self.config.sequences,
            "sampled_rejected": sum(t.rejected for t in self.tests),
            "sampled_min_p": min((t.pvalue for t in self.tests), default=1.0),
            "sampled_max_tv": max((t.tv for t in self.tests), default=0.0),
            "sampled_max_tv_upper": max((t.tv_high for t in self.tests), default=0.0),
            "min_detectable_tv_max": max(mdt) if mdt else float("nan"),
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
# The model work of each unit is done in one place (``greedy_outputs``, ``setup_windows``)
# and gives plain token lists and counts; the checks and statistics are then made on those.


def greedy_outputs(
    draft: MockLM,
    target: MockLM,
    prompt: Sequence[int],
    ref: list[int],
    max_new_tokens: int,
    drafters: Sequence[str],
    ks: Sequence[int],
) -> tuple[list[int], list[int], dict[tuple[str, int], list[int]]]:
    """The greedy outputs for one prompt, given its reference path ``ref`` (the target's
    ``greedy_continuation`` of ``max_new_tokens``): the reference, plain decoding, and
    speculative decoding for every (drafter, K), each with a fresh drafter (the predictions
    made from ``ref``)."""
    greedy = SamplingConfig()
    vocab = target.vocab_size
    predicted = {
        kind: mock_prediction(kind, ref, prompt, vocab, max_new_tokens)
        for kind in drafters
        if kind in PREDICTIONS
    }
    made = {(kind, k): _drafter(kind, draft, predicted.get(kind)) for kind in drafters for k in ks}
    plain = generate(
        target, None, prompt, max_new_tokens=max_new_tokens, k=0, sampling=greedy
    ).tokens
    spec = {
        (kind, k): generate(
            target, drafter, prompt, max_new_tokens=max_new_tokens, k=k, sampling=greedy
        ).tokens
        for (kind, k), drafter in made.items()
    }
    return ref, plain, spec


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


def run_greedy(cfg: Level2Config, seeds: SeedPlan, log: ProgressLog | None) -> list[GreedyUnit]:
    units: list[GreedyUnit] = []
    for vocab in cfg.greedy_vocabs:
        prompts = mock_prompts(seeds.generator("l2-prompts", vocab), cfg.greedy_prompts, vocab)
        for closeness in cfg.greedy_closeness:
            key = f"l2/greedy/{closeness}-V{vocab}"
            stored = log.read(key, lambda v: [revive(GreedyUnit, u) for u in v]) if log else None
            if stored is not None:
                units.extend(stored)
                continue
            draft, target = level_pair(closeness, vocab, seeds.base)
            n = cfg.greedy_max_new_tokens
            refs = [target.greedy_continuation(prompt, n) for prompt in prompts]
            batch: list[GreedyUnit] = []
            for pi, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
                outputs = greedy_outputs(
                    draft, target, prompt, ref, n, cfg.greedy_drafters, cfg.greedy_ks
                )
                batch.extend(greedy_units(f"{closeness}-V{vocab}/prompt{pi}", *outputs))
            units.extend(batch)
            if log:
                log.put(key, [asdict(u) for u in batch])
    return units


def window_end(windows: Sequence[tuple[int, int]]) -> int:
    """The last generated position (1-based) that a window of ``windows`` covers."""
    return max(s + m - 1 for s, m in windows)


def setup_length(setup: SampledSetup, windows: Sequence[tuple[int, int]]) -> int:
    """Tokens a sampled sequence of ``setup`` is generated for: its windows, and K more, so
    that the length does not cut the drafts of the rounds that reach the windows."""
    return window_end(windows) + setup.k


def sample_windows(
    setup: SampledSetup,
    draft: MockLM,
    target: MockLM,
    prompt: Sequence[int],
    right: list[int] | None,
    windows: Sequence[tuple[int, int]],
    sequences: int,
    seeds: SeedPlan,
) -> dict[tuple[int, int], np.ndarray]:
    """Counts [V^m] per window from ``sequences`` independent sequences (one seed each);
    ``right``: the target's greedy continuation the predictions are made from (a prediction
    setup; ``setup_length`` tokens)."""
    vocab = target.vocab_size
    counts = {w: np.zeros(vocab ** w[1], dtype=np.int64) for w in windows}
    end, n = window_end(windows), setup_length(setup, windows)
    predicted = None
    if setup.drafter in PREDICTIONS:
        assert right is not None, setup.name
        predicted = mock_prediction(setup.drafter, right, prompt, vocab, n)
    drafter = _drafter(setup.drafter, draft, predicted) if setup.k > 0 else None
    for i in range(sequences):
        toks: list[int] = []
        if predicted is not None:  # a prediction drafter follows one generation
            drafter = _drafter(setup.drafter, draft, predicted)
        for ev in generate_stream(
            target,
            drafter,
            prompt,
            max_new_tokens=n,
            k=setup.k,
            sampling=setup.sampling,
            seed=seeds.seed("l2", setup.name, i),
            stop_on_eos=False,
        ):
            toks.extend(ev.tokens)
            if len(toks) >= end:
                break
        for (s, m), c in counts.items():
            c[sum(t * vocab**j for j, t in enumerate(toks[s - 1 : s - 1 + m]))] += 1
    return counts


def setup_windows(
    setup: SampledSetup,
    prompt: Sequence[int],
    vocab: int,
    windows: Sequence[tuple[int, int]],
    sequences: int,
    seeds: SeedPlan,
) -> list[tuple[tuple[int, int], np.ndarray, np.ndarray]]:
    """The model work of one sampled setup: per window, (window, counts of the sampled
    sequences [V^m], exact distribution [V^m])."""
    n = setup_length(setup, windows)
    draft, target = level_pair(setup.closeness, vocab, seeds.base, setup.draft_vocab_delta)
    exact = {
        (s, m): exact_window_distribution(target, prompt, s, m, setup.sampling) for s, m in windows
    }
    right = target.greedy_continuation(prompt, n) if setup.drafter in PREDICTIONS else None
    counts = sample_windows(setup, draft, target, prompt, right, windows, sequences, seeds)
    return [((s, m), counts[s, m], exact[s, m]) for s, m in windows]


def run_sampled(cfg: Level2Config, seeds: SeedPlan, log: ProgressLog | None) -> list[TestRecord]:
    """Goodness-of-fit tests of every sampled setup (before Holm)."""
    vocab = cfg.sampled_vocab
    prompts = mock_prompts(seeds.generator("l2-sampled-prompt"), 2, vocab)
    raw: list[TestRecord] = []
    for si, setup in enumerate(cfg.setups):
        key = f"l2/sampled/{setup.name}"
        records = log.read(key, lambda v: [revive(TestRecord, d) for d in v]) if log else None
        if records is not None:
            raw.extend(records)
            continue
        found = setup_windows(setup, prompts[si % 2], vocab, cfg.windows, cfg.sequences, seeds)
        recs = [
            TestRecord.from_test(f"{setup.name}/pos{s}+{m}", chisquare_gof(counts, exact))
            for (s, m), counts, exact in found
        ]
        raw.extend(recs)
        if log:
            log.put(key, [r.to_dict() for r in recs])
    return raw


def run_level2(cfg: Level2Config, *, log: ProgressLog | None = None) -> Level2Result:
    """Greedy bit-exactness and sampled goodness of fit of the decoding loop on mocks."""
    t0 = time.perf_counter()
    res = Level2Result(cfg)
    seeds = SeedPlan(cfg.seed)
    res.greedy = run_greedy(cfg, seeds, log)
    res.tests = apply_holm(run_sampled(cfg, seeds, log), cfg.alpha, cfg.power)
    res.seconds = time.perf_counter() - t0
    return res
