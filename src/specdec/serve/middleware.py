"""Pure ASGI middleware (no BaseHTTPMiddleware: it would break streaming and disconnects).

``BodyLimit`` reads a request body up to ``max_bytes`` and answers 413 beyond it (whether the
client announced the size or not), and 408 when the whole body has not arrived within
``max_seconds`` (a client that trickles its body, or stops half-way, held the connection
and its task forever), then replays the body to the app; later ``receive`` calls go to the
server, so disconnects are still seen. A client that has already left once its body is in
is not answered at all: its body is never parsed (clients sending 4 MiB bodies and hanging up
at once kept the event loop parsing them while another client waited). ``CountRequests``
records every answer's status per endpoint in the server metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anyio

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]


async def _send_error(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, max_seconds: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_big = f"the request body is larger than {self.max_bytes} bytes"
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _send_error(send, 413, too_big, "request_too_large")
            return
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.max_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:
                        await _send_error(send, 413, too_big, "request_too_large")
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            slow = f"the request body did not arrive within {self.max_seconds:g} s"
            await _send_error(send, 408, slow, "request_timeout")
            return
        if await _already_gone(receive):
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            message: Message = await receive()
            return message

        await self.app(scope, replay, send)


async def _already_gone(receive: Receive) -> bool:
    """Whether the client has left (its disconnect is there to be read without waiting)."""
    message: Message = {}
    await asyncio.sleep(0)  # the transport may have the client's close to hand over
    with anyio.CancelScope() as scope:
        scope.cancel()  # receive returns at once if the disconnect is in, else is cancelled
        message = await receive()
    return message.get("type") == "http.disconnect"


class CountRequests:
    def __init__(self, app: ASGIApp, record: Callable[[str, int], None]) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.record(scope.get("path", "?"), int(message["status"]))
            await send(message)

        await self.app(scope, receive, counted)
