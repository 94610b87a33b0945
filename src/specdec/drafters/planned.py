"""Cost-aware draft lengths for the suffix drafter: draft only what is expected to pay.

Where verification is nearly serial (llama.cpp on a small CPU: one more verified row costs
about half a plain step), a rejected draft is a loss, so the length of each draft must
weigh how likely its tokens are to be kept against what verifying them costs. For a draft
whose earliest suffix match has m tokens, the planner keeps two acceptance rates per
match-length bucket, learned from this generation's rounds:

    first   P(draft token 1 kept)
    cont    P(draft token i kept | tokens 1..i-1 kept), i >= 2

and keeps the length L (0..len(draft)) that maximises expected tokens per second,

    E[tokens | L] / seconds(L),   E = 1 + sum_{i<=L} prod_{j<=i} a_j,
    seconds(L) = costs.round_seconds(L)   (the target's measured verify curve),

where L = 0 is a plain step. A bucket that has been tried only a few times is judged with an
optimistic first-token rate (its mean plus one standard deviation), so a pessimistic prior
cannot shut a bucket forever. A draft that only this optimism justifies (the mean alone
would draft nothing) is cut to ``EXPLORE_LEN`` = 1 token: it tests the rate in doubt, the
first token's, and a rejected one costs verify(2) - verify(1) instead of a long pass. On text
with few repeats those long exploring drafts set the planner's worst case
(``benchmarks/studies/planner_replay.py`` on the two trace sets: the worst replayed output
went from 0.94x / 0.90x of plain decoding to 0.99x / 0.97x, the geometric means from
1.036x / 1.083x to 1.044x / 1.081x).

Every draft is also bounded by a regret budget (``EXPLORE_BUDGET``): it is cut to the longest
length whose worst case (all of it rejected) keeps what this generation's drafts have cost,
net (each round's seconds minus what plain steps would have taken for the tokens it
emitted), within ``EXPLORE_BUDGET`` of the plain-decoding time of the tokens generated so
far, counting ``EXPLORE_CREDIT`` tokens up front. A draft that pays earns credit, so a real
copy soon drafts at full length; on text where drafts do not pay the generation cannot fall
more than about that fraction (plus one draft) below plain decoding, whatever the priors,
the learned rates or the verify curve. On a steep verify curve (verify(2) about two steps)
the priors' and learned rates' losing drafts on fresh text had put outputs 5-10 % below plain
decoding (issue 61). Replayed on the greedy traces (``benchmarks/studies/planner_replay.py``, 45
outputs), the worst output of 48+ tokens went from 0.950x to 0.983x of plain decoding on a
steep curve and from 0.956x to 0.975x on this machine's measured one, geometric means 1.022x
to 1.017x and 1.065x to 1.065x.

Everything the planner learns comes from the accepted context (how much of the previous
draft the context kept), never from timings: a fixed seed gives a fixed output and a fixed
trace of draft lengths. Cutting a draft short never changes what the target emits (the
drafter is deterministic given the context and its rows are one-hot), so the output keeps
the target's distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.core.drafter import Draft
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.drafters.suffix import SuffixDrafter, SuffixOptions, parse_suffix_options
from specdec.errors import ConfigError
from specdec.theory import Costs

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
# drafts may cost at most this fraction of the plain-decoding time of the tokens generated so
# far (net of what they earn), counting EXPLORE_CREDIT tokens up front (a one-token draft on a
# steep curve at the start of a generation); chosen on the replayed traces (see above)
EXPLORE_BUDGET = 0.01
EXPLORE_CREDIT = 100


def bucket_of(match_len: int) -> int:
    """Index of the bucket of a match of ``match_len`` >= 1 tokens."""
    assert match_len >= 1
    return max(i for i, lo in enumerate(BUCKETS) if lo <= match_len)


@dataclass
class Rate:
    """A Bernoulli rate with a prior worth ``weight`` trials: (successes + w * prior) /
    (trials + w)."""

    prior: float
    successes: float = 0.0
    trials: float = 0.0
    weight: float = PRIOR_WEIGHT

    @property
    def mean(self) -> float:
        return (self.successes + self.weight * self.prior) / (self.trials + self.weight)

    @property
    def optimistic(self) -> float:
        n = self.trials + self.weight
        m = self.mean
        return min(1.0, m + math.sqrt(m * (1.0 - m) / (n + 1.0)))

    def add(self, success: bool) -> None:
        self.trials += 1.0
        self.successes += float(success)


def best_plan(first: float, cont: float, max_len: int, costs: Costs) -> tuple[int, float]:
    """(L, expected tokens per second at L): the draft length in 0..max_len with the highest
    expected tokens per second (ties go to the shorter draft). L never passes the measured
    verify curve (a draft of L needs a pass of L + 1 rows: L <= len(costs.verify_s) - 1), so
    no length is chosen on an extrapolated cost."""
    max_len = min(max_len, len(costs.verify_s) - 1)
    best, best_rate = 0, 1.0 / costs.round_seconds(0)
    expected, reach = 1.0, 1.0  # E[tokens | n] = 1 + sum_{i<=n} prod_{j<=i} a_j
    for n in range(1, max_len + 1):
        reach *= first if n == 1 else cont
        expected += reach
        rate = expected / costs.round_seconds(n)
        if rate > best_rate * (1.0 + 1e-9):
            best, best_rate = n, rate
    return best, best_rate


def best_length(first: float, cont: float, max_len: int, costs: Costs) -> int:
    """The draft length of ``best_plan``."""
    return best_plan(first, cont, max_len, costs)[0]


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

    def plan(self, match_len: int, available: int) -> tuple[int, float]:
        """(how many of ``available`` drafted tokens to keep for a match of ``match_len``, the
        expected tokens per second of that choice): what ``length`` keeps, with the rate a
        drafter comparing several places to draft from ranks them by."""
        if match_len < 1 or available < 1:
            return 0, 1.0 / self.costs.round_seconds(0)
        b = bucket_of(match_len)
        f, cont = self.first[b], self.cont[b].mean
        exploit = best_plan(f.mean, cont, available, self.costs)
        if f.trials >= EXPLORE_TRIALS:
            return exploit
        explore = best_plan(f.optimistic, cont, available, self.costs)
        if self.explore_len is None:  # as long as optimism says
            return explore
        if exploit[0] > 0:
            return exploit
        n = min(explore[0], self.explore_len)
        rate = best_plan(f.optimistic, cont, n, self.costs) if n else explore
        return n, rate[1]

    def length(self, match_len: int, available: int) -> int:
        """How many of ``available`` drafted tokens to keep for a match of ``match_len``."""
        return self.plan(match_len, available)[0]

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


# The suffix drafter under the planner: drafts up to 64 tokens, as long as a match of m tokens
# allows at 8 per matched token (the planner cuts them to what pays; the suffix drafter's own
# defaults, 16 and 2 per token, size drafts for a fixed K)
PLANNED_SUFFIX = SuffixOptions(max_draft=64, draft_per_match=8.0)


def planned_suffix(text: str = "") -> SuffixDrafter:
    """The inner drafter of ``planned[:OPTS]``: ``PLANNED_SUFFIX`` with OPTS over it."""
    return SuffixDrafter(parse_suffix_options(text, PLANNED_SUFFIX))


# Where a suffix draft comes from, each with its own planner (learned acceptance): a copy of
# the prompt (a document being edited, quoted or summarised) or a repeat of the output's own
# earlier text (the suffix tree over what was generated).
COPY = "copy"
REPEAT = "repeat"
SOURCES = (COPY, REPEAT)


class PlannedSuffixDrafter:
    """A ``SuffixDrafter`` whose drafts are cut to the cost-aware length of a ``MatchPlanner``,
    one planner per source of the draft (``SOURCES``: the prompt or the output, told apart by
    the position the draft copies, ``SuffixDrafter.last_source``).

    It learns how much of each draft was kept from the next context it is given: the tokens
    after the previous context either start with the whole draft (all kept) or leave it at
    the first rejected position (the token emitted there differs from the draft's, for
    greedy and for one-hot sampled drafts alike).
    """

    def __init__(
        self,
        inner: SuffixDrafter,
        costs: Costs,
        *,
        explore_len: int | None = EXPLORE_LEN,
        explore_budget: float | None = EXPLORE_BUDGET,
    ) -> None:
        if not isinstance(inner, SuffixDrafter):
            raise ConfigError("the cost-aware planner needs a suffix drafter")
        if explore_len is not None and explore_len < 1:
            raise ConfigError(f"explore_len must be >= 1 or None, got {explore_len}")
        if explore_budget is not None and not 0.0 <= explore_budget < 1.0:
            raise ConfigError(f"explore_budget must be in [0, 1) or None, got {explore_budget}")
        self.inner = inner
        self.costs = costs
        self.explore_len = explore_len
        self.explore_budget = explore_budget  # None: drafts unbounded in total
        self.name = f"{inner.name}-planned"
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.planners = {s: MatchPlanner(self.costs, self.explore_len) for s in SOURCES}
        self._prompt: int | None = None  # the prompt's length (the first context proposed on)
        # (context len, source, match, draft) of the draft not yet settled
        self._pending: tuple[int, str, int, list[int]] | None = None
        self.regret_s = 0.0  # what this generation's drafts cost over plain steps, net

    def prefill(self, context: Sequence[int]) -> None:
        self.inner.prefill(context)

    def _settle(self, context: Sequence[int]) -> None:
        """Account for the previous draft, now that the context shows what was kept."""
        if self._pending is None:
            return
        start, source, match_len, draft = self._pending
        if len(context) <= start:
            return  # nothing emitted after it yet (rollback within the same round)
        kept = 0
        for tok, got in zip(draft, context[start:], strict=False):
            if tok != got:
                break
            kept += 1
        self.planners[source].observe(match_len, len(draft), kept)
        c = self.costs  # the round against the plain steps of the tokens it emitted
        self.regret_s += c.round_seconds(len(draft)) - (kept + 1) * c.round_seconds(0)
        self._pending = None

    def budget_length(self, context_len: int, wanted: int) -> int:
        """The longest draft, at most ``wanted``, that fits the regret budget: what this
        generation's drafts cost so far, net, plus this one's worst case (all of it rejected)
        within ``explore_budget`` of plain decoding's time for the tokens generated so far
        (and ``EXPLORE_CREDIT`` more)."""
        if self.explore_budget is None:
            return wanted
        c = self.costs
        generated = context_len - (self._prompt if self._prompt is not None else context_len)
        allowance = self.explore_budget * c.round_seconds(0) * (generated + EXPLORE_CREDIT)
        room = allowance - self.regret_s
        n = wanted
        while n > 0 and c.round_seconds(n) - c.round_seconds(0) > room:
            n -= 1
        return n

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
        if self._prompt is None:
            self._prompt = len(context)
        draft = self.inner.propose(context, k, sampling, generator, processor=processor)
        if not draft.tokens:
            return draft
        match_len = self.inner.last_match_len
        src = self.inner.last_source
        source = COPY if src is not None and src < self._prompt else REPEAT
        planner = self.planners[source]
        keep = self.budget_length(len(context), planner.length(match_len, len(draft.tokens)))
        tokens = draft.tokens[:keep]
        if tokens:
            self._pending = (len(context), source, match_len, tokens)
        return Draft(tokens, None)
