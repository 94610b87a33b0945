"""How many requests are on the wire at once, measured at the client.

The count goes up when a request's headers start to go out on a connection and down when
that response is closed (httpcore's ``trace`` extension: ``http11.send_request_headers.
started`` and ``http11.response_closed.*``), so a request waiting for a free connection in
the client's pool is not counted: the figure is what the server can see, not what the
caller asked for. ``InFlight.window`` gives the peak and the time-weighted mean over a span
(a bench group), which the bench records next to the concurrency it asked for.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

SENT = "http11.send_request_headers.started"
CLOSED = ("http11.response_closed.complete", "http11.response_closed.failed")
Trace = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Window:
    """Requests in flight over a span: the most at once, and the mean over its time."""

    peak: int
    mean: float
    seconds: float


@dataclass
class InFlight:
    """A counter of requests on the wire (one per client; ``clock``: monotonic seconds)."""

    clock: Callable[[], float] = time.monotonic
    now_in_flight: int = 0
    peak_ever: int = 0
    _peak: int = 0
    _area: float = 0.0  # request-seconds since the window opened
    _since: float = field(default=0.0)
    _last: float = field(default=0.0)

    def __post_init__(self) -> None:
        self._since = self._last = self.clock()

    def _move(self, step: int) -> None:
        now = self.clock()
        self._area += self.now_in_flight * (now - self._last)
        self._last = now
        self.now_in_flight += step
        self._peak = max(self._peak, self.now_in_flight)
        self.peak_ever = max(self.peak_ever, self.now_in_flight)

    def open_window(self) -> None:
        """Start a new span (the figures of ``window`` count from here)."""
        now = self.clock()
        self._since = self._last = now
        self._area = 0.0
        self._peak = self.now_in_flight

    def window(self) -> Window:
        """The peak and the time-weighted mean in flight since ``open_window``."""
        now = self.clock()
        area = self._area + self.now_in_flight * (now - self._last)
        span = now - self._since
        return Window(self._peak, area / span if span > 0 else float(self._peak), span)

    def trace(self) -> Trace:
        """A trace callback for one request (httpx ``extensions={"trace": ...}``): counts
        it once from its first byte out to its close, whatever happens in between."""
        state = {"on_wire": False}

        async def callback(event: str, info: dict[str, Any]) -> None:
            if event == SENT and not state["on_wire"]:
                state["on_wire"] = True
                self._move(+1)
            elif event in CLOSED and state["on_wire"]:
                state["on_wire"] = False
                self._move(-1)

        return callback
