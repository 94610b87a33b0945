"""The prediction drafter as it was before drafts of 64 and re-synchronisation in the same
round (commit 5de7d18), frozen for ``prediction_ceiling.py``'s "today" decoder: the
comparison with today's behaviour in the same run. Its code is that commit's
``drafters/prediction.py`` and the parts of ``drafters/planned.py`` it uses, unchanged but
for their imports and docstrings (the suffix drafter it falls back on, with its default
options, is the package's: its drafts did not change). Not used by the package.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.core.drafter import Draft, Drafter
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError
from specdec.theory import Costs, expected_tokens_per_round

# match-length buckets: the lower bound of each (a match of m tokens falls in the last
# bucket whose bound is <= m)
BUCKETS = (1, 2, 3, 4, 6, 8)
# priors per bucket (first token, continuation): short matches are often coincidences,
# long ones usually verbatim copies
PRIOR_FIRST = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
PRIOR_CONT = (0.6, 0.7, 0.75, 0.8, 0.85, 0.9)
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each prior
EXPLORE_TRIALS = 4  # below this many first-token trials, judge a bucket optimistically
# the longest draft that only that optimism justifies (an exploring draft tests the first
# token's rate, the one judged optimistically; a rejected one costs verify(1 + this) - verify(1))
EXPLORE_LEN = 1


def bucket_of(match_len: int) -> int:
    """Index of the bucket of a match of ``match_len`` >= 1 tokens."""
    assert match_len >= 1
    return max(i for i, lo in enumerate(BUCKETS) if lo <= match_len)


@dataclass
class Rate:
    """A Bernoulli rate with a prior: (successes + w * prior) / (trials + w)."""

    prior: float
    successes: float = 0.0
    trials: float = 0.0

    @property
    def mean(self) -> float:
        return (self.successes + PRIOR_WEIGHT * self.prior) / (self.trials + PRIOR_WEIGHT)

    @property
    def optimistic(self) -> float:
        n = self.trials + PRIOR_WEIGHT
        m = self.mean
        return min(1.0, m + math.sqrt(m * (1.0 - m) / (n + 1.0)))

    def add(self, success: bool) -> None:
        self.trials += 1.0
        self.successes += float(success)


def best_length(first: float, cont: float, max_len: int, costs: Costs) -> int:
    """The draft length in 0..max_len with the highest expected tokens per second (ties go
    to the shorter draft)."""
    best, best_rate = 0, 1.0 / costs.round_seconds(0)
    accept = [first] + [cont] * max(0, max_len - 1)  # [max_len]
    for n in range(1, max_len + 1):
        rate = expected_tokens_per_round(accept, n) / costs.round_seconds(n)
        if rate > best_rate * (1.0 + 1e-9):
            best, best_rate = n, rate
    return best


@dataclass
class MatchPlanner:
    """Learned acceptance per match-length bucket, and the cost-aware length choice."""

    costs: Costs
    # None: while exploring, drafts as long as the optimistic rate says (before EXPLORE_LEN)
    explore_len: int | None = EXPLORE_LEN
    first: list[Rate] = field(default_factory=list)
    cont: list[Rate] = field(default_factory=list)
    trace: list[tuple[int, int, int]] = field(default_factory=list)  # (match, drafted, kept)

    def __post_init__(self) -> None:
        if not self.first:
            self.first = [Rate(p) for p in PRIOR_FIRST]
        if not self.cont:
            self.cont = [Rate(p) for p in PRIOR_CONT]
        assert len(self.first) == len(self.cont) == len(BUCKETS)

    def length(self, match_len: int, available: int) -> int:
        """How many of ``available`` drafted tokens to keep for a match of ``match_len``."""
        if match_len < 1 or available < 1:
            return 0
        b = bucket_of(match_len)
        f, cont = self.first[b], self.cont[b].mean
        if f.trials >= EXPLORE_TRIALS:
            return best_length(f.mean, cont, available, self.costs)
        explore = best_length(f.optimistic, cont, available, self.costs)
        if self.explore_len is None:  # as long as optimism says
            return explore
        exploit = best_length(f.mean, cont, available, self.costs)
        return exploit if exploit > 0 else min(explore, self.explore_len)

    def observe(self, match_len: int, drafted: int, kept: int) -> None:
        """A round drafted ``drafted`` tokens for a match of ``match_len``; ``kept`` survived."""
        assert 0 <= kept <= drafted
        if drafted == 0:
            return
        self.trace.append((match_len, drafted, kept))
        b = bucket_of(match_len)
        self.first[b].add(kept >= 1)
        for i in range(1, min(drafted, kept + 1)):  # continuation tokens that were tested
            self.cont[b].add(i < kept)


class PlannedSuffixDrafter:
    """A ``SuffixDrafter`` whose drafts are cut to the cost-aware length of a ``MatchPlanner``.

    It learns how much of each draft was kept from the next context it is given: the tokens
    after the previous context either start with the whole draft (all kept) or leave it at
    the first rejected position (the token emitted there differs from the draft's, for
    greedy and for one-hot sampled drafts alike).
    """

    def __init__(
        self, inner: SuffixDrafter, costs: Costs, *, explore_len: int | None = EXPLORE_LEN
    ) -> None:
        if not isinstance(inner, SuffixDrafter):
            raise ConfigError("the cost-aware planner needs a suffix drafter")
        if explore_len is not None and explore_len < 1:
            raise ConfigError(f"explore_len must be >= 1 or None, got {explore_len}")
        self.inner = inner
        self.costs = costs
        self.explore_len = explore_len
        self.name = f"{inner.name}-planned"
        self.planner = MatchPlanner(costs, explore_len)
        self._pending: tuple[int, int, list[int]] | None = None  # (context len, match, draft)

    def reset(self) -> None:
        self.inner.reset()
        self.planner = MatchPlanner(self.costs, self.explore_len)
        self._pending = None

    def prefill(self, context: Sequence[int]) -> None:
        self.inner.prefill(context)

    def _settle(self, context: Sequence[int]) -> None:
        """Account for the previous draft, now that the context shows what was kept."""
        if self._pending is None:
            return
        start, match_len, draft = self._pending
        if len(context) <= start:
            return  # nothing emitted after it yet (rollback within the same round)
        kept = 0
        for tok, got in zip(draft, context[start:], strict=False):
            if tok != got:
                break
            kept += 1
        self.planner.observe(match_len, len(draft), kept)
        self._pending = None

    def rollback(self, context: Sequence[int]) -> None:
        self._settle(context)
        self.inner.rollback(context)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        self._settle(context)
        draft = self.inner.propose(context, k, sampling, generator, processor=processor)
        if not draft.tokens:
            return draft
        match_len = self.inner.last_match_len
        keep = self.planner.length(match_len, len(draft.tokens))
        tokens = draft.tokens[:keep]
        if tokens:
            self._pending = (len(context), match_len, tokens)
        return Draft(tokens, None)


SOURCE = "prediction"
MAX_MATCH = 8  # longest output suffix compared when re-synchronising (and the top bucket)
SKIP_WINDOW = 64  # how far ahead a single token may re-anchor right after a divergence
SINGLE_ANCHOR = 2  # output tokens after a divergence during which one token may re-anchor
# Priors per match-length bucket (see planned.BUCKETS): a prediction is usually the text
# itself, so even a short re-anchoring match is more often right than a suffix match is.
PRIOR_FIRST = (0.35, 0.5, 0.6, 0.7, 0.8, 0.85)
PRIOR_CONT = (0.8, 0.85, 0.88, 0.9, 0.92, 0.95)


def prediction_planner(costs: Costs, explore_len: int | None = EXPLORE_LEN) -> MatchPlanner:
    """A ``MatchPlanner`` with the prediction drafter's priors."""
    return MatchPlanner(
        costs,
        explore_len,
        first=[Rate(p) for p in PRIOR_FIRST],
        cont=[Rate(p) for p in PRIOR_CONT],
    )


assert len(PRIOR_FIRST) == len(PRIOR_CONT) == len(BUCKETS)


class PredictionIndex:
    """Where each pair of consecutive tokens occurs in the prediction (built once)."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = [int(t) for t in tokens]
        self._pairs: dict[tuple[int, int], list[int]] = defaultdict(list)
        for j in range(2, len(self.tokens) + 1):  # j: the position after the pair
            self._pairs[(self.tokens[j - 2], self.tokens[j - 1])].append(j)

    def __len__(self) -> int:
        return len(self.tokens)

    def resync(self, output: Sequence[int], expected: int) -> tuple[int, int] | None:
        """(position after the match, match length) of the longest suffix of ``output``
        (2..MAX_MATCH tokens) found in the prediction, ties broken by distance from
        ``expected``: ahead (>= expected) before behind, nearest first. None without one."""
        if len(output) < 2:
            return None
        best: tuple[int, int, int, int] | None = None  # (-length, behind, distance, j)
        for j in self._pairs.get((int(output[-2]), int(output[-1])), ()):
            m = 2
            while (
                m < MAX_MATCH
                and m < j
                and m < len(output)
                and (self.tokens[j - m - 1] == output[-m - 1])
            ):
                m += 1
            key = (-m, int(j < expected), abs(j - expected), j)
            if best is None or key < best:
                best = key
        return None if best is None else (best[3], -best[0])

    def skip_to(self, token: int, start: int) -> int | None:
        """The position after the first occurrence of ``token`` in [start, start +
        SKIP_WINDOW) (a deletion: the output skipped part of the prediction), or None."""
        for j in range(max(0, start), min(len(self.tokens), start + SKIP_WINDOW)):
            if self.tokens[j] == token:
                return j + 1
        return None


class PredictionDrafter:
    """Drafts a prediction (token ids) from where the output stands in it; see the module
    docstring. ``fallback`` drafts where the prediction has no match (None: nothing);
    ``costs`` size the drafts (None: as long as K allows, for tests and tools without a
    measured target)."""

    def __init__(
        self,
        prediction: Sequence[int],
        *,
        costs: Costs | None,
        fallback: Drafter | None = None,
    ) -> None:
        self.index = PredictionIndex(prediction)
        self.costs = costs
        self.fallback = fallback
        self.name = SOURCE + (f"+{fallback.name}" if fallback is not None else "")
        self.reset()

    def reset(self) -> None:
        self.planner = prediction_planner(self.costs) if self.costs is not None else None
        self.pos: int | None = 0  # the output starts at the prediction's start
        self.run = 0  # output tokens matched since the last (re-)synchronisation
        self.left_at = 0  # where the output left the prediction (re-sync looks near it)
        self.since_left = 0  # output tokens since it left (the divergent one included)
        self._start: int | None = None  # context length where the output begins
        self._seen = 0  # context length already walked
        self._pending: tuple[int, int, list[int]] | None = None  # (ctx len, bucket m, draft)
        if self.fallback is not None:
            self.fallback.reset()

    def report(self) -> dict[str, int]:
        """What a generation's result records: the prediction's length in tokens (the result
        then reports accepted / rejected prediction tokens, ``prediction_tokens``)."""
        return {"prediction_tokens": len(self.index)}

    def prefill(self, context: Sequence[int]) -> None:
        if self.fallback is not None:
            self.fallback.prefill(context)

    def rollback(self, context: Sequence[int]) -> None:
        self._walk(context)
        if self.fallback is not None:
            self.fallback.rollback(context)

    def _walk(self, context: Sequence[int]) -> None:
        """Follow the tokens the output gained since the last call through the prediction,
        and settle the planner's account of the previous draft."""
        if self._start is None:  # the first call: the context is the prompt
            self._start = self._seen = len(context)
            return
        if self._pending is not None and len(context) > self._pending[0]:
            start, m, draft = self._pending
            kept = 0
            for tok, got in zip(draft, context[start:], strict=False):
                if tok != got:
                    break
                kept += 1
            if self.planner is not None:
                self.planner.observe(m, len(draft), kept)
            self._pending = None
        tokens = self.index.tokens
        for t in context[self._seen :]:
            if self.pos is not None and self.pos < len(tokens) and tokens[self.pos] == t:
                self.pos += 1
                self.run += 1
            elif self.pos is not None:
                self.left_at, self.pos, self.run, self.since_left = self.pos, None, 0, 1
            else:
                self.since_left += 1
        self._seen = len(context)

    def _resync(self, context: Sequence[int]) -> None:
        assert self._start is not None
        output = context[self._start :]
        found = self.index.resync(output[-MAX_MATCH:], self.left_at)
        if found is None and output and self.since_left <= SINGLE_ANCHOR:
            j = self.index.skip_to(int(output[-1]), self.left_at)
            found = None if j is None else (j, 1)
        if found is not None:
            self.pos, self.run = found

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        self._walk(context)
        if self.pos is None:
            self._resync(context)
        if self.pos is not None and self.pos < len(self.index) and k > 0:
            available = self.index.tokens[self.pos : self.pos + k]
            m = max(1, min(self.run, MAX_MATCH))  # the start counts as a 1-token match
            if self.planner is None:
                keep = len(available)
            else:
                keep = self.planner.length(m, len(available))
            if keep > 0:
                tokens = available[:keep]
                self._pending = (len(context), m, tokens)
                return Draft(tokens, None, source=SOURCE)
            return Draft([], None)  # drafting here would not pay: a plain step
        if self.fallback is not None:
            return self.fallback.propose(context, k, sampling, generator, processor=processor)
        return Draft([], None)
