"""Where the output stands in a prediction (``drafters.prediction``): the cursor in it, the
edits the output made and replays, the places a draft may start from, and a draft that is
not yet settled. Plain records and the edit table; the drafter's decisions are in
``prediction.PredictionDrafter``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.drafters.planned import Rate
from specdec.drafters.span_index import SpanIndex

# Edits learned from the output (``Edits``): how long, how many, and when they stop replaying
MAX_DELETED = 16  # tokens of P an edit replaces
MAX_INSERTED = 32  # tokens it puts there
MAX_EDITS = 64  # edits kept per generation (the latest win)
MAX_EDIT_CANDIDATES = 4  # replacements looked at per position (the latest ones)
EDIT_PRIOR = 0.6  # an edit's prior rate of being kept where it is replayed
EDIT_MIN_RATE = 0.5  # it is replayed while its rate's mean is at least this


@dataclass(frozen=True)
class Cursor:
    """Where the output stands in the prediction as edited: its next token is ``queue[0]``
    (what a replayed edit puts in place of P[at:pos]) or, with no queue, P[pos]. ``spliced``:
    an insertion was replayed at pos already (so it is not replayed there twice)."""

    pos: int
    queue: tuple[int, ...] = ()
    spliced: bool = False
    at: int = -1  # where the replayed edit starts in P (while its tokens are due)

    @property
    def left_at(self) -> int:
        """Where the output leaves P when it does not produce this cursor's next token."""
        return self.at if self.queue else self.pos


@dataclass
class Edit:
    """The output put ``inserted`` where P has ``deleted`` (after the token ``left`` when
    nothing was deleted); ``rate``: how often replaying it kept its first changed token."""

    deleted: tuple[int, ...]
    inserted: tuple[int, ...]
    left: int
    rate: Rate


class Edits:
    """The edits a generation made, replayed where P holds what they changed: replacements
    looked up by their first deleted token, insertions by the token before them."""

    def __init__(self, index: SpanIndex) -> None:
        self.index = index
        self._replacing: dict[int, list[Edit]] = {}  # deleted[0] -> edits, latest last
        self._inserting: dict[int, Edit] = {}  # left -> the latest insertion after it
        self._order: list[Edit] = []

    def __len__(self) -> int:
        return len(self._order)

    def learn(self, left: int, deleted: Sequence[int], inserted: Sequence[int]) -> None:
        """The output replaced ``deleted`` (after ``left``) with ``inserted``."""
        d, ins = tuple(deleted), tuple(inserted)
        if not (d or ins) or len(d) > MAX_DELETED or len(ins) > MAX_INSERTED:
            return
        same = self._find(left, d)
        if same is not None and same.inserted == ins:
            return
        if same is not None:
            self._drop(same)
        edit = Edit(d, ins, left, Rate(EDIT_PRIOR))
        if d:
            self._replacing.setdefault(d[0], []).append(edit)
        else:
            self._inserting[left] = edit
        self._order.append(edit)
        if len(self._order) > MAX_EDITS:
            self._drop(self._order[0])

    def _find(self, left: int, deleted: tuple[int, ...]) -> Edit | None:
        if not deleted:
            return self._inserting.get(left)
        return next((e for e in self._replacing.get(deleted[0], []) if e.deleted == deleted), None)

    def _drop(self, edit: Edit) -> None:
        self._order.remove(edit)
        if edit.deleted:
            self._replacing[edit.deleted[0]].remove(edit)
        else:
            del self._inserting[edit.left]

    def at(self, pos: int, spliced: bool) -> Edit | None:
        """The edit to replay at P[pos], if any is in good standing: a replacement of the
        tokens starting there (the longest), else an insertion after P[pos - 1] (unless one
        was replayed at pos already)."""
        toks = self.index.tokens
        best: Edit | None = None
        if pos < len(toks):
            for e in self._replacing.get(toks[pos], [])[-MAX_EDIT_CANDIDATES:]:
                self.index.probes += len(e.deleted)
                n = len(e.deleted)
                if (
                    e.rate.mean >= EDIT_MIN_RATE
                    and tuple(toks[pos : pos + n]) == e.deleted
                    and (best is None or n > len(best.deleted))
                ):
                    best = e
        if best is None and not spliced and pos >= 1:
            self.index.probes += 1
            ins = self._inserting.get(toks[pos - 1])
            if ins is not None and ins.rate.mean >= EDIT_MIN_RATE:
                best = ins
        return best


@dataclass(frozen=True)
class Place:
    """Where a draft from the prediction may start: ``cursor``, of this kind, on a match of
    ``match`` tokens (1 for an anchor or a guess)."""

    cursor: Cursor
    kind: str
    match: int


@dataclass
class Lost:
    """The output left the prediction at P[left_at] (the position it did not produce), with
    its context token ``out_at`` (the divergent one), ``since`` output tokens ago."""

    left_at: int
    out_at: int
    since: int


@dataclass(frozen=True)
class Pending:
    """A draft proposed at context length ``start``, not yet settled: from ``place``, its
    tokens and the cursor after each, the edits it replayed (offset of the first changed
    token, edit), and ``lost`` the state to return to when its first token is not kept
    (None: it was drafted in sync)."""

    start: int
    place: Place
    tokens: tuple[int, ...]
    after: tuple[Cursor, ...]
    replayed: tuple[tuple[int, Edit], ...]
    lost: Lost | None


def kept_prefix(draft: Sequence[int], got: Sequence[int]) -> int:
    """Leading draft tokens that the context kept."""
    kept = 0
    for tok, have in zip(draft, got, strict=False):
        if tok != have:
            break
        kept += 1
    return kept
