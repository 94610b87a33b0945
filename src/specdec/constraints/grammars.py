"""``Grammars``: the constraints of one target model. It owns what is built once per model
(the token table, the engine's vocabulary, the checker's workers) and makes each request's
``GrammarProcessor``: the constraint checked (``constraints.check``, remembered), then a
matcher copied from the grammar's first one (matchers are made once per grammar text).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from specdec.constraints.check import CheckLimits, GrammarChecker
from specdec.constraints.engine import vocabulary
from specdec.constraints.probe import new_matcher
from specdec.constraints.processor import GrammarProcessor
from specdec.constraints.spec import Constraint, ConstraintError
from specdec.constraints.tokens import TokenTable, token_table
from specdec.core.model import CausalLM

KEPT_MATCHERS = 64


class Grammars:
    """Constraints over ``model``'s vocabulary (the target: rows and drafts use its ids)."""

    def __init__(self, model: CausalLM, limits: CheckLimits | None = None) -> None:
        self.model = model
        self.limits = limits
        self._lock = threading.Lock()
        self._table: TokenTable | None = None
        self._vocab: Any = None
        self._checker: GrammarChecker | None = None
        self._matchers: OrderedDict[str, Any] = OrderedDict()

    @property
    def table(self) -> TokenTable:
        with self._lock:
            if self._table is None:
                self._table = token_table(self.model)
            return self._table

    def check(self, c: Constraint) -> str:
        """The grammar text of ``c`` (checked in a worker, remembered), or ConstraintError."""
        table = self.table
        with self._lock:
            if self._checker is None:
                self._checker = GrammarChecker(table, self.limits)
            checker = self._checker
        if c.trigger is not None and table.id_of(c.trigger) is None:
            raise ConstraintError(c.field, f"the vocabulary has no token {c.trigger!r}")
        return checker.check(c)

    def processor(self, c: Constraint, prompt_len: int) -> GrammarProcessor:
        """A fresh processor of ``c`` for one generation after ``prompt_len`` prompt tokens."""
        text = self.check(c)
        table = self.table
        with self._lock:
            if self._vocab is None:
                self._vocab = vocabulary(table)
            first = self._matchers.get(text)
            if first is None:
                first = new_matcher(self._vocab, text)
                self._matchers[text] = first
                while len(self._matchers) > KEPT_MATCHERS:
                    self._matchers.popitem(last=False)
            else:
                self._matchers.move_to_end(text)
            matcher = first.deep_copy()
        if matcher.is_error():  # checked above; the engine's own vocabulary may differ
            raise ConstraintError(c.field, f"invalid {c.kind}: {matcher.get_error()[:300]}")
        trigger = None if c.trigger is None else table.id_of(c.trigger)
        return GrammarProcessor(
            matcher, table.vocab_size, table.eos, prompt_len, trigger, field=c.field
        )

    def close(self) -> None:
        with self._lock:
            checker, self._checker = self._checker, None
        if checker is not None:
            checker.close()
