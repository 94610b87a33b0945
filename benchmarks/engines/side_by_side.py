"""Plain and speculative tokens/s of four engines on the same target weights, measured in one
interleaved run: vLLM's CPU build (bf16, dequantized from the Q4_K_M GGUF), llama.cpp's
llama-server, llama-cpp-python's server (both on the Q4_K_M GGUF) and ``specdec serve``;
single stream and 4 concurrent streams.

Design, fixed before the run:

- Every engine serves Qwen2.5-Coder-1.5B-Instruct with 2 threads. Speculation: the 0.5B draft,
  K = 4 (vLLM, llama-server, specdec serve); llama-cpp-python's server offers only prompt
  lookup (K = 4). Plain: the same engine without speculation (specdec serve: its per-request
  switch, verified by its counters).
- Prompts: one Spec-Bench prompt per category (6), chat API, greedy, 64 new tokens.
- Interleaving: all servers stay up; every item (one request, or one group of 4 concurrent
  requests) goes to one engine-variant at a time, and the order of the 8 engine-variants is
  rotated from item to item, so slow drift of the machine falls on all of them alike.
- Measures: single stream, tokens/s = completion tokens / end-to-end seconds (prefill
  included); at concurrency 4, the group's tokens / its wall time. Ratios (spec / plain of the
  same engine, and each engine against llama-server plain) are geometric means over
  prompts (paired: same prompt and round) with a 95 % cluster-bootstrap interval over
  prompts (``specdec.stats.bootstrap.cluster_bootstrap_geomean``).
- Every item is appended (fsynced) to the results file as it finishes; ``--resume`` skips
  items already there, so a crash loses at most one.
- Memory: all seven servers at once need more than this machine's 24 GiB (vLLM's two take
  about 17: the first attempt ran out, the kernel spent its time on page faults and the
  figures were void). ``--engines`` picks the engines of one run; llama-server, the
  reference, goes into every run, so that each engine's ratio to it is measured within one
  interleaved run.

    .venv/bin/python benchmarks/engines/side_by_side.py [--rounds 2] [--engines A,B] [--out FILE]
    .venv/bin/python benchmarks/engines/side_by_side.py --report FILE   # the table again
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import servers as S

from specdec.endpoint.client import EndpointClient, EndpointConfig, Reply, Request
from specdec.endpoint.pairing import SWITCH_OFF
from specdec.prompt_sets import select_prompts
from specdec.stats.bootstrap import cluster_bootstrap_geomean
from specdec.util.machine import machine_info

OUT = S.REPO / "benchmarks/results/engines/side-by-side.jsonl"
MAX_TOKENS = 64
GROUP = 4
REFERENCE = "llama-server"


@dataclass(frozen=True)
class Variant:
    engine: str
    spec: bool
    url: str
    extra: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.engine}/{'spec' if self.spec else 'plain'}"


ENGINES = ("llama-server", "llama-cpp-python", "specdec-serve", "vllm")


def server_specs(
    root: Path, names: Sequence[str] = ENGINES
) -> tuple[list[S.ServerSpec], list[tuple[str, str, str | None]]]:
    """The servers of the engines ``names``, and per engine (name, spec-on URL, spec-off URL
    or None: the per-request switch)."""
    pairs: dict[str, tuple[S.ServerSpec, S.ServerSpec | None]] = {
        "llama-server": (
            S.llama_server("draft", 18311, root=root, slots=GROUP),
            S.llama_server("off", 18310, root=root, slots=GROUP),
        ),
        "llama-cpp-python": (S.llama_cpp_python("lookup", 18321), S.llama_cpp_python("off", 18320)),
        "specdec-serve": (S.specdec_serve(18330), None),
        "vllm": (S.vllm("draft", 18301, root=root), S.vllm("off", 18300, root=root)),
    }
    specs = [s for n in names for s in pairs[n] if s is not None]
    engines = [(n, pairs[n][0].url, off.url if (off := pairs[n][1]) else None) for n in names]
    return specs, engines


def variants(engines: Sequence[tuple[str, str, str | None]]) -> list[Variant]:
    out = []
    for name, on, off in engines:
        out.append(Variant(name, True, on, {}))
        out.append(Variant(name, False, off or on, {} if off else dict(SWITCH_OFF)))
    return out


def items(n_prompts: int, rounds: int) -> list[tuple[int, int, int]]:
    """(round, concurrency, first prompt) in run order."""
    out = []
    for r in range(rounds):
        for p in range(n_prompts):
            out.append((r, 1, p))
        for g in range(0, n_prompts, GROUP):
            out.append((r, GROUP, g))
    return out


async def measure(v: Variant, prompts: Sequence[str], seed: int) -> dict[str, Any]:
    cfg = EndpointConfig(v.url, api="chat", timeout_s=900, retries=0, extra_body=v.extra)
    async with EndpointClient(cfg, rng=random.Random(seed)) as client:
        await client.resolve_model()
        t0 = time.monotonic()

        async def one(text: str) -> Reply:
            return await client.generate(Request(text, MAX_TOKENS, temperature=0.0, seed=seed))

        replies = await asyncio.gather(*(one(t) for t in prompts))
        wall = time.monotonic() - t0
    tokens = [r.n_tokens or 0 for r in replies]
    drafted = [r.counters.drafted for r in replies if r.counters is not None]
    if not v.spec and v.extra and any(drafted):
        raise SystemExit(f"{v.key}: the per-request switch did not hold (drafted {drafted})")
    return {
        "wall_s": wall,
        "tokens": tokens,
        "e2e_s": [r.e2e_s for r in replies],
        "ttft_s": [r.ttft_s for r in replies],
        "tps": sum(tokens) / wall,
        "drafted": sum(drafted) if drafted else None,
        "accepted": sum(r.counters.accepted for r in replies if r.counters) if drafted else None,
    }


def machine() -> dict[str, Any]:
    flags = sorted({w for w in Path("/proc/cpuinfo").read_text().split() if w.startswith("avx512")})
    return {
        **machine_info(),
        "avx512": flags,
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }


def append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def run(a: argparse.Namespace) -> None:
    prompts = select_prompts(None, per_category=1, seed=0)
    texts = [p.text for p in prompts]
    done: set[tuple[int, int, int, str]] = set()
    if a.resume and a.out.exists():
        for rec in map(json.loads, a.out.read_text().splitlines()):
            if rec["type"] == "item":
                done.add((rec["round"], rec["concurrency"], rec["first"], rec["variant"]))
    elif a.out.exists():
        raise SystemExit(f"{a.out} exists: pass --resume to continue it, or remove it")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    specs, engines = server_specs(a.root, a.engines)
    vs = variants(engines)
    with S.running(specs, a.logs):
        append(
            a.out,
            {
                "type": "header",
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "machine": machine(),
                "prompts": [p.id for p in prompts],
                "variants": [v.key for v in vs],
                "servers": {s.name: s.command() for s in specs},
                "rounds": a.rounds,
                "engines": list(a.engines),
                "max_tokens": MAX_TOKENS,
                "group": GROUP,
            },
        )
        for n, (r, c, first) in enumerate(items(len(texts), a.rounds)):
            order = vs[n % len(vs) :] + vs[: n % len(vs)]  # rotated per item
            group = [texts[(first + j) % len(texts)] for j in range(c)]
            for v in order:
                if (r, c, first, v.key) in done:
                    continue
                res = asyncio.run(measure(v, group, seed=r))
                rec = {"type": "item", "round": r, "concurrency": c, "first": first}
                rec |= {"variant": v.key, "engine": v.engine, "spec": v.spec}
                rec |= {"prompts": [prompts[(first + j) % len(texts)].id for j in range(c)]}
                append(a.out, rec | res)
                print(f"round {r} c={c} prompt {first} {v.key}: {res['tps']:.1f} tok/s",
                      file=sys.stderr, flush=True)  # fmt: skip
        append(a.out, {"type": "footer", "machine": machine()})


# -- the table ---------------------------------------------------------------------------------


def _ratio(
    num: dict[tuple[int, int], float], den: dict[tuple[int, int], float]
) -> tuple[float, float, float, int]:
    keys = sorted(set(num) & set(den))
    if not keys:
        return math.nan, math.nan, math.nan, 0
    vals = [num[k] / den[k] for k in keys]
    gm = math.exp(statistics.fmean(math.log(x) for x in vals))
    lo, hi = cluster_bootstrap_geomean(vals, [str(k[1]) for k in keys])
    return gm, lo, hi, len(keys)


def report(path: Path) -> str:
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    head = next(r for r in recs if r["type"] == "header")
    foot = next((r for r in recs if r["type"] == "footer"), None)
    tps: dict[tuple[str, int], dict[tuple[int, int], float]] = defaultdict(dict)
    acc: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for r in recs:
        if r["type"] != "item":
            continue
        tps[(r["variant"], r["concurrency"])][(r["round"], r["first"])] = r["tps"]
        if r.get("drafted"):
            acc[(r["variant"], r["concurrency"])].append((r["accepted"], r["drafted"]))
    engines = sorted({v.split("/")[0] for v, _ in tps}, key=lambda e: (e != REFERENCE, e))
    out = [
        f"Results file: `{path.relative_to(S.REPO) if path.is_relative_to(S.REPO) else path}`; "
        f"started {head['time']}, {head['rounds']} rounds, {len(head['prompts'])} prompts, "
        f"{head['max_tokens']} new tokens, greedy, chat API.",
        f"Machine: {head['machine']['cores']} cores ({head['machine']['cpu']}), "
        f"{' '.join(head['machine']['avx512'])}; "
        f"load at start: {head['machine']['uptime'].split('load average: ')[-1]}; at end: "
        + (foot["machine"]["uptime"].split("load average: ")[-1] if foot else "(unfinished)"),
        "",
        "| engine | streams | plain tok/s (median) | speculative tok/s (median) | "
        "spec / plain [95 % CI] | acceptance | plain vs llama-server plain [95 % CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in sorted({c for _, c in tps}):
        ref = tps.get((f"{REFERENCE}/plain", c), {})
        for e in engines:
            plain, spec = tps.get((f"{e}/plain", c), {}), tps.get((f"{e}/spec", c), {})
            gm, lo, hi, n = _ratio(spec, plain)
            rg, rlo, rhi, _ = _ratio(plain, ref)
            a = acc.get((f"{e}/spec", c), [])
            rate = sum(x for x, _ in a) / sum(y for _, y in a) if a else math.nan
            med_p = statistics.median(plain.values()) if plain else math.nan
            med_s = statistics.median(spec.values()) if spec else math.nan
            out.append(
                f"| {e} | {c} | {med_p:.1f} | {med_s:.1f} | {gm:.2f}x [{lo:.2f}, {hi:.2f}] "
                f"(n = {n}) | {'n/a' if math.isnan(rate) else f'{rate:.0%}'} | "
                + ("1 (reference)" if e == REFERENCE else f"{rg:.2f}x [{rlo:.2f}, {rhi:.2f}]")
                + " |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--root", type=Path, default=S.DEFAULT_ROOT)
    ap.add_argument("--logs", type=Path, default=Path("/tmp/specdec-engine-logs"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", type=Path, default=None, help="only print the table of FILE")
    ap.add_argument(
        "--engines",
        type=lambda t: tuple(t.split(",")),
        default=ENGINES,
        help=f"comma-separated, from {', '.join(ENGINES)} (all: about 24 GiB of memory, "
        "vLLM's two servers about 17 of them); llama-server is the reference of the last "
        "column, so keep it in every run",
    )
    a = ap.parse_args(argv)
    if unknown := set(a.engines) - set(ENGINES):
        raise SystemExit(f"unknown engines {sorted(unknown)}: choose from {', '.join(ENGINES)}")
    # a plain `kill` ends the run through the `finally` that stops the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.report is None:
        run(a)
    path = a.report or a.out
    table = report(path)
    path.with_suffix(".md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
