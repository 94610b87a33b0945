"""specdec's prediction drafter for an engine that proposes for a whole batch once per step.

vLLM calls its proposer after every step with the batch's rows: each running request's
tokens so far (prompt and accepted output; rejected drafts are never in them) and how many
tokens the step sampled for it. ``PredictionDrafts.step`` turns that into one draft per row:

- a request with a prediction is drafted by its own ``specdec.drafters.prediction.
  PredictionDrafter`` (the same class ``specdec generate --prediction`` uses: cursor,
  re-sync after edits, replayed edits, learned acceptance), made at its first step and
  told where its output starts (``begin``: vLLM's first proposal comes after the first
  output token); its drafts are sized by the cost model of specdec's planner on the
  engine's own step costs (``step_costs.StepClock``), up to the engine's K, and never past
  the request's remaining tokens. Where the prediction has no place that pays, the row gets
  no draft (a plain step): every draft of such a request is a prediction draft, so vLLM's
  per-request draft counters are OpenAI's prediction counts (``wire.counts``).
- a request without one gets the fallback's draft (vLLM's n-gram lookup in the plugin).
- a row that sampled nothing this step (a prefill chunk) or has no room left gets none.

The drafts carry no probabilities, so vLLM's rejection sampler treats them as one-hot: the
output is the target's, greedy token for token, sampled in distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.core.sampling import SamplingConfig
from specdec.drafters.prediction import PredictionDrafter
from specdec_vllm.step_costs import StepClock


@dataclass(frozen=True)
class Row:
    """One request in one engine step."""

    req_id: str
    context: Sequence[int]  # prompt + accepted output so far, the sampled tokens included
    prompt_len: int
    sampled: int  # tokens this step sampled for it (0: a prefill chunk, nothing to draft on)
    room: int  # most draft tokens it can use (its remaining max_tokens and window, less one)
    prediction: Sequence[int] | None = None  # token ids; None: no prediction


# the fallback: the indices of the rows without a prediction -> a draft for each of them
Fallback = Callable[[list[int]], list[list[int]]]


@dataclass
class PredictionDrafts:
    """Per-request prediction drafters, and the step clock that sizes their drafts."""

    k: int  # the engine's most draft tokens per request and step (num_speculative_tokens)
    clock: StepClock = field(default_factory=StepClock)
    requests: dict[str, PredictionDrafter] = field(default_factory=dict)
    # the previous step's rows (request ids in order) and the tokens each verified next
    _last_ids: tuple[str, ...] = ()
    _last_tokens: dict[str, int] = field(default_factory=dict)
    _generator: torch.Generator = field(default_factory=torch.Generator)
    _sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def step(
        self, rows: Sequence[Row], elapsed_s: float | None, fallback: Fallback | None = None
    ) -> list[list[int]]:
        """One draft per row. ``elapsed_s``: seconds since the previous call (None: not
        timed), a sample of the previous step's cost when that step qualifies."""
        ids = tuple(r.req_id for r in rows)
        if (
            elapsed_s is not None
            and ids == self._last_ids
            and rows
            and all(r.sampled > 0 for r in rows)
        ):
            self.clock.observe(sum(self._last_tokens.values()), elapsed_s)
        live = set(ids)
        for gone in [r for r in self.requests if r not in live]:
            del self.requests[gone]

        drafts: list[list[int]] = [[] for _ in rows]
        plain = [i for i, r in enumerate(rows) if r.prediction is None and self._can_draft(r)]
        if fallback is not None and plain:
            for i, d in zip(plain, fallback(plain), strict=True):
                drafts[i] = list(d[: max(0, rows[i].room)])
        for i, r in enumerate(rows):
            if r.prediction is not None:
                drafts[i] = self._predicted(i, rows, drafts)
        self._last_ids = ids
        self._last_tokens = {r.req_id: 1 + len(d) for r, d in zip(rows, drafts, strict=True)}
        return drafts

    def _can_draft(self, row: Row) -> bool:
        return row.sampled > 0 and row.room > 0 and self.k > 0

    def _predicted(self, i: int, rows: Sequence[Row], drafts: list[list[int]]) -> list[int]:
        row = rows[i]
        assert row.prediction is not None
        drafter = self.requests.get(row.req_id)
        if drafter is None:
            drafter = PredictionDrafter(row.prediction, costs=None)
            drafter.begin(row.context[: row.prompt_len])
            self.requests[row.req_id] = drafter
        if not self._can_draft(row):
            # not proposed on this step: the drafter still follows the output (so a later
            # step walks only what is new), and drafts nothing
            drafter.rollback(row.context)
            return []
        # the other rows' tokens in this step: one each, plus their drafts as last time
        # (this step's are being decided now)
        others = sum(
            1 + len(drafts[j]) if r.prediction is None else self._last_tokens.get(r.req_id, 1)
            for j, r in enumerate(rows)
            if j != i
        )
        k = min(self.k, row.room)
        drafter.set_costs(self.clock.costs(others, self.k))
        draft = drafter.propose(row.context, k, self._sampling, self._generator)
        return list(draft.tokens[:k])
