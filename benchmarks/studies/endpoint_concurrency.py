"""How many requests ``specdec bench --endpoint --concurrency N`` really has on the wire at
once, counted at the client, against a server that holds every request HOLD_S seconds.

Issue 42 (item 2): with ``--concurrency 150`` the server never saw more than 100 requests at
once (httpx's default pool), while the report said 150 clients. This script runs the bench
command of a given specdec source tree (``--src``: the tree before the fix or after it) in a
child process, with one instrument added to httpx for both trees alike: a trace callback on
every request counts it from its first byte out (``http11.send_request_headers.started``) to
its close (``http11.response_closed.*``), the same definition as ``specdec.endpoint.inflight``
but independent of it. Each bench group is one busy period (its requests overlap); the
result gives per period the peak and the time-weighted mean in flight, the server's own peak,
and (after the fix) what the results file recorded. Counts, not speed: the figures do not
depend on the machine's load, except that requests must all be sent within HOLD_S.

    git archive 5de7d18 src | tar -x -C /tmp/before   # the tree before the fix
    python benchmarks/studies/endpoint_concurrency.py --src /tmp/before/src \
        --label "5de7d18 (before)" \
        --out benchmarks/results/endpoint-concurrency-150-before.json
    python benchmarks/studies/endpoint_concurrency.py --src src --label "after" \
        --out benchmarks/results/endpoint-concurrency-150-after.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HOLD_S = 2.0
CLIENTS = 150

CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, SRC)
    import httpx

    events = []  # (monotonic time, +1 / -1)
    send = httpx.AsyncClient.send

    async def counted_send(self, request, **kw):
        prior = request.extensions.get("trace")
        state = {"on": False}

        async def trace(name, info):
            if name == "http11.send_request_headers.started" and not state["on"]:
                state["on"] = True
                events.append((time.monotonic(), 1))
            elif name.startswith("http11.response_closed.") and state["on"]:
                state["on"] = False
                events.append((time.monotonic(), -1))
            if prior is not None:
                await prior(name, info)

        request.extensions = {**request.extensions, "trace": trace}
        return await send(self, request, **kw)

    httpx.AsyncClient.send = counted_send
    from specdec.cli import main

    rc = main(ARGV)
    periods, count, start, area, peak, last = [], 0, None, 0.0, 0, None
    for t, step in sorted(events):
        if count and last is not None:
            area += count * (t - last)
        if count == 0:
            start, area, peak = t, 0.0, 0
        count += step
        peak = max(peak, count)
        last = t
        if count == 0:
            span = t - start
            periods.append({"requests_peak": peak, "mean": area / span if span else 0.0,
                            "seconds": span})
    print("RESULT " + json.dumps({"rc": rc, "periods": periods}))
    """
)


def server(hold_s: float, port_file: Path) -> None:
    """A server holding each generation request ``hold_s`` seconds (run in a thread)."""
    import asyncio
    import socket
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    state = {"now": 0, "peak": 0}

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"data": [{"id": "m"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        try:
            await asyncio.sleep(hold_s)
        finally:
            state["now"] -= 1
        off = body.get("speculative.n_max") == 0
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": " a"}}]},
            {"choices": [], "usage": {"completion_tokens": 1},
             "timings": {"draft_n": 0 if off else 2, "draft_n_accepted": 0 if off else 1}},
        ]  # fmt: skip
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return Response(sse, media_type="text/event-stream")

    async def peak(_: Request) -> JSONResponse:
        return JSONResponse(state)

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/peak", peak),
        ]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port_file.write_text(str(sock.getsockname()[1]))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", backlog=4096))
    threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="the specdec source tree to measure")
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--clients", type=int, default=CLIENTS)
    ap.add_argument("--label", default="", help="what --src is (recorded with the results)")
    args = ap.parse_args()
    import time

    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        server(HOLD_S, d / "port")
        while not (d / "port").exists():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{(d / 'port').read_text()}"
        time.sleep(1.0)
        (d / "p.txt").write_text("hello\n")
        results = d / "b.jsonl"
        argv = ["bench", "--endpoint", url, "--prompts", str(d / "p.txt"), "--concurrency",
                str(args.clients), "--max-new-tokens", "1", "--retries", "0", "--out",
                str(results), "--no-progress"]  # fmt: skip
        code = f"SRC = {str(Path(args.src).resolve())!r}\nARGV = {argv!r}\n" + CHILD
        env = {k: v for k, v in os.environ.items() if k != "SPECDEC_API_KEY"}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"the bench run failed: {proc.stderr[-2000:]}")
        got = json.loads(line[len("RESULT ") :])
        server_peak = httpx.get(url + "/peak", trust_env=False).json()["peak"]
        recorded = [
            {k: r.get(k) for k in ("side", "n_requests", "peak_in_flight", "mean_in_flight")}
            for r in map(json.loads, results.read_text().splitlines())
            if r.get("type") == "endpoint_group"
        ]
    groups = [p for p in got["periods"] if p["requests_peak"] > 1]  # the probes are 1 each
    out = {
        "src": args.src,
        "label": args.label,
        "clients_asked": args.clients,
        "hold_s": HOLD_S,
        "exit_status": got["rc"],
        "client_measured_groups": groups,
        "server_peak_in_flight": server_peak,
        "results_file_groups": recorded,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
