"""Hostile load on `specdec serve` (issue 62, items 3 and 4): slow-header clients and
abandoned large predictions, with what a well-behaved client sees meanwhile.

The server is a real `specdec serve` process (the small test model on llama.cpp, plain
decoding, by default) on loopback, with the open-file limit of a common ``ulimit -n``
(1,024; ``--nofile``); this script is its clients. Two phases:

1. slow headers: ``--slow`` clients open a connection each and send a request's headers one
   byte a second, never finishing them; meanwhile ``/health`` is asked twice a second
   (timeout 5 s). Reported: /health latency (median, max) and failures, how many slow
   connections the server closed, and the bytes the server wrote to its log.
2. abandoned predictions: ``--abusers`` clients each send, again and again, a completion
   request carrying a 4 MiB prediction (or one just under the size bound, every other time),
   hang up without reading the answer and come back ``--pause`` seconds later; meanwhile
   another client asks for 4 tokens once a second (timeout 120 s). Reported: that client's
   latency (median, max) and failures, and the server's resident memory (peak of samples
   every 0.2 s, and the kernel's high-water mark).

Usage (figures only under /work/bin/cpu-quiet on this machine):

    PYTHONPATH=src python benchmarks/studies/serve_hostile_load.py --label after \
        --out benchmarks/results/serve-hostile-load.json

With ``--src DIR`` the server runs another checkout's ``src`` (the figures before a fix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

SMOL = "smollm2-135m-instruct-q4_1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB (0, 0 when gone)."""
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":")[0]
            if key in out:
                out[key] = int(line.split()[1])
    except OSError:
        pass
    return out["VmRSS"], out["VmHWM"]


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve())
    cmd = [sys.executable, "-m", "specdec", "serve", "--target", args.target, "--draft", "none"]
    cmd += ["--no-exact"]  # llama.cpp's numerics, said (else a first load prices exact numerics)
    cmd += ["--port", str(port), "--n-ctx", str(args.n_ctx), "--max-queue", "16"]

    def limits() -> None:  # the server may open what a common `ulimit -n` allows
        if args.nofile:
            import resource

            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
        start_new_session=True,
        preexec_fn=limits,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)


def summary(xs: list[float]) -> dict[str, Any]:
    return {
        "n": len(xs),
        "median_s": round(statistics.median(xs), 4) if xs else None,
        "max_s": round(max(xs), 4) if xs else None,
    }


async def slow_headers(base: str, clients: int, seconds: float) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
    closed_by_server = 0
    opened = 0

    t_end = time.monotonic() + seconds

    async def one() -> None:
        """Trickle a header a byte a second; when the server closes, come back."""
        nonlocal closed_by_server, opened
        while time.monotonic() < t_end:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                await asyncio.sleep(1.0)
                continue
            opened += 1
            try:
                for i in range(len(request)):
                    if time.monotonic() > t_end:
                        break
                    writer.write(request[i : i + 1])
                    await writer.drain()
                    try:
                        got = await asyncio.wait_for(reader.read(1), 1.0)
                    except TimeoutError:
                        continue
                    if got == b"":
                        closed_by_server += 1
                        break
            except (ConnectionError, OSError):
                closed_by_server += 1
            finally:
                writer.close()

    latencies: list[float] = []
    failures = 0

    async def probe() -> None:
        nonlocal failures
        async with httpx.AsyncClient(timeout=5) as http:
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                try:
                    r = await http.get(base + "/health")
                    if r.status_code == 200:
                        latencies.append(time.monotonic() - t0)
                    else:
                        failures += 1
                except httpx.HTTPError:
                    failures += 1
                await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(one()) for _ in range(clients)]
    await probe()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "slow_clients": clients,
        "connections_opened": opened,
        "closed_by_server": closed_by_server,
        "health": summary(latencies),
        "health_failures": failures,
    }


async def abandoned(
    base: str, pid: int, abusers: int, seconds: float, under_bound: int, pause: float
) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    big = json.dumps(
        {"prompt": "Say hi.", "max_tokens": 4, "prediction": {"type": "content", "content": ""}}
    )
    bodies = []
    for chars in (4 << 20, under_bound):
        text = ("def f(x):\n    return x\n" * (chars // 24 + 1))[: chars - 200]
        body = json.loads(big)
        body["prediction"]["content"] = text
        bodies.append(json.dumps(body).encode())
    sent = 0
    t_end = time.monotonic() + seconds

    async def abuser(k: int) -> None:
        nonlocal sent
        i = k
        while time.monotonic() < t_end:
            body = bodies[i % 2]
            i += 1
            try:
                _, writer = await asyncio.open_connection(host, int(port))
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                )
                writer.write(body)
                await writer.drain()
                sent += 1
                writer.close()  # and never read the answer
            except (ConnectionError, OSError):
                pass
            await asyncio.sleep(pause)

    latencies: list[float] = []
    failures = 0
    peak = 0

    async def victim() -> None:
        nonlocal failures
        async with httpx.AsyncClient(timeout=120) as http:
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                try:
                    body = {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0}
                    r = await http.post(base + "/v1/completions", json=body)
                    if r.status_code == 200:
                        latencies.append(time.monotonic() - t0)
                    else:
                        failures += 1
                except httpx.HTTPError:
                    failures += 1
                await asyncio.sleep(1.0)

    async def memory() -> None:
        nonlocal peak
        while time.monotonic() < t_end + 2:
            peak = max(peak, rss_kib(pid)[0])
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(abuser(k)) for k in range(abusers)]
    mem = asyncio.create_task(memory())
    await victim()
    await asyncio.gather(*tasks, return_exceptions=True)
    await mem
    return {
        "abusers": abusers,
        "abandoned_requests": sent,
        "pause_s": pause,
        "prediction_chars": [4 << 20, under_bound],
        "victim": summary(latencies),
        "victim_failures": failures,
        "server_rss_peak_mib": round(peak / 1024, 1),
        "server_vmhwm_mib": round(rss_kib(pid)[1] / 1024, 1),
    }


def cpu_flags() -> str:
    flags = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = line
            break
    keep = [f for f in flags.split() if f.startswith(("avx512", "amx"))]
    return " ".join(sorted(keep)) or "none"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="after")
    ap.add_argument("--src", default=None, help="run the server from this src directory")
    ap.add_argument("--target", default=SMOL)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--slow", type=int, default=1100)
    ap.add_argument("--abusers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--under-bound", type=int, default=120_000, help="chars of the other kind")
    ap.add_argument("--pause", type=float, default=0.5, help="s between an abuser's requests")
    ap.add_argument(
        "--nofile", type=int, default=1024, help="the server's open-file limit (0: as is)"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        proc, base = start_server(args, log)
        try:
            idle = rss_kib(proc.pid)[0]
            log_before = log.stat().st_size
            one = asyncio.run(slow_headers(base, args.slow, args.seconds))
            one["server_log_bytes"] = log.stat().st_size - log_before
            log_before = log.stat().st_size
            two = asyncio.run(
                abandoned(base, proc.pid, args.abusers, args.seconds, args.under_bound, args.pause)
            )
            two["server_log_bytes"] = log.stat().st_size - log_before
            two["server_rss_idle_mib"] = round(idle / 1024, 1)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    record = {
        "label": args.label,
        "server_src": str(Path(args.src).resolve()) if args.src else "this checkout",
        "target": args.target,
        "n_ctx": args.n_ctx,
        "server_nofile": args.nofile or "inherited",
        "seconds_per_phase": args.seconds,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"flags: {cpu_flags()}",
        "slow_headers": one,
        "abandoned_predictions": two,
    }
    print(json.dumps(record, indent=1))
    if args.out is not None:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([*old, record], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
