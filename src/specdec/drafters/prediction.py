"""Predicted outputs: draft the text the user expects back (OpenAI's ``prediction``).

When a model edits text the user already has (apply a change to a function, rename a variable
through a file, add type hints), most of its output repeats that text. The user passes it as a
*prediction*; this drafter proposes it, from where the output currently stands in it.

State: a ``Cursor`` (the position in the prediction P, token ids tokenized once, of the token
the output is expected to produce next, and any tokens of a replayed edit still due before
it), or None when the output has left the prediction (then ``lost``: where, and when).

* In sync: each round drafts what P holds from the cursor on, cut to the length that the
  target's measured verify curve pays for given the acceptance learned so far
  (``drafters.planned.MatchPlanner``, with priors of its own), up to K (64 by default, where
  the curve is measured); the tokens the round keeps move the cursor on.
* Edits the output made are replayed (``prediction_state.Edits``): once the output has
  rejoined P after an edit, the same change (the same tokens of P replaced, or the same
  insertion after the same token) is drafted wherever P holds it again (a rename through a
  file, a re-indented line), for as long as such drafts are kept more often than not.
* A rejection (the model inserts, deletes or changes tokens) leaves the prediction. From the
  very round whose correction token left it, every round looks for where the output rejoins
  P, at a bounded cost (``drafters.span_index``): the longest suffix of the output (2 to
  ``MAX_MATCH`` tokens) found in P, nearest ahead of where it left; the output's last token
  found just ahead of there (a stretch of P skipped, or an insertion or a replacement that
  has just ended); and, with no evidence yet, the two places an edit that ends now would
  rejoin at: right after the token the output replaced, or at the token it inserted text
  before. Each kind of place has its own learned acceptance (its planner), and the round
  drafts from the place whose draft the cost model values most, or not at all. A draft
  near where the output left (a *rejoin*) continues the prediction's run, so the drafts
  after it are as long as before the edit; a match far away (a *jump*, judged by rates of
  its own: most are coincidences) starts a new run.
* Where the prediction has no place that pays (or is used up), the fallback drafter (the
  pair's own: the planned suffix drafter by default) proposes instead, and sees every
  prefill and rollback so its own state stays in step.

Per round the drafter's work is bounded whatever the prediction's length: the index lookups
of ``span_index.resync_bound`` and a ``SKIP_WINDOW`` scan while lost, and the draft's own
tokens with at most ``prediction_state.MAX_EDIT_CANDIDATES`` edit lookups per token (counted in
``index.probes``).

Drafts are deterministic given the context and carry no probabilities (one-hot q), so the
accept/reject rule keeps the output distribution exactly the target's: with a prediction,
greedy output is the output without it, token for token, and sampled output has the same
distribution. A wrong prediction only costs verify passes, which the planner keeps short once
its drafts stop being kept. Rounds drafted from the prediction are tagged ``source =
"prediction"``, so a generation can report OpenAI's ``accepted_prediction_tokens`` /
``rejected_prediction_tokens`` (``GenerationResult.prediction_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch

from specdec.core.drafter import Draft, Drafter
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.drafters.planned import BUCKETS, EXPLORE_LEN, PRIOR_WEIGHT, MatchPlanner, Rate
from specdec.drafters.prediction_state import (
    Cursor,
    Edit,
    Edits,
    Lost,
    Pending,
    Place,
    kept_prefix,
)
from specdec.drafters.span_index import MAX_MATCH, SKIP_WINDOW, SpanIndex
from specdec.theory import Costs

SOURCE = "prediction"
SINGLE_ANCHOR = 2  # output tokens after leaving during which any one-token anchor may rejoin
REJOIN_WINDOW = SKIP_WINDOW  # a match this near where the output left continues its run

# The kinds of place a draft starts from, each with its own planner (learned acceptance):
SYNC = "sync"  # in sync, by the run of tokens matched since the last jump (BUCKETS)
REJOIN = "rejoin"  # near where the output left, by the match length found (1: one token)
JUMP = "jump"  # a match far from where the output left, by its length
REPLACED = "replaced"  # no evidence: the output replaced P[left_at] and goes on after it
INSERTED = "inserted"  # no evidence: the output inserted text and goes on at P[left_at]
# Priors per match-length bucket (planned.BUCKETS), first token and continuation: a
# prediction is usually the text itself, so even a short match is more often right than a
# suffix match is; a place guessed without evidence is often wrong.
PRIORS: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]] = MappingProxyType(
    {
        SYNC: ((0.35, 0.5, 0.6, 0.7, 0.8, 0.85), (0.8, 0.85, 0.88, 0.9, 0.92, 0.95)),
        REJOIN: ((0.5, 0.6, 0.7, 0.75, 0.8, 0.85), (0.85, 0.88, 0.9, 0.92, 0.94, 0.95)),
        JUMP: ((0.2, 0.3, 0.4, 0.5, 0.6, 0.7), (0.6, 0.7, 0.75, 0.8, 0.85, 0.9)),
        REPLACED: ((0.3,) * 6, (0.9,) * 6),
        INSERTED: ((0.2,) * 6, (0.9,) * 6),
    }
)
assert all(len(f) == len(c) == len(BUCKETS) for f, c in PRIORS.values())
# How many rounds each prior is worth: in sync the prior holds for longer (a prediction is
# mostly the output, and a few drafts that ran into edits early on must not shorten every
# later draft), elsewhere it yields to the request's own rounds after a couple of them
PRIOR_WEIGHTS: Mapping[str, float] = MappingProxyType({SYNC: 8.0})


def prediction_planners(
    costs: Costs, explore_len: int | None = EXPLORE_LEN
) -> dict[str, MatchPlanner]:
    """One ``MatchPlanner`` per kind of place, with the prediction drafter's priors."""
    out = {}
    for kind, (f, c) in PRIORS.items():
        w = PRIOR_WEIGHTS.get(kind, PRIOR_WEIGHT)
        first = [Rate(p, weight=w) for p in f]
        out[kind] = MatchPlanner(
            costs, explore_len, first=first, cont=[Rate(p, weight=w) for p in c]
        )
    return out


class PredictionDrafter:
    """Drafts a prediction (token ids) from where the output stands in it; see the module
    docstring. ``fallback`` drafts where the prediction has no match (None: nothing);
    ``costs`` size the drafts (None: as long as K allows, from the in-sync place or the
    longest match, for tests and tools without a measured target)."""

    def __init__(
        self,
        prediction: Sequence[int],
        *,
        costs: Costs | None,
        fallback: Drafter | None = None,
    ) -> None:
        self.index = SpanIndex(prediction)
        self.costs = costs
        self.fallback = fallback
        self.name = SOURCE + (f"+{fallback.name}" if fallback is not None else "")
        self.reset()

    def reset(self) -> None:
        self.planners = prediction_planners(self.costs) if self.costs is not None else None
        self.edits = Edits(self.index)
        self.cursor: Cursor | None = Cursor(0)  # the output starts at the prediction's start
        self.run = 0  # output tokens matched since the start or the last jump
        self.lost: Lost | None = None  # set whenever the cursor is None
        self._start: int | None = None  # context length where the output begins
        self._seen = 0  # context length already walked
        self._pending: Pending | None = None
        if self.fallback is not None:
            self.fallback.reset()

    @property
    def pos(self) -> int | None:
        """The prediction position the output stands at (None: it left the prediction)."""
        return None if self.cursor is None else self.cursor.pos

    def report(self) -> dict[str, int]:
        """What a generation's result records: the prediction's length in tokens (the result
        then reports accepted / rejected prediction tokens, ``prediction_tokens``)."""
        return {"prediction_tokens": len(self.index)}

    def begin(self, prompt: Sequence[int]) -> None:
        """The output starts after ``prompt``. For an engine whose first proposal for a request
        comes after its first output token (vLLM drafts after each step's sampling, so its
        first context is the prompt and one token): without this call, the first context
        given is taken for the prompt. Call it before the first ``propose``."""
        assert self._start is None, "begin() comes before the first propose"
        self._start = self._seen = len(prompt)

    def set_costs(self, costs: Costs) -> None:
        """Size the next drafts by ``costs`` (an engine whose cost per pass changes with its
        batch); what the planners learned about acceptance is kept (a drafter made without
        costs gets its planners now)."""
        self.costs = costs
        if self.planners is None:
            self.planners = prediction_planners(costs)
        for planner in self.planners.values():
            planner.costs = costs

    def prefill(self, context: Sequence[int]) -> None:
        if self.fallback is not None:
            self.fallback.prefill(context)

    def rollback(self, context: Sequence[int]) -> None:
        self._walk(context)
        if self.fallback is not None:
            self.fallback.rollback(context)

    # ----------------------------------------------------------------- the edited stream
    def stream(
        self, cursor: Cursor, n: int
    ) -> tuple[list[int], list[Cursor], list[tuple[int, Edit]]]:
        """Up to n tokens of the prediction as edited, from ``cursor``: the tokens, the cursor
        after each, and the edits replayed (offset of the first token they change, edit)."""
        toks = self.index.tokens
        out: list[int] = []
        after: list[Cursor] = []
        replayed: list[tuple[int, Edit]] = []
        c = cursor
        while len(out) < n:
            if c.queue:
                out.append(c.queue[0])
                c = Cursor(c.pos, c.queue[1:], c.spliced, c.at)
                after.append(c)
                continue
            if c.pos >= len(toks):
                break
            edit = self.edits.at(c.pos, c.spliced)
            if edit is not None:
                replayed.append((len(out), edit))
                c = Cursor(c.pos + len(edit.deleted), edit.inserted, not edit.deleted, c.pos)
                continue
            out.append(toks[c.pos])
            c = Cursor(c.pos + 1)
            after.append(c)
        return out, after, replayed

    def _follow(self, cursor: Cursor, tokens: Sequence[int], offset: int) -> None:
        """Walk ``tokens`` (context positions from ``offset``) from ``cursor``: in sync while
        they are the edited prediction's, lost at the first that is not."""
        c: Cursor | None = cursor
        for i, t in enumerate(tokens):
            if c is None:
                assert self.lost is not None
                self.lost.since += 1
                continue
            nxt, after, _ = self.stream(c, 1)
            if nxt and nxt[0] == t:
                c = after[0]
                self.run += 1
            else:
                self.lost = Lost(c.left_at, offset + i, 1)
                c = None
        self.cursor = c

    # ------------------------------------------------------------------ the bookkeeping
    def _settle(self, context: Sequence[int]) -> int:
        """The previous draft's account, now that the context shows what it kept: the
        planners and the replayed edits learn, a rejoin teaches its edit, and the cursor
        moves past the kept tokens (a draft from a place that was not the output's is
        undone). Returns the context length walked."""
        p = self._pending
        if p is None or len(context) <= p.start:
            return self._seen
        self._pending = None
        kept = kept_prefix(p.tokens, context[p.start :])
        if self.planners is not None:
            self.planners[p.place.kind].observe(p.place.match, len(p.tokens), kept)
        for offset, edit in p.replayed:
            if kept >= offset and offset < len(p.tokens):
                edit.rate.add(kept > offset)
        if kept == 0:
            if p.lost is not None:  # not where the output went: still lost
                self.cursor, self.lost = None, p.lost
            return p.start
        if p.lost is not None and p.place.kind != JUMP:
            self._learn(p, context)
        self.cursor, self.lost = p.after[kept - 1], None
        self.run += kept
        return p.start + kept

    def _learn(self, p: Pending, context: Sequence[int]) -> None:
        """The edit a confirmed rejoin closes: what the output put in place of P[left_at:r]
        (r: where it rejoined; for a match, where the matched tokens start)."""
        lost, place = p.lost, p.place
        assert lost is not None and self._start is not None
        back = place.match if place.kind == REJOIN else 0
        r, o = place.cursor.pos - back, p.start - back
        if r < lost.left_at or o < lost.out_at or lost.left_at < 1:
            return
        toks = self.index.tokens
        self.edits.learn(toks[lost.left_at - 1], toks[lost.left_at : r], context[lost.out_at : o])

    def _walk(self, context: Sequence[int]) -> None:
        """Follow the tokens the output gained since the last call through the prediction."""
        if self._start is None:  # the first call: the context is the prompt
            self._start = self._seen = len(context)
            return
        seen = max(self._seen, self._settle(context))
        if self.cursor is not None:
            self._follow(self.cursor, context[seen:], seen)
        elif self.lost is not None:
            self.lost.since += max(0, len(context) - seen)
        self._seen = len(context)

    # ---------------------------------------------------------------- where to draft
    def places(self, context: Sequence[int]) -> list[Place]:
        """Where a draft may start, strongest evidence first (one place per position)."""
        if self.cursor is not None:
            return [Place(self.cursor, SYNC, max(1, min(self.run, MAX_MATCH)))]
        lost = self.lost
        assert lost is not None and self._start is not None
        output = context[self._start :]
        out: list[tuple[int, str, int]] = []
        found = self.index.resync(output[-MAX_MATCH:], lost.left_at)
        if found is not None:
            j, m = found
            near = abs(j - lost.left_at) <= REJOIN_WINDOW
            out.append((j, REJOIN if near else JUMP, m))
        if output:
            # the output's last token just ahead: an edit ending, or (soon after leaving)
            # a stretch of the prediction skipped
            window = SKIP_WINDOW if lost.since <= SINGLE_ANCHOR else 2
            j1 = self.index.skip_to(int(output[-1]), lost.left_at, window)
            if j1 is not None:
                out.append((j1, REJOIN, 1))
        out.append((lost.left_at + 1, REPLACED, 1))
        out.append((lost.left_at, INSERTED, 1))
        seen: set[int] = set()
        places = []
        for at, kind, m in out:
            if at not in seen and at < len(self.index):
                seen.add(at)
                places.append(Place(Cursor(at), kind, m))
        return places

    def _choose(self, places: list[Place], k: int) -> tuple[Place, Pending] | None:
        """The place the planners value most and its draft (None: no draft pays)."""
        best: tuple[float, Place, int] | None = None
        drafts = {}
        for p in places:
            if self.planners is None and p.kind not in (SYNC, REJOIN, JUMP):
                continue  # no costs: the first place with evidence, as far as K allows
            drafts[p] = self.stream(p.cursor, k)
            n = len(drafts[p][0])
            if self.planners is None:
                if n:
                    best = (0.0, p, n)
                    break
                continue
            length, rate = self.planners[p.kind].plan(p.match, n)
            if length > 0 and (best is None or rate > best[0]):
                best = (rate, p, length)
        if best is None:
            return None
        _, place, length = best
        tokens, after, replayed = drafts[place]
        pending = Pending(
            start=0,
            place=place,
            tokens=tuple(tokens[:length]),
            after=tuple(after[:length]),
            replayed=tuple((o, e) for o, e in replayed if o < length),
            lost=None,
        )
        return place, pending

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
        used_up = self.cursor is not None and not self.stream(self.cursor, 1)[0]
        if k > 0 and not used_up:
            choice = self._choose(self.places(context), k)
            if choice is not None:
                place, pending = choice
                lost = self.lost if self.cursor is None else None
                if lost is not None and place.kind == JUMP:  # a new run
                    self.run = place.match
                self._pending = Pending(
                    len(context), place, pending.tokens, pending.after, pending.replayed, lost
                )
                return Draft(list(pending.tokens), None, source=SOURCE)
            if self.cursor is not None:
                return Draft([], None)  # drafting here would not pay: a plain step
        if self.fallback is not None:
            return self.fallback.propose(context, k, sampling, generator, processor=processor)
        return Draft([], None)
