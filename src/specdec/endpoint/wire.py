"""Reading a server's reply with bounds: on its size, on its time, on its JSON.

A reply is read chunk by chunk and counted as it arrives (never ``response.read()``, which
takes whatever the server sends): past ``limit`` bytes the read stops with ``TooLarge``.
A server-sent event stream is split into lines here, from those counted bytes, so a line
that never ends, an endless run of comment lines or of data lines all meet the same bound
(httpx's own line reader would buffer an endless line whole). The time bound of a whole
request is the caller's (``asyncio.timeout`` around the attempt); the read timeout between
two chunks is httpx's. JSON is decoded by ``jsonbound.loads`` (depth bounded, no recursion
error) after a UTF-8 check.

How large a reply may be (``reply_limit``) is derived from what was asked: a fixed
allowance for the envelope, plus per token (``max_tokens``, and the prompt's tokens when the
request asks for prompt logprobs) an allowance for its text and one per logprob asked for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from specdec.endpoint.errors import BadReply
from specdec.util import jsonbound

BASE_BYTES = 1 << 20  # the envelope of any reply, and any reply that is not a generation
PER_TOKEN_BYTES = 4 << 10  # one token's text, chunk envelope and fields (a chat chunk ~300 B)
PER_LOGPROB_BYTES = 1 << 10  # one top-logprob entry of one token (llama-server adds bytes)
ERROR_BODY_BYTES = 64 << 10  # what is read of a refusal (HTTP 4xx / 5xx) for its message
LIST_BYTES = 16 << 20  # /v1/models and /metrics


class TooLarge(BadReply):
    """A reply longer than the bound for its request."""


class BadJson(BadReply):
    """A reply that is not UTF-8 JSON, or JSON nested too deeply."""


def reply_limit(max_tokens: int, logprobs: int, prompt_tokens: int = 0) -> int:
    """The byte bound of a generation reply: BASE_BYTES, plus for each generated token (and
    each prompt token whose logprobs are asked for) PER_TOKEN_BYTES and PER_LOGPROB_BYTES per
    logprob asked for (plus one: the token's own)."""
    tokens = max(0, max_tokens) + max(0, prompt_tokens)
    return BASE_BYTES + tokens * (PER_TOKEN_BYTES + (logprobs + 1) * PER_LOGPROB_BYTES)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.3g} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


async def read_body(response: httpx.Response, limit: int, where: str) -> bytes:
    """The body, at most ``limit`` bytes of it (TooLarge past that)."""
    parts: list[bytes] = []
    size = 0
    async for piece in response.aiter_bytes():
        size += len(piece)
        if size > limit:
            raise TooLarge(f"{where} sent more than {_mib(limit)} (the bound of this reply)")
        parts.append(piece)
    return b"".join(parts)


async def read_prefix(response: httpx.Response, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body, the rest left unread (a refusal's message)."""
    parts: list[bytes] = []
    size = 0
    async for piece in response.aiter_bytes():
        parts.append(piece)
        size += len(piece)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


async def sse_lines(response: httpx.Response, limit: int, where: str) -> AsyncIterator[str]:
    """The lines of an event stream (LF or CRLF ends a line), every byte counted against
    ``limit`` as it arrives (TooLarge past it, whatever the lines hold). Linear in the bytes
    read, however they are cut into chunks."""
    size = 0
    line = bytearray()
    async for piece in response.aiter_bytes():
        size += len(piece)
        if size > limit:
            raise TooLarge(
                f"{where} streamed more than {_mib(limit)} (the bound of this reply) without "
                "finishing"
            )
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            line += piece[start:end]
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
            line.clear()
            start = end + 1
        line += piece[start:]
    if line:
        yield line.rstrip(b"\r").decode("utf-8", errors="replace")


def decode_json(data: bytes, where: str) -> Any:
    """``data`` as JSON: UTF-8, at most ``jsonbound.MAX_DEPTH`` deep (BadJson otherwise)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadJson(f"{where} answered bytes that are not UTF-8 (at byte {e.start})") from e
    try:
        return jsonbound.loads(text)
    except jsonbound.JsonError as e:
        raise BadJson(f"{where} answered {e}") from e
