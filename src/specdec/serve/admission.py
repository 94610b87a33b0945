"""Admission before any heavy work: a generation request is admitted (a slot, before its body
is read), bounded in size (before it is tokenized) and dropped when its client has left
(before it is tokenized, and before it is queued).

Without this, a client that sent 4 MiB predictions and hung up drove the server to ~4 GB
(each was read, parsed and tokenized after the queue had no room and after its client had
gone) and another client's 4-token request waited 33-68 s behind them for the tokenizer.

- ``Admission`` (pure ASGI): a generation request holds one of ``max_queue + 1`` slots (the
  running one and those waiting) from its arrival to its answer; without a free slot it is a
  429 with ``Retry-After`` (a 503 while shutting down), before a byte of its body is read.
  The tokenizer routes (``/tokenize``, ``/detokenize``) hold slots of a pool of their own, so
  a flood of them is refused the same way and never queues behind, or ahead of, generations
  for the tokenizer without bound.
- ``text_bound``: text that cannot fit the context window whatever it tokenizes to (more
  characters than ``n_ctx`` times the longest token's) is a 400 before the tokenizer sees it;
  ``longest_token_chars`` measures that length once per served model.
- ``Turn``: the tokenizer's lock, taken for one request, which gives up its turn
  (``ClientGone``) as soon as its client is seen gone while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from specdec.core.model import Tokenizer
from specdec.core.vocab import token_texts
from specdec.serve.errors import FieldError

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
TOKENIZER_PATHS = frozenset({"/tokenize", "/detokenize"})
POLL_S = 0.25  # how often a request being prepared checks that its client is there


class ClientGone(Exception):
    """The client left before its request was tokenized or queued."""


class Slots:
    """Generation requests in the server at once (event-loop side only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0

    def take(self) -> bool:
        if self.taken >= self.limit:
            return False
        self.taken += 1
        return True

    def give_back(self) -> None:
        self.taken -= 1


class Admission:
    """A slot for each request to one of ``paths`` before its body is read (see the module
    doc); ``closing`` and ``retry_after`` come from the engine."""

    def __init__(
        self,
        app: Callable[..., Any],
        slots: Slots,
        closing: Callable[[], bool],
        retry_after: Callable[[], int],
        paths: frozenset[str] = GENERATION_PATHS,
    ) -> None:
        self.app = app
        self.slots = slots
        self.closing = closing
        self.retry_after = retry_after
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.closing():
            await _refuse(send, 503, "the server is shutting down", "shutting_down")
            return
        if not self.slots.take():
            wait = self.retry_after()
            msg = f"the server is busy (queue full); retry in {wait} s"
            await _refuse(send, 429, msg, "queue_full", {"retry-after": str(wait)})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.slots.give_back()


async def _refuse(
    send: Send, status: int, message: str, code: str, headers: dict[str, str] | None = None
) -> None:
    kind = "rate_limit_error" if status == 429 else "server_error"
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}
    ).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def longest_token_chars(tokenizer: Tokenizer, vocab_size: int) -> int:
    """The most characters one token stands for (at least 1): a text of more than ``n_ctx``
    times this many characters is more than ``n_ctx`` tokens, whatever the tokenizer does
    with it. The larger of the vocabulary strings' lengths (byte-level BPE writes one
    character per byte, so never fewer than the text's characters) and the decoded pieces'
    (llama-cpp-python's ``detokenize`` returns nothing for a piece over 32 bytes, so those
    alone would be too short: Qwen2.5 has 211 tokens of 33 to 128 characters)."""
    longest = 1
    for text in token_texts(tokenizer, vocab_size):
        if text is not None:
            longest = max(longest, len(text))
    for token in range(vocab_size):
        try:
            longest = max(longest, len(tokenizer.decode([token])))
        except Exception:  # an id the tokenizer cannot decode alone: it adds no text
            continue
    return longest


def text_bound(text_chars: int, n_ctx: int, token_chars: int, param: str) -> None:
    """FieldError naming ``param`` when text of ``text_chars`` characters cannot fit a
    window of ``n_ctx`` tokens (see ``longest_token_chars``)."""
    most = n_ctx * token_chars
    if text_chars > most:
        raise FieldError(
            param,
            f"{param}: {text_chars:,} characters cannot fit the context window of {n_ctx:,} "
            f"tokens (at most {token_chars} characters a token here, so {most:,} in all)",
        )


class Turn:
    """``lock`` held for one request's tokenizer calls; entering it when ``gone`` is set
    raises ClientGone instead (the client left while it waited for its turn)."""

    def __init__(self, lock: threading.Lock, gone: threading.Event) -> None:
        self.lock = lock
        self.gone = gone

    def __enter__(self) -> None:
        # waiting, it looks for its client every POLL_S: one that left gives up its turn
        # (and so its admission slot) at once, not when the tokenizer is next free
        while not self.lock.acquire(timeout=POLL_S):
            if self.gone.is_set():
                raise ClientGone
        if self.gone.is_set():
            self.lock.release()
            raise ClientGone

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lock.release()


@contextlib.asynccontextmanager
async def watched(is_disconnected: Callable[[], Any]) -> Any:
    """An event set as soon as the client is seen gone (polled every POLL_S) while the body
    of the ``async with`` runs."""
    gone = threading.Event()
    if await is_disconnected():  # at once: a client that left as it sent is not tokenized
        gone.set()

    async def watch() -> None:
        while not gone.is_set():
            if await is_disconnected():
                gone.set()
                return
            await asyncio.sleep(POLL_S)

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
