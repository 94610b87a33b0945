"""What exact numerics cost through `specdec serve`, end to end as a client sees it: two servers
of the default configuration (the default target and drafter), one with ``--exact``, one with
``--no-exact``, both up, the same greedy chat requests sent to each in turn (the order
alternating from request to request, so drift falls on both alike). Requests: HumanEval
completions (fresh code: little to copy) and code edits with the code as ``prediction``.

Per request: end-to-end seconds, completion tokens and the speed ratio exact / no-exact
(tokens per second, prefill included); the summary gives the geometric mean over requests and
the lowest ratio. One JSON line per request is appended to ``--out`` as it completes
(``--resume`` keeps those already there). Run it on a quiet machine: it times the servers.

    python benchmarks/serve_exact_price.py --out benchmarks/results/serve-exact-price.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_exact_identity import ask, start_serve, stop

SERVERS = {"exact": ["--exact"], "no-exact": ["--no-exact"]}


def requests(n_code: int, n_edits: int) -> list[dict[str, Any]]:
    from specdec.prompt_sets import load_code_completion, load_code_predict

    code = load_code_completion()
    step = max(1, len(code) // max(1, n_code))
    out = [{"id": p.id, "text": p.text, "prediction": None} for p in code[::step][:n_code]]
    out += [
        {"id": p.id, "text": p.text, "prediction": p.prediction}
        for p in load_code_predict()[:n_edits]
    ]
    return out


def summary(records: list[dict[str, Any]]) -> str:
    ratios = [r["speed_ratio"] for r in records]
    if not ratios:
        return "no requests"
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    fresh = [r["speed_ratio"] for r in records if not r["prediction"]]
    return (
        f"{len(ratios)} requests: exact / no-exact speed {geo:.3f}x geo-mean, lowest "
        f"{min(ratios):.3f}x (fresh code: {min(fresh):.3f}-{max(fresh):.3f}x)"
        if fresh
        else f"{len(ratios)} requests: exact / no-exact speed {geo:.3f}x, lowest {min(ratios):.3f}x"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--summary", action="store_true", help="only print the summary of --out")
    ap.add_argument("--port", type=int, default=8095, help="the first of two ports")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--code", type=int, default=8, help="HumanEval completions")
    ap.add_argument("--edits", type=int, default=4, help="code edits with their predictions")
    args = ap.parse_args(argv)
    if args.summary and not args.out.is_file():
        sys.exit(f"error: {args.out} does not exist")
    if args.summary:
        print(summary([json.loads(x) for x in args.out.read_text().splitlines() if x.strip()]))
        return 0
    if args.out.exists() and not args.resume:
        sys.exit(f"{args.out} exists: --resume to continue it, or remove it")
    done = set()
    if args.out.exists():
        done = {json.loads(x)["id"] for x in args.out.read_text().splitlines() if x.strip()}
    procs, urls = {}, {}
    try:
        for i, (name, flags) in enumerate(SERVERS.items()):
            port = args.port + i
            procs[name] = start_serve(flags, port, args.out.with_suffix(f".{name}.log"))
            urls[name] = f"http://127.0.0.1:{port}"
        names = list(SERVERS)
        for i, item in enumerate(requests(args.code, args.edits)):
            if item["id"] in done:
                continue
            order = names if i % 2 == 0 else names[::-1]
            runs = {n: ask(urls[n], item, args.new_tokens, True) for n in order}
            speed = {
                n: r["usage"].get("completion_tokens", 0) / r["seconds"] for n, r in runs.items()
            }
            rec = {
                "id": item["id"],
                "prediction": item["prediction"] is not None,
                "order": order,
                "same_text": runs["exact"]["text"] == runs["no-exact"]["text"],
                "speed_ratio": speed["exact"] / speed["no-exact"],
                "runs": runs,
            }
            with args.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"{item['id']}: exact / no-exact {rec['speed_ratio']:.3f}x", flush=True)
    finally:
        for p in procs.values():
            stop(p)
    print(summary([json.loads(x) for x in args.out.read_text().splitlines() if x.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
