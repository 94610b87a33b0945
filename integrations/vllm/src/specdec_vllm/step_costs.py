"""What one engine step costs, learned from the engine's own steps: the verify curve that
sizes the prediction's drafts (``specdec.theory.Costs``).

specdec measures its verify curve once per machine (``specdec profile``). Inside vLLM there is
no such pass to time, and a step's cost depends on the whole batch, so the proposer times
the engine instead: the seconds between two consecutive calls of its ``propose`` are one
engine step (schedule, forward pass over every scheduled token, sampling, rejection, the
proposal), and it knows how many tokens that step verified (each running request's one token
plus the draft it was given). ``StepClock`` keeps the latest seconds per token count and fits
a line through their medians, weighted by how many steps each has:

    seconds(T) = a + b * (T - 1),   a > 0, b >= 0

(a step's fixed cost and its cost per verified token: on a CPU both are large, on a GPU b is
near 0 until the batch fills the chip). A median per count keeps one slow step (the OS, the
API server's own work) from moving the line. Until two counts have ``MIN_SAMPLES`` steps each,
the slope is the prior's, ``PRIOR_SLOPE`` of a step per token (optimistic: drafts get tried,
and then measured), anchored at the one count measured, or at 1.0 before any (the planner
compares rates, so the unit does not matter).

An operator who knows the line (or wants drafts sized the same way whatever the machine
does, as the tests do) fixes it instead (``settings.STEP_COSTS_ENV``).

A sample is taken only from a step that ran back to back with the one before it over the same
requests, each of which sampled a token (no prefill in it, no request joining or leaving), and
the first ``WARMUP`` such steps are dropped (first calls of compiled kernels).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from specdec.theory import Costs

PRIOR_SLOPE = 0.02  # a step's cost per extra token before it is measured (optimistic: flat)
WINDOW = 32  # samples kept per token count (the latest)
MIN_SAMPLES = 3  # a token count is used once it has this many samples
WARMUP = 3  # valid steps dropped at the start
MAX_IDLE = 20.0  # a gap this many times the estimate is idleness, not a step


@dataclass
class StepClock:
    """Seconds per engine step as a function of the tokens it verified."""

    samples: dict[int, deque[float]] = field(default_factory=dict)
    skipped_warmup: int = 0
    # (a, b) given by the server's operator (settings.STEP_COSTS_ENV): the line, never learned
    fixed: tuple[float, float] | None = None

    def observe(self, tokens: int, seconds: float) -> bool:
        """One timed step of ``tokens`` tokens; False when it was not kept (warm-up, or a gap
        too long to be a step)."""
        if tokens < 1 or not seconds > 0:
            return False
        if self.skipped_warmup < WARMUP:
            self.skipped_warmup += 1
            return False
        if self._points() and seconds > MAX_IDLE * self.seconds(tokens):
            return False
        self.samples.setdefault(tokens, deque(maxlen=WINDOW)).append(seconds)
        return True

    def _points(self) -> list[tuple[int, float, int]]:
        """(token count, median seconds, samples) of the counts with enough samples."""
        return sorted(
            (t, statistics.median(s), len(s))
            for t, s in self.samples.items()
            if len(s) >= MIN_SAMPLES
        )

    def line(self) -> tuple[float, float]:
        """(a, b): seconds(T) = a + b * (T - 1)."""
        if self.fixed is not None:
            return self.fixed
        points = self._points()
        if not points:
            return 1.0, PRIOR_SLOPE
        if len(points) == 1:
            t, s, _ = points[0]
            a = s / (1.0 + PRIOR_SLOPE * (t - 1))
            return a, PRIOR_SLOPE * a
        w = sum(n for _, _, n in points)
        mt = sum(n * (t - 1) for t, _, n in points) / w
        ms = sum(n * s for _, s, n in points) / w
        var = sum(n * (t - 1 - mt) ** 2 for t, _, n in points)
        b = max(0.0, sum(n * (t - 1 - mt) * (s - ms) for t, s, n in points) / var)
        a = ms - b * mt
        if a <= 0:  # a line through the origin or below: keep it positive at T = 1
            a = min(s for _, s, _ in points) * 0.5
            b = max(0.0, (ms - a) / mt) if mt > 0 else 0.0
        return a, b

    def seconds(self, tokens: int) -> float:
        a, b = self.line()
        return a + b * (tokens - 1)

    def costs(self, others: int, k: int) -> Costs:
        """The verify curve of one request whose step also carries ``others`` tokens of other
        requests: verify_s[n - 1] = seconds(others + n), n = 1..k + 1."""
        a, b = self.line()
        verify = tuple(a + b * (others + n - 1) for n in range(1, k + 2))
        return Costs(verify_s=verify, prefill_tps=float("inf"))
