"""A tiny OpenAI-compatible server that misbehaves in one chosen way (``hostile_app(mode)``).

With ``mode=None`` it is a faithful fake: ``/v1/models`` lists one model, the completions and
chat routes answer (streamed or not) the tokens " a", " b", " c", ... with logprobs when asked
and llama-server's draft counters (spec-off requests, ``speculative.n_max = 0``, draft
nothing), ``/tokenize`` returns ids. Each mode of ``MODES`` breaks one thing, one failure
class each: a reply of the wrong shape, a reply that never ends (fast or slow), one that is
too large, text with terminal escape sequences, a model list that is far too long.
``hold_s`` holds every generation request that long before answering (the concurrency
measurement); ``state`` counts requests in flight at the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

ESC_PASS = "\x1b[2K\r\x1b[1;32mendpoint certificate: PASS\x1b[0m"
TOKENS = (" a", " b", " c", " d", " e", " f", " g", " h")
TICK_S = 0.05  # the slow modes' pace (well inside any read timeout a test sets)
BARRIER_S = 20.0  # the longest a request waits for its group at the barrier

# mode -> what is wrong (the kinds of request it hits are in its name's handling below)
MODES: dict[str, str] = {
    # replies of the wrong shape (valid JSON)
    "top logprob a string": "completions top_logprobs values are strings",
    "logprobs a list": "choices[0].logprobs is a list",
    "logprob row a list": "completions top_logprobs rows are lists",
    "chat logprob item an int": "chat logprobs.content entries are numbers",
    "chat logprob null": "a chat top_logprobs entry's logprob is null",
    "logprob NaN": "a logprob is NaN",
    "logprob above 0": "a logprob of 5 (a probability above 1)",
    "choice a string": "choices entries are strings (streamed and not)",
    "text a number": "choices[0].text / message.content is a number",
    "chunk a list": "a streamed chunk is a JSON list",
    "nested 100000 deep": "a non-streamed reply nested 100,000 levels deep",
    "chunk nested 100000 deep": "a streamed chunk nested 100,000 levels deep",
    "bytes not UTF-8": "a non-streamed reply that is not UTF-8",
    "counter negative": "timings.draft_n is -3",
    "usage a string": "usage.completion_tokens is a string",
    "models data an object": "/v1/models data is an object",
    "model id a number": "/v1/models ids are numbers",
    "token list of words": "/tokenize tokens are strings",
    # replies that never end or are too large
    "data forever, fast": "an SSE stream of data chunks that never ends, as fast as it can",
    "data forever, slow": "an SSE stream of one data chunk per tick, never ending",
    "comments forever": "an SSE stream of comment lines, never ending",
    "comments forever, slow": "one SSE comment line per tick, never ending",
    "one line forever": "an SSE line that never ends",
    "a byte a tick": "a reply sent one byte per tick",
    "a huge body": "a non-streamed reply of 64 MiB",
    # text for the terminal
    "ANSI in a 401": "a 401 whose message paints a fake PASS line",
    "ANSI in a 400 mid-stream": "a streamed error chunk with escape sequences",
    "ANSI in a model name": "two models, one named with escape sequences",
    "200,000 models": "a model list of 200,000 ids",
}


@dataclass
class ServerState:
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    released: bool = False


def _reply(body: dict[str, Any], chat: bool) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """(tokens, usage, timings) of a faithful reply to ``body``."""
    n = max(1, int(body.get("max_tokens") or 4))
    toks = [TOKENS[i % len(TOKENS)] for i in range(n)]
    off = body.get("speculative.n_max") == 0 or (body.get("speculative") or {}).get("n_max") == 0
    timings = {"draft_n": 0 if off else 2, "draft_n_accepted": 0 if off else 1}
    return toks, {"prompt_tokens": 3, "completion_tokens": n}, timings


def _whole(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    toks, usage, timings = _reply(body, chat)
    text = "".join(toks)
    want = body.get("top_logprobs") if chat else body.get("logprobs")
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {
                        "token": t,
                        "logprob": -0.1,
                        "top_logprobs": [
                            {"token": t, "logprob": -0.1},
                            {"token": " z", "logprob": -3.0},
                        ][: int(want or 2)],
                    }
                    for t in toks
                ]
            }
    else:
        choice["text"] = text
        if want:
            choice["logprobs"] = {
                "tokens": toks,
                "token_logprobs": [-0.1] * len(toks),
                "top_logprobs": [{t: -0.1, " z": -3.0} for t in toks],
            }
    return {"choices": [choice], "usage": usage, "timings": timings}


def _chunks(body: dict[str, Any], chat: bool) -> list[dict[str, Any]]:
    toks, usage, timings = _reply(body, chat)
    key = "delta" if chat else "text"
    out = [
        {"choices": [{"index": 0, key: {"content": t} if chat else t, "finish_reason": None}]}
        for t in toks
    ]
    return [*out, {"choices": [], "usage": usage, "timings": timings}]


def _break_whole(mode: str, obj: dict[str, Any], chat: bool) -> Any:
    """The faithful non-streamed reply ``obj`` broken the way ``mode`` says."""
    choice = obj["choices"][0]
    lp = choice.get("logprobs")
    if mode == "top logprob a string" and lp and not chat:
        lp["top_logprobs"] = [{k: str(v) for k, v in r.items()} for r in lp["top_logprobs"]]
    elif mode == "logprobs a list" and lp:
        choice["logprobs"] = [1, 2]
    elif mode == "logprob row a list" and lp and not chat:
        lp["top_logprobs"] = [list(r.items()) for r in lp["top_logprobs"]]
    elif mode == "chat logprob item an int" and lp and chat:
        lp["content"] = [1, 2]
    elif mode == "chat logprob null" and lp and chat:
        lp["content"][0]["top_logprobs"][0]["logprob"] = None
    elif mode == "logprob NaN" and lp and not chat:
        lp["top_logprobs"][0] = {k: float("nan") for k in lp["top_logprobs"][0]}
    elif mode == "logprob above 0" and lp and not chat:
        lp["top_logprobs"][0] = {k: 5.0 for k in lp["top_logprobs"][0]}
    elif mode == "choice a string":
        obj["choices"] = ["x"]
    elif mode == "text a number":
        if chat:
            choice["message"]["content"] = 5
        else:
            choice["text"] = 5
    elif mode == "counter negative":
        obj["timings"]["draft_n"] = -3
    elif mode == "usage a string":
        obj["usage"]["completion_tokens"] = "3"
    return obj


def _break_chunk(mode: str, obj: dict[str, Any]) -> Any:
    if mode == "choice a string" and obj["choices"]:
        obj["choices"] = ["x"]
    elif mode == "text a number" and obj["choices"]:
        part = obj["choices"][0]
        if "delta" in part:
            part["delta"]["content"] = 5
        else:
            part["text"] = 5
    elif mode == "chunk a list":
        return [obj]
    elif mode == "counter negative" and "timings" in obj:
        obj["timings"]["draft_n"] = -3
    elif mode == "usage a string" and "usage" in obj:
        obj["usage"]["completion_tokens"] = "3"
    return obj


async def _forever(piece: bytes, tick: float) -> AsyncIterator[bytes]:
    while True:
        yield piece
        await asyncio.sleep(tick)


async def _trickle(data: bytes, tick: float) -> AsyncIterator[bytes]:
    for i in range(len(data)):
        yield data[i : i + 1]
        await asyncio.sleep(tick)


async def _huge(size: int) -> AsyncIterator[bytes]:
    block = b" " * (64 << 10)
    for _ in range(size // len(block)):
        yield block
        await asyncio.sleep(0)


def hostile_app(
    mode: str | None,
    *,
    hold_s: float = 0.0,
    barrier: int | None = None,
    barrier_prompt: str = "hello",
    state: ServerState | None = None,
    model_id: str = "m",
) -> Any:
    """A Starlette app: the faithful fake, or broken as ``MODES[mode]`` says. ``hold_s``:
    every generation request waits that long; ``barrier``: a request whose prompt holds
    ``barrier_prompt`` waits until that many are in flight at once (at most BARRIER_S), so
    that a client that cannot send them all shows (a probe's request does not wait);
    ``model_id``: the one model it lists."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    st = state or ServerState()

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()  # NaN written as NaN (Python's JSON reads it)

    async def models(_: Request) -> Response:
        data: Any = [{"id": model_id, "object": "model"}]
        if mode == "models data an object":
            data = {"id": "m"}
        elif mode == "model id a number":
            data = [{"id": 5}]
        elif mode == "ANSI in a model name":
            data = [{"id": "\x1b[31mevil\x1b[0m"}, {"id": "m"}]
        elif mode == "200,000 models":
            data = [{"id": f"model-{i:06d}"} for i in range(200_000)]
        return Response(dumps({"object": "list", "data": data}), media_type="application/json")

    async def tokenize(request: Request) -> Response:
        tokens: list[Any] = [1, 2, 3]
        if mode == "token list of words":
            tokens = ["a", "b"]
        return JSONResponse({"tokens": tokens})

    async def generation(request: Request, chat: bool) -> Response:
        body = await request.json()
        st.requests += 1
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            if hold_s:
                await asyncio.sleep(hold_s)
            waited = 0.0
            grouped = barrier_prompt in json.dumps(body.get("prompt") or body.get("messages"))
            while (
                barrier
                and grouped
                and st.in_flight < barrier
                and not st.released
                and waited < BARRIER_S
            ):
                await asyncio.sleep(0.01)
                waited += 0.01
            if barrier and st.in_flight >= barrier:
                st.released = True  # this group is all here: let every one of it go
            return respond(body, chat)
        finally:
            st.in_flight -= 1
            if st.in_flight == 0:
                st.released = False  # the next group waits for its own

    def respond(body: dict[str, Any], chat: bool) -> Response:
        if mode == "ANSI in a 401":
            return JSONResponse({"error": {"message": ESC_PASS}}, 401)
        if mode == "a huge body":
            return StreamingResponse(_huge(64 << 20), media_type="application/json")
        sse = "text/event-stream"
        if body.get("stream"):
            if mode == "data forever, fast":
                chunk = {"choices": [{"index": 0, "text": "", "delta": {}, "finish_reason": None}]}
                return StreamingResponse(
                    _forever(b"data: " + dumps(chunk) + b"\n\n", 0), media_type=sse
                )
            if mode == "data forever, slow":
                chunk = {"choices": [{"index": 0, "text": "x", "delta": {"content": "x"}}]}
                return StreamingResponse(
                    _forever(b"data: " + dumps(chunk) + b"\n\n", TICK_S), media_type=sse
                )
            if mode == "comments forever":
                return StreamingResponse(_forever(b": keep-alive\n\n" * 64, 0), media_type=sse)
            if mode == "comments forever, slow":
                return StreamingResponse(_forever(b": keep-alive\n", TICK_S), media_type=sse)
            if mode == "one line forever":
                head = b"data: " + b'{"choices": [{"text": "'
                return StreamingResponse(_chain(head, _forever(b"x" * 4096, 0)), media_type=sse)
            if mode == "chunk nested 100000 deep":
                return Response(
                    b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n", media_type=sse
                )
            chunks = [_break_chunk(mode or "", c) for c in _chunks(body, chat)]
            if mode == "ANSI in a 400 mid-stream":
                chunks = [chunks[0], {"error": {"message": ESC_PASS}}]
            data = b"".join(b"data: " + dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            if mode == "a byte a tick":
                return StreamingResponse(_trickle(data * 1000, TICK_S), media_type=sse)
            return Response(data, media_type=sse)
        if mode == "nested 100000 deep":
            return Response(b"[" * 100_000 + b"]" * 100_000, media_type="application/json")
        if mode == "bytes not UTF-8":
            return Response(b'{"choices": "\xff\xfe"}', media_type="application/json")
        obj = _break_whole(mode or "", _whole(body, chat), chat)
        if mode == "a byte a tick":
            return StreamingResponse(
                _trickle(dumps(obj) * 1000, TICK_S), media_type="application/json"
            )
        return Response(dumps(obj), media_type="application/json")

    async def completions(request: Request) -> Response:
        return await generation(request, chat=False)

    async def chat(request: Request) -> Response:
        return await generation(request, chat=True)

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )
    app.state.counts = st
    return app


async def _chain(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield head
    async for piece in rest:
        yield piece


def all_modes_app() -> tuple[Any, dict[str, str]]:
    """One app serving every mode at once, each under its own path (``/m3`` ...): (the app,
    mode -> path). A base URL with the path is an ordinary endpoint URL to the client, so a
    module of tests can share one server instead of starting one per row."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    paths = {mode: f"/m{i}" for i, mode in enumerate(MODES)}
    return Starlette(routes=[Mount(p, app=hostile_app(m)) for m, p in paths.items()]), paths
