"""Where the time of ``certify --endpoint`` goes: wall seconds per phase, requests and retries
per side, seconds per request; an estimate of the time left, and a warning when one side is
much slower per request than the other (an oversubscribed server: on a small machine,
llama-cpp-python's default ``n_threads_batch`` = all cores makes every verification pass of a
prompt-lookup server fight the other server for the CPU)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

SLOW_RATIO = 5.0  # one side's median request this many times the other's: say so
SLOW_MIN_REQUESTS = 8  # per side, before judging
REPORT_EVERY_S = 15.0


@dataclass
class Pace:
    """Timing of one certify run (``seconds`` are wall time, monotonic clock)."""

    log: Callable[[str], None] = lambda _: None
    phases: dict[str, float] = field(default_factory=dict)
    request_s: dict[str, list[float]] = field(default_factory=lambda: {"on": [], "off": []})
    retries: dict[str, int] = field(default_factory=lambda: {"on": 0, "off": 0})
    reused: int = 0  # replies read back from the progress file (--resume)
    slow_note: str | None = None
    current: str | None = None  # the phase running now
    _t0: float = field(default_factory=time.monotonic)
    _last_report: float = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.monotonic()
        self.current = name
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - t

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def request(self, side: str, e2e_s: float, attempts: int) -> None:
        """One request's time; ``side`` is on, off, or another kind (e.g. score)."""
        self.request_s.setdefault(side, []).append(e2e_s)
        self.retries[side] = self.retries.get(side, 0) + max(0, attempts - 1)
        if self.slow_note is None:
            self.slow_note = self._slow()
            if self.slow_note:
                self.log(f"warning: {self.slow_note}")

    def _slow(self) -> str | None:
        on, off = self.request_s["on"], self.request_s["off"]
        if len(on) < SLOW_MIN_REQUESTS or len(off) < SLOW_MIN_REQUESTS:
            return None
        m_on, m_off = statistics.median(on), statistics.median(off)
        slow, fast, ratio = (
            ("spec-on", "spec-off", m_on / m_off)
            if m_on > m_off
            else (
                "spec-off",
                "spec-on",
                m_off / m_on if m_on > 0 else float("inf"),
            )
        )
        if ratio < SLOW_RATIO:
            return None
        return (
            f"{slow} requests take {ratio:.0f}x as long as {fast} ones (median "
            f"{max(m_on, m_off):.2f} s vs {min(m_on, m_off):.2f} s): is that server short of "
            "CPU? (llama-cpp-python: pass --n_threads_batch as well as --n_threads)"
        )

    def progress(self, what: str, done: int, total: int, started: float) -> None:
        """A line every REPORT_EVERY_S seconds with the estimated time left for ``what``."""
        now = time.monotonic()
        if done < total and now - self._last_report < REPORT_EVERY_S:
            return
        self._last_report = now
        spent = now - started
        left = spent / done * (total - done) if done else float("nan")
        eta = f", about {_duration(left)} left" if done and done < total else ""
        self.log(f"{what}: {done}/{total} requests in {_duration(spent)}{eta}")

    def to_dict(self) -> dict[str, Any]:
        def side(xs: list[float]) -> dict[str, Any]:
            return {
                "requests": len(xs),
                "seconds": sum(xs),
                "median_s": statistics.median(xs) if xs else None,
                "max_s": max(xs) if xs else None,
            }

        out: dict[str, Any] = {
            "total_s": time.monotonic() - self._t0,
            "phases_s": dict(self.phases),
        }
        for name, xs in self.request_s.items():
            out[name] = side(xs) | {"retries": self.retries.get(name, 0)}
        return out | {"reused_from_progress": self.reused, "slow_side": self.slow_note}


def _duration(s: float) -> str:
    if s != s:  # nan
        return "?"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
