"""Servers for the endpoint tests: any ASGI app on loopback, a misbehaving proxy in front of a
real server, and llama-cpp-python's OpenAI server as a subprocess."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TOKEN_OR_WORD = re.compile(r"<\d+>|\S+")  # a mock model's "<12>" pieces, or words


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_app(app: Any) -> tuple[str, Callable[[], None]]:
    """Serve an ASGI app on a free loopback port in a thread: (base URL, stop)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test app did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)
        sock.close()

    return f"http://127.0.0.1:{port}", stop


@contextmanager
def running_app(app: Any) -> Iterator[str]:
    base, stop = start_app(app)
    try:
        yield base
    finally:
        stop()


def swap_first_two(text: str) -> str:
    """The text with its first two tokens (mock pieces) or words swapped."""
    found = list(TOKEN_OR_WORD.finditer(text))
    if len(found) < 2 or found[0].group() == found[1].group():
        return text
    a, b = found[0], found[1]
    return text[: a.start()] + b.group() + text[a.end() : b.start()] + a.group() + text[b.end() :]


@dataclass
class ProxyFaults:
    """What the proxy does wrong (everything off: a faithful proxy)."""

    perturb_rate: float = 0.0  # sampled (temperature > 0) non-streamed completions swapped
    strip_counters: bool = False  # drop usage / timings from every response
    drop_switch: bool = False  # remove speculative.n_max from request bodies
    fail_first: int = 0  # answer the first N generation requests with HTTP 503
    seed: int = 0


def proxy_app(upstream: str, faults: ProxyFaults) -> Any:
    """A Starlette app forwarding every request to ``upstream``, with ``faults``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    rng = random.Random(faults.seed)
    state = {"generations": 0, "perturbed": 0}

    def strip(obj: dict[str, Any]) -> dict[str, Any]:
        if faults.strip_counters:
            obj.pop("timings", None)
            obj.pop("usage", None)
        return obj

    async def handle(request: Request) -> Response:
        path = request.url.path
        client = httpx.AsyncClient(base_url=upstream, timeout=120, trust_env=False)
        if request.method == "GET":
            async with client:
                r = await client.get(path)
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        body = json.loads(await request.body() or b"{}")
        state["generations"] += 1
        if state["generations"] <= faults.fail_first:
            await client.aclose()
            return JSONResponse({"error": {"message": "busy"}}, 503, headers={"Retry-After": "0"})
        if faults.drop_switch:
            body.pop("speculative", None)
            body.pop("speculative.n_max", None)
        if body.get("stream"):

            async def relay() -> AsyncIterator[bytes]:
                async with client, client.stream("POST", path, json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and line[5:].strip() != "[DONE]":
                            line = "data: " + json.dumps(strip(json.loads(line[5:])))
                        yield (line + "\n").encode()

            return StreamingResponse(relay(), media_type="text/event-stream")
        async with client:
            r = await client.post(path, json=body)
        if r.status_code != 200:
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        obj = strip(r.json())
        spec = body.get("speculative") or {}
        spec_off = body.get("speculative.n_max") == 0 or spec.get("n_max") == 0
        sampled = (body.get("temperature") or 0) > 0
        if sampled and not spec_off and rng.random() < faults.perturb_rate:
            choice = obj["choices"][0]
            if "text" in choice:
                choice["text"] = swap_first_two(choice["text"])
            else:
                choice["message"]["content"] = swap_first_two(choice["message"]["content"])
            state["perturbed"] += 1
        return JSONResponse(obj)

    app = Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST"])])
    app.state.counts = state
    return app


# -- a token-id server (the parts of vLLM's API the per-token test uses) ----------------------


@dataclass
class TokenServerState:
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    # (prompt, prediction field, prompt_logprobs field) of every completion request
    bodies: list[tuple[Any, Any, Any]] = field(default_factory=list)


def token_server_app(
    *,
    vocab: int = 32,
    sharpen: float = 1.0,
    delay: float = 0.0,
    shared: TokenServerState | None = None,
    fail_after: int | None = None,
) -> Any:
    """A vLLM-like completions server over a mock model: text or token-id prompts, seeds,
    ``logprobs`` with ``return_tokens_as_token_ids``, ``prompt_logprobs`` (top N by rank plus
    the position's own token), ``/tokenize``. ``sharpen`` != 1 samples at temperature
    T / sharpen (a server with a wrong sampler); ``shared`` counts requests in flight across
    servers; ``fail_after`` answers HTTP 400 after that many completions (a crash)."""
    import asyncio

    import numpy as np
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from specdec.models.mock import MockLM, MockSpec

    model = MockLM(MockSpec(vocab_size=vocab, order=2, sharpness=1.5, eos_token_id=vocab + 1))
    tok = model.tokenizer
    own = TokenServerState()

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    rows: dict[tuple[int, ...], np.ndarray] = {}

    def row(ctx: list[int]) -> np.ndarray:
        key = tuple(ctx[-model.spec.order :])  # the mock's logits depend on this window only
        if key not in rows:
            rows[key] = log_softmax(model.logits_for_context(ctx).double().numpy())
        return rows[key]

    def ranked(lp: np.ndarray, n: int, own_id: int) -> dict[str, Any]:
        order = np.argsort(-lp, kind="stable")
        rank = {int(t): r + 1 for r, t in enumerate(order)}
        keep = [int(t) for t in order[:n]] + [own_id]
        return {str(t): {"logprob": float(lp[t]), "rank": rank[t]} for t in keep}

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "mockv", "object": "model"}]})

    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"tokens": tok.encode(body["prompt"])})

    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        own.requests += 1
        for st in (own, shared):
            if st is not None:
                st.bodies.append(
                    (body.get("prompt"), body.get("prediction"), body.get("prompt_logprobs"))
                )
        if fail_after is not None and own.requests > fail_after:
            return JSONResponse({"error": {"message": "crashed"}}, 400)
        for st in (own, shared):
            if st is not None:
                st.in_flight += 1
                st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            if delay:
                await asyncio.sleep(delay)
            prompt = body["prompt"]
            ids = tok.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            temp = float(body.get("temperature") or 0.0)
            rng = np.random.default_rng(int(body.get("seed") or 0))
            out: list[int] = []
            tops: list[dict[str, float]] = []
            for _ in range(int(body.get("max_tokens") or 16)):
                lp = row(ids + out)
                if temp > 0:
                    p = np.exp(log_softmax(lp / (temp / sharpen)))
                    t = int(rng.choice(vocab, p=p / p.sum()))
                else:
                    t = int(np.argmax(lp))
                n_top = int(body.get("logprobs") or 0)
                best = np.argsort(-lp, kind="stable")[:n_top]
                tops.append({f"token_id:{int(b)}": float(lp[b]) for b in best})
                out.append(t)
            ids_as = bool(body.get("return_tokens_as_token_ids"))
            choice: dict[str, Any] = {
                "index": 0,
                "text": tok.decode(out),
                "finish_reason": "length",
                "logprobs": None,
            }
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "tokens": [f"token_id:{t}" if ids_as else tok.decode([t]) for t in out],
                    "token_logprobs": [float(row(ids + out[:j])[t]) for j, t in enumerate(out)],
                    "top_logprobs": tops
                    if ids_as
                    else [{tok.decode([int(k[9:])]): v for k, v in d.items()} for d in tops],
                }
            if body.get("prompt_logprobs") is not None:
                n = int(body["prompt_logprobs"])
                choice["prompt_logprobs"] = [None] + [
                    ranked(row(ids[:j]), n, ids[j]) for j in range(1, len(ids))
                ]
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(out)}
            if body.get("stream"):
                chunks = [{"choices": [choice]}, {"choices": [], "usage": usage}]
                sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                return Response(sse, media_type="text/event-stream")
            return JSONResponse({"object": "text_completion", "choices": [choice], "usage": usage})
        finally:
            for st in (own, shared):
                if st is not None:
                    st.in_flight -= 1

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
        ]
    )
    app.state.counts = own
    return app


# -- llama-cpp-python's OpenAI server ----------------------------------------------------------


def llama_server_or_skip() -> None:
    import pytest

    pytest.importorskip("llama_cpp")
    for mod in ("starlette_context", "pydantic_settings", "sse_starlette", "uvicorn"):
        pytest.importorskip(
            mod, reason=f"llama_cpp.server needs {mod} (pip install 'llama-cpp-python[server]')"
        )


@contextmanager
def llama_cpp_server(
    model: Path, *, lookup: int | None, alias: str = "smol", n_ctx: int = 512
) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port (prompt-lookup speculation with
    ``lookup`` tokens per draft, or none); yields the base URL, stops the process."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "specdec.llama_trust.llama_server_guard",  # llama_cpp.server behind the kernel check
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        "--model_alias",
        alias,
        "--interrupt_requests",
        "false",
        "--verbose",
        "false",
    ]
    if lookup:
        cmd += [
            "--draft_model",
            "prompt-lookup-decoding",
            "--draft_model_num_pred_tokens",
            str(lookup),
        ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tempfile.TemporaryFile()  # noqa: SIM115 (not a pipe: a full one would block the server)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"llama_cpp.server exited: {err[-2000:]}")
            try:
                if httpx.get(base + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama_cpp.server did not start within 90 s")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
