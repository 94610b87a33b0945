"""The HTTP server around the app: uvicorn, with a guard on connections, bounded logs and a
drain on shutdown.

Connections (``ConnectionLimits``; uvicorn bounds neither the time a client may take to send
its request line and headers nor the number of connections that do so, and 1,100 clients
trickling headers held 1,100 connections and starved ``/health``):

- a request's line and headers must arrive within ``header_timeout_s`` of the connection's
  opening or of the previous response's end; else the connection is closed (its body is
  ``middleware.BodyLimit``'s, 30 s);
- at most ``max_connections`` are open: one more closes the oldest connection that is
  waiting for its first request's headers, else the oldest idle between requests (a client
  that keeps its connection alive has completed a request: it goes last), else, when every
  one is in a request, the new one itself.

Logs: each distinct message of uvicorn's and asyncio's loggers is written at most
``LOG_BURST`` times a minute, with its traceback only the first time; what was held back is
counted in one line when the minute is over (a flood of clients wrote 227 MB of tracebacks in
30 s).

Shutdown (Ctrl-C, SIGTERM): new requests get 503, queued ones get 503 at once (a queued
stream: an error event and ``[DONE]``), the running generation goes on for the shutdown
timeout less a margin, then stops at its next round with a final event and ``[DONE]``; the
process ends when the last connection has closed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import socket
import time
from dataclasses import dataclass
from typing import Any

from specdec.errors import ConfigError
from specdec.serve.engine import Engine

LOG_BURST = 5  # the same message at most this often per LOG_WINDOW_S
LOG_WINDOW_S = 60.0
GUARDED_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio")


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold (``specdec serve --header-timeout``, ``--max-connections``)."""

    header_timeout_s: float = 10.0
    max_connections: int = 512

    def __post_init__(self) -> None:
        if not (math.isfinite(self.header_timeout_s) and self.header_timeout_s > 0):
            raise ConfigError(
                f"the header timeout must be a finite number of seconds > 0, got "
                f"{self.header_timeout_s}"
            )
        if self.max_connections < 1:
            raise ConfigError(f"max connections must be >= 1, got {self.max_connections}")


def drain_seconds(shutdown_timeout: float) -> float:
    """How long the running generation may go on after a shutdown begins: the shutdown
    timeout less a margin (a quarter of it, at most 2 s) in which its final event is sent."""
    return max(0.0, shutdown_timeout - min(2.0, shutdown_timeout / 4))


def check_shutdown_timeout(seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(
            f"--shutdown-timeout must be a finite number of seconds >= 0, got {seconds}"
        )


class BoundedLog(logging.Filter):
    """At most ``burst`` records per distinct message and ``window`` seconds pass, the first
    with its traceback and the rest without; the number held back is told once the window is
    over, on the next record of that message."""

    def __init__(self, burst: int = LOG_BURST, window: float = LOG_WINDOW_S) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self._seen: dict[tuple[str, str], list[Any]] = {}  # key -> [window start, n, held]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] > self.window:
            held = entry[2] if entry is not None else 0
            if len(self._seen) > 1000:  # many distinct messages: start over, still bounded
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if held:
                record.msg = f"{record.getMessage()} ({held} similar messages held back)"
                record.args = ()
            return True
        entry[1] += 1
        if entry[1] > self.burst:
            entry[2] += 1
            return False
        record.exc_info = None  # the traceback was shown the first time
        record.exc_text = None
        return True


def guarded_protocol(limits: ConnectionLimits) -> type:
    """uvicorn's h11 protocol with the header deadline and the connection bound (one class
    per server). Its connections waiting for a request stand in two lines, each oldest first:
    those that have not completed a request yet, and those idle after one (a client keeping
    its connection alive); one more connection than the bound closes the first of the first
    line, else of the second, else itself."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    fresh: dict[Any, None] = {}  # waiting, no request completed yet: oldest first
    idle: dict[Any, None] = {}  # waiting after a completed request: oldest first

    class GuardedH11(H11Protocol):
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._wait(fresh)
            if len(self.connections) > limits.max_connections:
                victim = next((c for c in itertools.chain(fresh, idle) if c is not self), self)
                victim._drop()

        def waiting(self) -> bool:
            """No request in progress: its line and headers have not all arrived yet."""
            return self.cycle is None or bool(self.cycle.response_complete)

        def _wait(self, line: dict[Any, None]) -> None:
            """Begin waiting for a request: the header deadline, a place in ``line``."""
            self._disarm()
            self._timer = self.loop.call_later(limits.header_timeout_s, self._late)
            self._leave()
            line[self] = None

        def _leave(self) -> None:
            fresh.pop(self, None)
            idle.pop(self, None)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _late(self) -> None:
            self._timer = None
            if self.waiting():
                self._drop()

        def _drop(self) -> None:
            self._disarm()
            self._leave()  # out of line now, not when the close is done
            self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if not self.waiting():
                self._disarm()  # the request's headers are in
                self._leave()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.waiting() and not self.transport.is_closing():
                self._wait(idle)  # the next request's headers: the same bound

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._leave()
            super().connection_lost(exc)

    return GuardedH11


def make_server(
    app: Any,
    engine: Engine,
    *,
    shutdown_timeout: float,
    limits: ConnectionLimits = ConnectionLimits(),
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
) -> Any:
    """A uvicorn server for ``app`` (whose worker is ``engine``) with the guard, the bounded
    logs and the drain described above; ``run()`` it, or ``run(sockets=[...])``."""
    import uvicorn

    check_shutdown_timeout(shutdown_timeout)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            engine.begin_shutdown(drain_seconds(shutdown_timeout))
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_protocol(limits),
        # typed int by uvicorn, used as asyncio.timeout's float: fractions work
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
    )
    server = Server(config)
    bound = BoundedLog()
    for name in GUARDED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, BoundedLog) for f in logger.filters):  # once per process
            logger.addFilter(bound)
    return server


def run(
    app: Any,
    *,
    host: str,
    port: int,
    shutdown_timeout: float,
    limits: ConnectionLimits = ConnectionLimits(),
) -> None:
    """Serve ``app`` (``create_app``'s) until Ctrl-C or SIGTERM, then drain and return."""
    engine = app.state.specdec.engine
    make_server(
        app, engine, shutdown_timeout=shutdown_timeout, limits=limits, host=host, port=port
    ).run()
