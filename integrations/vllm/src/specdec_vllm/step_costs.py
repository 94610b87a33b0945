"""What one engine step costs, learned from the engine's own steps: the verify curve that
sizes the prediction's drafts (``specdec.theory.Costs``).

specdec measures its verify curve once per machine (``specdec profile``). Inside vLLM there is
no such pass to time, and a step's cost depends on the whole batch, so the proposer times
the engine instead: the seconds between two consecutive calls of its ``propose`` are one
engine step (schedule, forward pass over every scheduled token, sampling, rejection, the
proposal), and it knows how many tokens that step verified (each running request's one token
plus the draft it was given). ``StepClock`` keeps the recent seconds per token count and
answers ``seconds(T)``: the median of the steps seen with T tokens, interpolated between the
counts seen (and made non-decreasing); past the largest count seen it extrapolates with a
small slope (``PRIOR_SLOPE`` of a step per token), so drafts longer than any tried look
cheap, get tried, and are then measured. Before any step is timed, a step of T tokens is
taken to cost 1 + PRIOR_SLOPE * (T - 1) (the planner compares rates, so the unit does not
matter).

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

    def observe(self, tokens: int, seconds: float) -> bool:
        """One timed step of ``tokens`` tokens; False when it was not kept (warm-up, or a gap
        too long to be a step)."""
        if tokens < 1 or not seconds > 0:
            return False
        if self.skipped_warmup < WARMUP:
            self.skipped_warmup += 1
            return False
        if self._measured() and seconds > MAX_IDLE * self.seconds(tokens):
            return False
        self.samples.setdefault(tokens, deque(maxlen=WINDOW)).append(seconds)
        return True

    def _measured(self) -> list[tuple[int, float]]:
        """(token count, median seconds) of the counts with enough samples, by count."""
        return sorted(
            (t, statistics.median(s)) for t, s in self.samples.items() if len(s) >= MIN_SAMPLES
        )

    def curve(self, counts: range) -> list[float]:
        """seconds(T) for each T in ``counts`` (ascending, T >= 1): a non-decreasing curve."""
        points = self._measured()
        out: list[float] = []
        for t in counts:
            out.append(_at(points, t))
        for i in range(1, len(out)):  # a longer step never costs less
            out[i] = max(out[i], out[i - 1])
        return out

    def seconds(self, tokens: int) -> float:
        return _at(self._measured(), tokens)

    def costs(self, others: int, k: int) -> Costs:
        """The verify curve of one request whose step also carries ``others`` tokens of other
        requests: verify_s[n - 1] = seconds(others + n), n = 1..k + 1."""
        verify = self.curve(range(others + 1, others + k + 2))
        return Costs(verify_s=tuple(verify), prefill_tps=float("inf"))


def _at(points: list[tuple[int, float]], t: int) -> float:
    """seconds(t) from measured (count, seconds) points, ascending by count."""
    if not points:
        return 1.0 + PRIOR_SLOPE * (t - 1)
    lo = None
    for c, s in points:
        if c == t:
            return s
        if c < t:
            lo = (c, s)
        else:
            if lo is None:  # below every measured count: scale the first one by the prior
                return s * (1.0 + PRIOR_SLOPE * (t - 1)) / (1.0 + PRIOR_SLOPE * (c - 1))
            (c0, s0) = lo
            return s0 + (s - s0) * (t - c0) / (c - c0)
    assert lo is not None
    c0, s0 = lo
    return s0 * (1.0 + PRIOR_SLOPE * (t - c0) / (1.0 + PRIOR_SLOPE * (c0 - 1)))
