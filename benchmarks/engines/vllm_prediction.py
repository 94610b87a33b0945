"""OpenAI's ``prediction`` on vLLM CPU with specdec-vllm (``integrations/vllm``), against the
same vLLM without speculation and with vLLM's own n-gram method, end to end through the same
API (issue 63, item 4).

Design, fixed before the run:

- Three servers of vLLM CPU 0.32.0 on Qwen2.5-Coder-1.5B-Instruct bf16 (``setup_vllm.sh``),
  the expand-kernel fix loaded in each, 2 threads, all up at once: "off" (no speculation),
  "ngram" (vLLM's prompt lookup, 2..4-gram, K = 4) and "prediction" (specdec-vllm's proposer,
  drafts up to 16 tokens sized by its step clock).
- Requests: code edits of the packaged ``code_predict`` set (``EDITS`` below: renames, type
  hints, small edits, a docstring; the edit categories, no controls), chat API, greedy,
  ``MAX_TOKENS`` new tokens, the code to edit as ``prediction`` (OpenAI's form). The same body
  goes to all three servers: the two without the plugin ignore ``prediction`` (vLLM drops
  unknown fields), so the requests are identical.
- Batch 1 (one request at a time) and batch 4 (four concurrent requests, one group).
- Interleaving: every item (one request, or one group of 4) goes to each server in turn, and
  the order of the servers rotates from item to item.
- Measures: end-to-end seconds per item (client side: request sent to full reply, prefill
  included); tokens/s = completion tokens / item seconds. Ratios (prediction / off, ngram /
  off, prediction / ngram) are geometric means over items of the paired tokens/s. Greedy
  identity: each reply's text against the "off" server's on the same item.
- Every item is appended (fsynced) as it finishes; ``--resume`` skips items already there.

    python benchmarks/engines/vllm_prediction.py [--batch 1,4] [--resume]   # about 20 min
    python benchmarks/engines/vllm_prediction.py --resume --round 1   # the same items again
    python benchmarks/engines/vllm_prediction.py --report [FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers as S

from specdec.prompt_sets import load_code_predict
from specdec.util.machine import machine_info

OUT = S.REPO / "benchmarks/results/engines/vllm-prediction.jsonl"
MAX_TOKENS = 192
GROUP = 4
EDITS = (
    "rename_3",
    "rename_6",
    "type_hints_3",
    "type_hints_6",
    "small_edit_4",
    "small_edit_6",
    "docstring_3",
    "rename_5",
)
MODES = ("off", "ngram", "prediction")
PORTS = {"off": 18400, "ngram": 18401, "prediction": 18402}
MODEL = "qwen2.5-coder-1.5b"


def requests() -> list[tuple[str, str, str]]:
    """(id, prompt, prediction) of the edits, in ``EDITS`` order."""
    by_id = {p.id.split(":", 1)[1]: p for p in load_code_predict()}
    out = []
    for name in EDITS:
        p = by_id[name]
        assert p.prediction is not None
        out.append((name, p.text, p.prediction))
    return out


def items(batch: int, n: int) -> list[tuple[int, ...]]:
    """The request indices of each item: one each (batch 1) or groups of ``batch``."""
    return [tuple(range(i, min(n, i + batch))) for i in range(0, n, batch)]


async def one(client: httpx.AsyncClient, url: str, prompt: str, prediction: str) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "seed": 0,
        "prediction": {"type": "content", "content": prediction},
    }
    t0 = time.monotonic()
    r = await client.post(url + "/v1/chat/completions", json=body)
    e2e = time.monotonic() - t0
    if r.status_code != 200:
        raise SystemExit(f"{url}: {r.status_code} {r.text[:500]}")
    data = r.json()
    usage = data["usage"]
    details = usage.get("completion_tokens_details") or {}
    spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
    return {
        "e2e_s": e2e,
        "tokens": int(usage["completion_tokens"]),
        "text": data["choices"][0]["message"]["content"],
        "accepted_prediction_tokens": details.get("accepted_prediction_tokens"),
        "rejected_prediction_tokens": details.get("rejected_prediction_tokens"),
        "drafted": spec.get("num_draft_tokens"),
        "accepted": spec.get("num_accepted_draft_tokens"),
    }


async def measure(url: str, reqs: list[tuple[str, str, str]]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=1800, trust_env=False) as client:
        t0 = time.monotonic()
        replies = await asyncio.gather(*(one(client, url, p, pred) for _, p, pred in reqs))
        wall = time.monotonic() - t0
    tokens = sum(r["tokens"] for r in replies)
    return {"wall_s": wall, "tps": tokens / wall, "replies": replies}


def done_keys(path: Path) -> set[tuple[int, int, str, int]]:
    if not path.exists():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "item":
            out.add((rec.get("round", 0), rec["batch"], rec["mode"], rec["item"]))
    return out


def append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def machine() -> dict[str, Any]:
    flags = sorted({w for w in Path("/proc/cpuinfo").read_text().split() if w.startswith("avx512")})
    return {
        **machine_info(),
        "avx512": flags,
        "amx": "amx_tile" in Path("/proc/cpuinfo").read_text(),
    }


def run(a: argparse.Namespace) -> None:
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not a.resume and out.exists():
        raise SystemExit(f"{out} exists: --resume to continue it, or another --out")
    reqs = requests()
    batches = [int(b) for b in a.batch.split(",")]
    if any(b not in (1, GROUP) for b in batches):
        raise SystemExit(f"--batch: 1 and/or {GROUP}")
    done = done_keys(out)
    root = Path(a.root)
    specs = [S.vllm(m, PORTS[m], root=root, fix=True) for m in MODES]
    with S.running(specs, Path(a.logs)) as started:
        urls = {m: s.spec.url for m, s in zip(MODES, started, strict=True)}
        run = {"kind": "run", "round": a.round, "batch": batches, "machine": machine()}
        append(out, {**run, "time": time.time()})
        # one request per server first (not recorded): the first calls of each kernel
        for m in MODES:
            asyncio.run(measure(urls[m], [reqs[-1]]))
        for batch in batches:
            for i, idx in enumerate(items(batch, len(reqs))):
                order = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
                for m in order:
                    if (a.round, batch, m, i) in done:
                        continue
                    res = asyncio.run(measure(urls[m], [reqs[j] for j in idx]))
                    rec = {"kind": "item", "round": a.round, "batch": batch, "mode": m, "item": i}
                    rec |= {"ids": [reqs[j][0] for j in idx], **res}
                    append(out, rec)
                    print(f"batch {batch} item {i} {m}: {res['tps']:.2f} tok/s", flush=True)


def report(path: Path) -> str:
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    runs = [r for r in recs if r["kind"] == "run"]
    by: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in recs:
        if r["kind"] == "item":
            by.setdefault((r["batch"], r.get("round", 0), r["item"]), {})[r["mode"]] = r
    lines = []
    if runs:
        m = runs[0]["machine"]
        lines.append(f"machine: {m.get('cpu')}; AVX-512: {' '.join(m['avx512'])}; ")
        lines[-1] += f"AMX: {'yes' if m.get('amx') else 'no'}"
    lines.append(
        "batch | items | tok/s off | tok/s ngram | tok/s prediction | prediction/off | "
        "ngram/off | prediction/ngram | greedy identical (ngram, prediction) | "
        "prediction tokens accepted/rejected"
    )
    for batch in sorted({b for b, _, _ in by}):
        full = [v for (b, _, _), v in sorted(by.items()) if b == batch and len(v) == len(MODES)]
        if not full:
            continue

        def gm(num: str, den: str, rows: list[dict[str, dict[str, Any]]] = full) -> float:
            return math.exp(statistics.mean(math.log(v[num]["tps"] / v[den]["tps"]) for v in rows))

        def same(mode: str, rows: list[dict[str, dict[str, Any]]] = full) -> str:
            pairs = [
                (a["text"], b["text"])
                for v in rows
                for a, b in zip(v[mode]["replies"], v["off"]["replies"], strict=True)
            ]
            return f"{sum(x == y for x, y in pairs)}/{len(pairs)}"

        tps = {m: statistics.mean(v[m]["tps"] for v in full) for m in MODES}
        acc = sum(
            r["accepted_prediction_tokens"] or 0 for v in full for r in v["prediction"]["replies"]
        )
        rej = sum(
            r["rejected_prediction_tokens"] or 0 for v in full for r in v["prediction"]["replies"]
        )
        lines.append(
            f"{batch} | {len(full)} | {tps['off']:.2f} | {tps['ngram']:.2f} | "
            f"{tps['prediction']:.2f} | {gm('prediction', 'off'):.2f}x | "
            f"{gm('ngram', 'off'):.2f}x | {gm('prediction', 'ngram'):.2f}x | "
            f"{same('ngram')}, {same('prediction')} | {acc}/{rej}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default=f"1,{GROUP}", help="1, 4 or 1,4 (one server start)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--root", default=str(S.DEFAULT_ROOT))
    ap.add_argument("--logs", default="/tmp/specdec-vllm-prediction-logs")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--round", type=int, default=0, help="a repeat of the same items (0, 1, ...)")
    ap.add_argument("--report", nargs="?", const=str(OUT), default=None)
    a = ap.parse_args(argv)
    if a.report:
        print(report(Path(a.report)))
        return 0
    run(a)
    print(report(Path(a.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
