"""A deliberately wrong proxy in front of a spec-on server: ``certify --endpoint`` through it
must FAIL. It forwards every request and response, and corrupts the sampled (temperature > 0)
completions of spec-on requests (requests that carry no ``speculative.n_max = 0``):

- ``--fault swap:R``: in a fraction R of them, the first two words of the text are swapped
  (the token ids and logprobs are left alone: only the text statistics can see it);
- ``--fault temperature:F``: the request is sent upstream at temperature T * F (a sampler
  with the wrong temperature: every statistic can see it, the per-token test best).

    .venv/bin/python benchmarks/engines/wrong_proxy.py --upstream http://127.0.0.1:8000 \\
        --port 8100 --fault swap:0.5
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

WORD = re.compile(r"\S+")


def swap_first_two(text: str) -> str:
    found = list(WORD.finditer(text))
    if len(found) < 2 or found[0].group() == found[1].group():
        return text
    a, b = found[0], found[1]
    return text[: a.start()] + b.group() + text[a.end() : b.start()] + a.group() + text[b.end() :]


def parse_fault(text: str) -> tuple[str, float]:
    kind, _, value = text.partition(":")
    if kind not in ("swap", "temperature") or not value:
        raise argparse.ArgumentTypeError("--fault is swap:RATE or temperature:FACTOR")
    return kind, float(value)


def make_app(upstream: str, fault: tuple[str, float], seed: int = 0) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    kind, value = fault
    rng = random.Random(seed)
    counts = {"requests": 0, "corrupted": 0}
    client = httpx.AsyncClient(base_url=upstream, timeout=600, trust_env=False)

    def spec_off(body: dict[str, Any]) -> bool:
        spec = body.get("speculative") or {}
        return body.get("speculative.n_max") == 0 or spec.get("n_max") == 0

    async def handle(request: Request) -> Response:
        path = request.url.path
        if request.method == "GET":
            r = await client.get(path)
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        body = json.loads(await request.body() or b"{}")
        counts["requests"] += 1
        sampled = (body.get("temperature") or 0) > 0 and not spec_off(body)
        if sampled and kind == "temperature":
            body["temperature"] = body["temperature"] * value
            counts["corrupted"] += 1
        if body.get("stream"):

            async def relay() -> AsyncIterator[bytes]:
                async with client.stream("POST", path, json=body) as r:
                    async for chunk in r.aiter_raw():
                        yield chunk

            return StreamingResponse(relay(), media_type="text/event-stream")
        r = await client.post(path, json=body)
        if r.status_code != 200 or "completions" not in path:
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        obj = r.json()
        if sampled and kind == "swap" and rng.random() < value:
            choice = obj["choices"][0]
            if "text" in choice:
                choice["text"] = swap_first_two(choice["text"])
            else:
                choice["message"]["content"] = swap_first_two(choice["message"]["content"])
            counts["corrupted"] += 1
        return JSONResponse(obj)

    app = Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST"])])
    app.state.counts = counts
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="the spec-on server's URL")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fault", type=parse_fault, default=("swap", 0.5))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    app = make_app(a.upstream.rstrip("/"), a.fault, a.seed)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
