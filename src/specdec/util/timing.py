"""Accumulating wall-clock sections (draft / verify / sampling / ...), no global state."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """Accumulates perf_counter time per named section; sections may not nest."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._open: str | None = None

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        assert self._open is None, f"section {name!r} opened inside {self._open!r}"
        self._open = name
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] += time.perf_counter() - t0
            self._open = None

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)
