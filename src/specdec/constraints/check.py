"""Constraints checked in worker processes with a deadline and a memory limit, before any
matcher is built where generation runs.

A request's schema or grammar is input from anyone who can reach the server. The engine
bounds most of what a grammar costs (its own fuel limits; ``engine.LIMITS``), but not every
step: a regular expression with nested counted repetitions took 1.5 s and 240 MB to its first
mask here, and the JSON converters recurse. So each new constraint is tried first in a worker
process (``constraints.child``) that holds the model's vocabulary: the grammar is built, a
matcher made and its first mask computed there, under ``RLIMIT_AS`` (``memory_bytes`` above
the worker's size) and a deadline (``seconds``) after which the worker is killed; either way
the request gets one line naming its field. A constraint that passed is remembered (the
grammar text, by the constraint), so a client that sends the same schema every time pays the
check once. Up to ``max_workers`` checks run at once; a worker starts once (about 1-2 s: an
interpreter and the engine's vocabulary) and is reused.

Where no worker can run (not a POSIX system), the check runs in this process (the engine's
own limits still apply).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from specdec.constraints.engine import engine, grammar_text, vocabulary
from specdec.constraints.probe import first_mask_error
from specdec.constraints.spec import Constraint, ConstraintError
from specdec.constraints.tokens import TokenTable
from specdec.util.workers import WorkerProcess, WorkerUnavailable

CHILD = "specdec.constraints.child"
START_TIMEOUT_S = 120.0  # a worker's start: an interpreter and the vocabulary (a loaded machine)


@dataclass(frozen=True)
class CheckLimits:
    """What checking one constraint may cost."""

    seconds: float = 10.0
    memory_bytes: int = 1 << 30
    max_workers: int = 2
    remembered: int = 256  # constraints that passed, kept by their text


class GrammarChecker:
    """Checks constraints over one vocabulary (module docstring); ``check`` returns the
    grammar text the engine's matcher takes, or raises ConstraintError naming the field."""

    def __init__(self, table: TokenTable, limits: CheckLimits | None = None) -> None:
        self.table = table
        self.limits = limits or CheckLimits()
        self._lock = threading.Lock()
        self._idle: list[WorkerProcess] = []
        self._slots = threading.BoundedSemaphore(self.limits.max_workers)
        self._passed: OrderedDict[tuple[str, str, str | None], str] = OrderedDict()
        self._here: Any = None  # the engine's vocabulary in this process (no workers)
        self.unavailable: str | None = None if os.name == "posix" else "not a POSIX system"

    def check(self, c: Constraint) -> str:
        engine(c.field)  # the one-line refusal when the engine is not installed
        key = (c.kind, c.source, c.trigger)
        with self._lock:
            if key in self._passed:
                self._passed.move_to_end(key)
                return self._passed[key]
        text = self._check(c)
        with self._lock:
            self._passed[key] = text
            while len(self._passed) > self.limits.remembered:
                self._passed.popitem(last=False)
        return text

    def _check(self, c: Constraint) -> str:
        try:
            with self._slots:
                return self._in_worker(c)
        except WorkerUnavailable:
            return self._in_process(c)

    def _in_worker(self, c: Constraint) -> str:
        worker = self._take()
        request = {
            "kind": c.kind,
            "source": c.source,
            "field": c.field,
            "trigger": c.trigger,
            "memory_bytes": self.limits.memory_bytes,
        }
        reply = worker.request(request, self.limits.seconds)
        if reply is None:
            worker.kill()
            raise ConstraintError(
                c.field,
                f"the {c.kind} took more than {self.limits.seconds:g} s or "
                f"{self.limits.memory_bytes >> 20} MiB to compile; refused",
            )
        if reply.get("fatal"):
            worker.kill()
        else:
            with self._lock:
                self._idle.append(worker)
        if "error" in reply:
            raise ConstraintError(c.field, f"invalid {c.kind}: {reply['error']}")
        return str(reply["grammar"])

    def _in_process(self, c: Constraint) -> str:
        with self._lock:
            if self._here is None:
                self._here = vocabulary(self.table)
        text = grammar_text(c)
        error = first_mask_error(self._here, text)
        if error:
            raise ConstraintError(c.field, f"invalid {c.kind}: {error}")
        return text

    def _take(self) -> WorkerProcess:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                worker.kill()
            if self.unavailable is not None:
                raise WorkerUnavailable(self.unavailable)
        hello = {
            "pieces": [p.decode("latin-1") for p in self.table.pieces],
            "special": sorted(self.table.special),
            "eos": list(self.table.eos),
        }
        try:
            return WorkerProcess(CHILD, START_TIMEOUT_S, hello)
        except WorkerUnavailable as e:
            with self._lock:
                self.unavailable = str(e)
            raise

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.close()
