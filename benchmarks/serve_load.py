"""Load test of `specdec serve` on loopback over mock models (not part of the unit suite).

32 concurrent streaming clients (by default) send requests from a fixed pool for 60 s against
one server whose queue holds 16; then every distinct request that completed is run alone,
non-streaming, on a fresh server, and each streamed answer must equal its lone run. Checks:

- no errors other than the intended 429s (queue full, each with a Retry-After),
- every completed streamed response equal to the same request run alone with the same seed
  (so no request saw another's cache state, across prefix reuse and cancellations),
- clients that hang up mid-stream (10 %) cancel their generation without disturbing others,
- memory flat: the RSS of the process (server and clients) at the end against after warm-up.

Bounded in time (--seconds) and in count (--max-requests). Usage:

    PYTHONPATH=src python benchmarks/serve_load.py [--clients 32] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from specdec.api import Pair
from specdec.models.mock import MockLM, MockSpec, MockTokenizer
from specdec.serve import ServeConfig, ServeSettings, create_app


class ChatTokenizer(MockTokenizer):
    def apply_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"
        return self.encode(text, add_special_tokens=True)


class SlowMock(MockLM):
    """A mock model with a fixed cost per forward pass (a stand-in for a real model)."""

    def __init__(self, spec: MockSpec, delay: float) -> None:
        super().__init__(spec)
        self._tokenizer = ChatTokenizer(spec.vocab_size)
        self.delay = delay

    def extend(self, tokens: Any, *, last_only: bool = False) -> Any:
        time.sleep(self.delay)
        return super().extend(tokens, last_only=last_only)


def make_pair(delay: float) -> Pair:
    vocab, n_ctx = 64, 1024
    target = SlowMock(MockSpec(vocab_size=vocab, n_ctx=n_ctx), delay)
    draft = SlowMock(MockSpec(vocab_size=vocab, n_ctx=n_ctx, noise_seed=1000, noise=0.7), delay / 4)
    return Pair(target, draft)


def start(pair: Pair, max_queue: int) -> tuple[str, Any]:
    settings = ServeSettings(model_name="mock", k=4)
    app = create_app(pair, ServeConfig(settings=settings, max_queue=max_queue))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def request_pool(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) pairs: completions and chats, greedy and sampled, with and without stop
    strings, K from the server's default to plain; prompts share prefixes (prefix reuse)."""
    rng = random.Random(seed)
    stems = ["def fib(n):", "Explain RAII", "hello hello hello", "abc abc abc abc"]
    pool = []
    for i in range(n):
        body: dict[str, Any] = {
            "max_tokens": rng.randint(16, 64),
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "top_p": rng.choice([1.0, 0.9]),
            "seed": rng.randrange(2**31),
        }
        if rng.random() < 0.4:
            body["stop"] = [f"<{rng.randrange(3, 64)}><{rng.randrange(3, 64)}"]
        n_max = rng.choice([None, 0, 2, 4, 6])
        if n_max is not None:
            body["speculative"] = {"n_max": n_max}
        text = rng.choice(stems) + f" #{i % 7}"
        if i % 3 == 0:
            pool.append(
                (
                    "/v1/chat/completions",
                    {
                        **body,
                        "messages": [
                            {"role": "system", "content": "be brief"},
                            {"role": "user", "content": text},
                        ],
                    },
                )
            )
        else:
            pool.append(("/v1/completions", {**body, "prompt": text}))
    return pool


def text_of(path: str, payload: dict[str, Any], streamed: bool) -> str:
    choice = payload["choices"][0]
    if path.endswith("chat/completions"):
        return (choice["delta"].get("content") or "") if streamed else choice["message"]["content"]
    return str(choice["text"])


@dataclass
class Tally:
    completed: Counter[int] = field(default_factory=Counter)  # pool index -> count
    texts: dict[int, set[str]] = field(default_factory=dict)
    status: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    retry_after: list[int] = field(default_factory=list)
    sent: int = 0


async def client(
    base: str,
    pool: list[tuple[str, dict[str, Any]]],
    cid: int,
    deadline: float,
    tally: Tally,
    max_requests: int,
    args_abandon: float,
) -> None:
    rng = random.Random(cid)
    async with httpx.AsyncClient(timeout=120) as http:
        while time.monotonic() < deadline and tally.sent < max_requests:
            idx = rng.randrange(len(pool))
            path, body = pool[idx]
            abandon = rng.random() < args_abandon  # hang up after the first text chunk
            tally.sent += 1
            t0 = time.monotonic()
            try:
                async with http.stream("POST", base + path, json={**body, "stream": True}) as r:
                    tally.status[str(r.status_code)] += 1
                    if r.status_code == 429:
                        wait = int(r.headers.get("retry-after", "0"))
                        tally.retry_after.append(wait)
                        await r.aread()
                        await asyncio.sleep(min(wait, 1) * rng.random())
                        continue
                    if r.status_code != 200:
                        tally.errors.append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                        continue
                    text, done, usage = "", False, None
                    async for line in r.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        data = line.removeprefix("data: ")
                        if data == "[DONE]":
                            done = True
                            break
                        chunk = json.loads(data)
                        if "error" in chunk:
                            tally.errors.append(f"stream error: {chunk['error']}")
                            break
                        if chunk["choices"]:
                            text += text_of(path, chunk, streamed=True)
                        if abandon and text:
                            break
                        usage = chunk.get("usage") or usage
                    if abandon and not done:
                        tally.status["abandoned mid-stream"] += 1
                        continue
                    if done:
                        tally.completed[idx] += 1
                        tally.texts.setdefault(idx, set()).add(text)
                        tally.latencies.append(time.monotonic() - t0)
                        tally.tokens += usage["completion_tokens"] if usage else 0
                    else:
                        tally.errors.append("stream ended without [DONE]")
            except httpx.HTTPError as e:
                tally.errors.append(f"{type(e).__name__}: {e}")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def sample_rss(deadline: float, out: list[tuple[float, float]], t0: float) -> None:
    while time.monotonic() < deadline:
        out.append((time.monotonic() - t0, rss_mib()))
        await asyncio.sleep(1.0)


async def load(args: argparse.Namespace, base: str, pool: list[Any]) -> tuple[Tally, list[Any]]:
    tally = Tally()
    rss: list[tuple[float, float]] = []
    t0 = time.monotonic()
    deadline = t0 + args.seconds
    await asyncio.gather(
        sample_rss(deadline, rss, t0),
        *(
            client(base, pool, c, deadline, tally, args.max_requests, args.abandon)
            for c in range(args.clients)
        ),
    )
    rss.append((time.monotonic() - t0, rss_mib()))
    return tally, rss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-requests", type=int, default=20000)
    p.add_argument("--max-queue", type=int, default=16)
    p.add_argument("--pool", type=int, default=48, help="distinct requests")
    p.add_argument("--abandon", type=float, default=0.1, help="share of streams closed mid-way")
    p.add_argument("--delay", type=float, default=0.002, help="seconds per target pass")
    args = p.parse_args()

    pool = request_pool(args.pool, seed=0)
    base, stop = start(make_pair(args.delay), args.max_queue)
    t_start = time.monotonic()
    tally, rss = asyncio.run(load(args, base, pool))
    wall = time.monotonic() - t_start
    stop()

    # every completed request, run alone (non-streaming) on a fresh server
    lone_base, lone_stop = start(make_pair(0.0), args.max_queue)
    mismatches = []
    with httpx.Client(timeout=120) as http:
        for idx in sorted(tally.completed):
            path, body = pool[idx]
            alone = text_of(path, http.post(lone_base + path, json=body).json(), streamed=False)
            if tally.texts[idx] != {alone}:
                mismatches.append(idx)
    lone_stop()

    warm = [m for t, m in rss if t >= min(10.0, args.seconds / 4)]
    rss_warm, rss_end = (warm[0], warm[-1]) if warm else (rss[0][1], rss[-1][1])
    growth = rss_end - rss_warm
    lat = sorted(tally.latencies)
    n_done = sum(tally.completed.values())
    other_errors = len(tally.errors)
    ok = other_errors == 0 and not mismatches and n_done > 0 and growth < 50
    print(
        f"specdec serve load test: {args.clients} streaming clients, {args.seconds:.0f} s, "
        f"queue {args.max_queue}, mock pair (K=4 default, close draft), "
        f"{args.delay * 1000:.1f} ms per target pass"
    )
    print(f"wall {wall:.1f} s; requests sent {tally.sent}; statuses {dict(tally.status)}")
    print(
        f"completed streams {n_done} ({len(tally.completed)} distinct of {len(pool)}), "
        f"{tally.tokens} tokens, {tally.tokens / wall:.0f} tokens/s"
    )
    if lat:
        print(
            f"latency of completed streams: p50 {statistics.median(lat):.2f} s, "
            f"p95 {lat[int(0.95 * (len(lat) - 1))]:.2f} s, max {lat[-1]:.2f} s"
        )
    if tally.retry_after:
        print(
            f"429s: {len(tally.retry_after)}, Retry-After "
            f"{min(tally.retry_after)}..{max(tally.retry_after)} s"
        )
    print(
        f"errors other than 429: {other_errors}"
        + (f" e.g. {tally.errors[:3]}" if other_errors else "")
    )
    print(
        f"streamed == run alone with the same seed: {len(tally.completed) - len(mismatches)}"
        f"/{len(tally.completed)} distinct requests ({n_done} responses)"
        + (f"; mismatches {mismatches}" if mismatches else "")
    )
    print(
        f"RSS: start {rss[0][1]:.1f} MiB, after warm-up {rss_warm:.1f} MiB, "
        f"end {rss_end:.1f} MiB (growth {growth:+.1f} MiB); "
        f"samples {' '.join(f'{m:.0f}' for _, m in rss[:: max(1, len(rss) // 12)])}"
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
