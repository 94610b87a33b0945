"""What log-probabilities cost decode speed: the same requests decoded with and without
``logprobs=5`` (each emitted token's log-probability and its top 5 alternatives, read from the
rows the target's passes already computed), interleaved on one loaded pair, for plain decoding
(K = 0), the 0.5B draft model (K = 4) and the default drafter (suffix drafts sized by cost).

    PYTHONPATH=src .venv/bin/python benchmarks/logprobs_cost.py [--per-category 1]
        [--new-tokens 96] [--repeats 2] [--out benchmarks/results/logprobs-cost.json]

Decode speed is the result's tokens per second (prefill excluded); the ratio per
configuration is the geometric mean over (prompt, repeat) pairs of with / without, both runs
of a pair back to back in alternating order. Run it under ``/work/bin/cpu-quiet`` (nothing
else on the machine): the figures are only as good as the quiet.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the target's numerics (default: as specdec.load decides them)",
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/logprobs-cost.json"))
    a = ap.parse_args()

    import specdec
    from specdec.prompt_sets import select_prompts
    from specdec.request import make_request
    from specdec.util.machine import machine_info

    prompts = select_prompts("spec_bench", per_category=a.per_category)
    pairs = {
        "plain (k=0)": (specdec.load(TARGET, DRAFT, n_threads=a.threads, exact=a.exact), 0),
        "0.5B draft, k=4": (None, 4),  # the same loaded pair
        "default drafter": (specdec.load(TARGET, n_threads=a.threads, exact=a.exact), None),
    }
    model_pair = pairs["plain (k=0)"][0]
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    for rep in range(a.repeats):
        for i, p in enumerate(prompts):
            for name, (pair, k) in pairs.items():
                pair = pair or model_pair
                assert pair is not None
                order = (None, a.top) if (rep + i) % 2 == 0 else (a.top, None)
                got: dict[Any, float] = {}
                tokens: dict[Any, list[int]] = {}
                for top in order:
                    req = make_request(
                        p.text, max_new_tokens=a.new_tokens, k=k, logprobs=top, seed=0
                    )
                    done = pair.stream_request(req).run()
                    got[top] = done.result.tokens_per_second
                    tokens[top] = done.tokens
                assert tokens[None] == tokens[a.top], "logprobs changed the output"
                rows.append(
                    {
                        "config": name,
                        "prompt": p.id,
                        "repeat": rep,
                        "tok_s_without": got[None],
                        "tok_s_with": got[a.top],
                        "ratio": got[a.top] / got[None],
                        "tokens": len(tokens[None]),
                    }
                )
                print(f"{name:18s} {p.id:28s} {got[None]:6.2f} -> {got[a.top]:6.2f} tok/s")
    summary = {}
    for name in pairs:
        r = [x["ratio"] for x in rows if x["config"] == name]
        summary[name] = {
            "geomean_ratio": math.exp(statistics.fmean(math.log(x) for x in r)),
            "min_ratio": min(r),
            "max_ratio": max(r),
            "pairs": len(r),
            "median_tok_s_without": statistics.median(
                x["tok_s_without"] for x in rows if x["config"] == name
            ),
        }
    out = {
        "what": f"decode tok/s with logprobs={a.top} / without, same requests, greedy",
        "target": TARGET,
        "draft": DRAFT,
        "new_tokens": a.new_tokens,
        "threads": a.threads,
        "exact_numerics": {
            name: pair.config.target.exact
            for name, (pair, _) in pairs.items()
            if pair is not None and pair.config is not None
        },
        "machine": machine_info(),
        "seconds": time.monotonic() - t_start,
        "summary": summary,
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    for name, s in summary.items():
        print(
            f"{name}: with/without {s['geomean_ratio']:.3f} (geomean of {s['pairs']} pairs, "
            f"{s['min_ratio']:.3f}-{s['max_ratio']:.3f}; {s['median_tok_s_without']:.1f} tok/s "
            "without)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
