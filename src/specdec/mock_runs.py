"""The decoding loop run on mock pairs (``models.mock``), for the certificate's Level 2.

Level 2 holds the whole loop, with every drafter, against mocks whose distributions are known
exactly. What it asks of the models is computed here, from plain arguments (the pair's
closeness and vocabulary, prompts, seeds), and returned as plain token lists and counts; the
certificate's checks and statistics (``certify.mock_level``) then run on those:

- ``greedy_runs``: per prompt, the reference greedy path (straight from the mock's logits),
  plain decoding, and speculative decoding for every (drafter, K);
- ``setup_windows``: per window of positions, the counts of the sampled sequences of one
  setup and the exact distribution they are held against (``exact_window_distribution``).

The seeds are the caller's (the certificate derives them from its ``SeedPlan``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specdec.core.drafter import Drafter
from specdec.core.loop import generate, generate_stream
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig, logits_to_probs, make_generator
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.planned import PlannedSuffixDrafter
from specdec.drafters.prediction import PredictionDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.mock import MockLM, mock_pair
from specdec.theory import Costs

# (drafter kind, K) -> the tokens speculative decoding generated
SpecOutputs = dict[tuple[str, int], list[int]]
# a fresh row processor for one generation (a grammar: ``constrained_runs``), or None
Processors = Callable[[], RowProcessor] | None


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


# ------------------------------------------------------------------ pairs and drafters
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


# a nearly flat verify curve for the planned drafter on mocks, so that it drafts often and
# its cut drafts are exercised (on a serial curve it would mostly fall back to plain steps)
MOCK_PLANNER_COSTS = Costs(verify_s=tuple(1.0 + 0.05 * n for n in range(16)), prefill_tps=1e3)


# predictions (``drafters.prediction``, OpenAI's predicted outputs) drafted in front of the
# planned drafter: the target's own greedy continuation of the prompt (right), the same with
# every token changed (wrong at every position), shifted by one token, and tokens of another
# "language" (an unrelated random sequence drawn from ``foreign_seed``: part of the setup)
PREDICTIONS = ("prediction", "prediction-wrong", "prediction-shifted", "prediction-foreign")


def mock_prediction(
    kind: str, right: Sequence[int], vocab: int, n: int, foreign_seed: int
) -> list[int]:
    """The prediction of ``kind`` from ``right``, the target's greedy continuation of the
    prompt (``MockLM.greedy_continuation``, n tokens or up to EOS); the foreign one is n
    tokens drawn with ``foreign_seed``."""
    if kind == "prediction":
        return list(right)
    if kind == "prediction-wrong":
        return [(t + 1) % vocab for t in right]
    if kind == "prediction-shifted":
        return list(right[1:])
    assert kind == "prediction-foreign", kind
    g = make_generator(foreign_seed)
    return [int(t) for t in torch.randint(vocab, (n,), generator=g)]


def make_drafter(
    kind: str, draft: MockLM, prediction: Sequence[int] | None = None
) -> MockLM | Drafter:
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


# ------------------------------------------------------------------ greedy
def greedy_outputs(
    draft: MockLM,
    target: MockLM,
    prompt: Sequence[int],
    ref: list[int],
    max_new_tokens: int,
    drafters: Sequence[str],
    ks: Sequence[int],
    foreign_seed: int,
    processors: Processors = None,
) -> tuple[list[int], list[int], SpecOutputs]:
    """The greedy outputs for one prompt, given its reference path ``ref`` (the target's
    ``greedy_continuation`` of ``max_new_tokens``): the reference, plain decoding, and
    speculative decoding for every (drafter, K), each with a fresh drafter (the predictions
    made from ``ref``) and, with ``processors``, a fresh processor of its own."""
    greedy = SamplingConfig()
    vocab = target.vocab_size
    predicted = {
        kind: mock_prediction(kind, ref, vocab, max_new_tokens, foreign_seed)
        for kind in drafters
        if kind in PREDICTIONS
    }
    made = {
        (kind, k): make_drafter(kind, draft, predicted.get(kind)) for kind in drafters for k in ks
    }

    def run(drafter: MockLM | Drafter | None, k: int) -> list[int]:
        processor = None if processors is None else processors()
        return generate(
            target,
            drafter,
            prompt,
            max_new_tokens=max_new_tokens,
            k=k,
            sampling=greedy,
            processor=processor,
        ).tokens

    plain = run(None, 0)
    spec = {(kind, k): run(drafter, k) for (kind, k), drafter in made.items()}
    return ref, plain, spec


def greedy_runs(
    closeness: str,
    vocab: int,
    pair_seed: int,
    prompts: Sequence[Sequence[int]],
    foreign_seeds: Sequence[int],
    max_new_tokens: int,
    drafters: Sequence[str],
    ks: Sequence[int],
) -> list[tuple[list[int], list[int], SpecOutputs]]:
    """``greedy_outputs`` of every prompt on the ``closeness`` pair of ``vocab`` (made from
    ``pair_seed``); ``foreign_seeds``: the foreign prediction's seed per prompt."""
    draft, target = level_pair(closeness, vocab, pair_seed)
    refs = [target.greedy_continuation(prompt, max_new_tokens) for prompt in prompts]
    return [
        greedy_outputs(draft, target, prompt, ref, max_new_tokens, drafters, ks, foreign)
        for prompt, ref, foreign in zip(prompts, refs, foreign_seeds, strict=True)
    ]


# ------------------------------------------------------------------ sampled
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
    seeds: Sequence[int],
    foreign_seed: int,
    processors: Processors = None,
) -> dict[tuple[int, int], np.ndarray]:
    """Counts [V^m] per window from one independent sequence per seed of ``seeds``;
    ``right``: the target's greedy continuation the predictions are made from (a prediction
    setup; ``setup_length`` tokens); ``processors``: a fresh processor per sequence."""
    vocab = target.vocab_size
    counts = {w: np.zeros(vocab ** w[1], dtype=np.int64) for w in windows}
    end, n = window_end(windows), setup_length(setup, windows)
    predicted = None
    if setup.drafter in PREDICTIONS:
        assert right is not None, setup.name
        predicted = mock_prediction(setup.drafter, right, vocab, n, foreign_seed)
    drafter = make_drafter(setup.drafter, draft, predicted) if setup.k > 0 else None
    for seed in seeds:
        toks: list[int] = []
        if predicted is not None:  # a prediction drafter follows one generation
            drafter = make_drafter(setup.drafter, draft, predicted)
        for ev in generate_stream(
            target,
            drafter,
            prompt,
            max_new_tokens=n,
            k=setup.k,
            sampling=setup.sampling,
            seed=seed,
            stop_on_eos=False,
            processor=None if processors is None else processors(),
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
    pair_seed: int,
    seeds: Sequence[int],
    foreign_seed: int,
) -> list[tuple[tuple[int, int], np.ndarray, np.ndarray]]:
    """The model work of one sampled setup: per window, (window, counts of the sampled
    sequences [V^m], one per seed of ``seeds``, exact distribution [V^m])."""
    n = setup_length(setup, windows)
    draft, target = level_pair(setup.closeness, vocab, pair_seed, setup.draft_vocab_delta)
    exact = {
        (s, m): exact_window_distribution(target, prompt, s, m, setup.sampling) for s, m in windows
    }
    right = target.greedy_continuation(prompt, n) if setup.drafter in PREDICTIONS else None
    counts = sample_windows(setup, draft, target, prompt, right, windows, seeds, foreign_seed)
    return [((s, m), counts[s, m], exact[s, m]) for s, m in windows]
