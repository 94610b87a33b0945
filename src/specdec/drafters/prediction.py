"""Predicted outputs: draft the text the user expects back (OpenAI's ``prediction``).

When a model edits text the user already has (apply a change to a function, rename a variable
through a file, add type hints), most of its output repeats that text. The user passes it as a
*prediction*; this drafter proposes it, from where the output currently stands in it.

State: ``pos``, the index in the prediction P (token ids, tokenized once) of the token the
output is expected to produce next, or None when the output has left the prediction.

* In sync: each round drafts P[pos:], cut to the length that the target's measured verify
  curve pays for given the acceptance learned so far (``drafters.planned.MatchPlanner``, with
  priors of its own); the tokens the round keeps move ``pos`` on while they equal P's.
* A divergence (the model inserts, deletes or changes tokens) leaves the prediction. Each
  later round tries to re-synchronise: the longest suffix of the output (2 to ``MAX_MATCH``
  tokens) that occurs in P, the occurrence nearest ahead of where the output left P first,
  then the nearest behind; or, within ``SINGLE_ANCHOR`` tokens of leaving it, the last token
  alone where it first occurs within ``SKIP_WINDOW`` tokens from where the output left (a
  token replaced, or part of P skipped). Drafting resumes after the match, its length learned
  per match length: a 1-token anchor is often a coincidence, and a draft after one is short
  until such drafts prove kept.
* Where the prediction has no match (or is used up), the fallback drafter (the pair's own:
  suffix / planned by default) proposes instead, and sees every prefill and rollback so its
  own state stays in step.

Drafts are deterministic given the context and carry no probabilities (one-hot q), so the
accept/reject rule keeps the output distribution exactly the target's: with a prediction,
greedy output is the output without it, token for token, and sampled output has the same
distribution. A wrong prediction only costs verify passes, which the planner keeps short once
its drafts stop being kept. Rounds drafted from the prediction are tagged ``source =
"prediction"``, so a generation can report OpenAI's ``accepted_prediction_tokens`` /
``rejected_prediction_tokens`` (``GenerationResult.prediction_tokens``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.planned import BUCKETS, EXPLORE_LEN, MatchPlanner, Rate
from specdec.sampling import SamplingConfig
from specdec.theory import Costs

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
            return self.fallback.propose(context, k, sampling, generator)
        return Draft([], None)
