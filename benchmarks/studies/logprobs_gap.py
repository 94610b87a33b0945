"""How far speculative decoding's log-probabilities are from plain decoding's on llama.cpp's
default numerics (the batch-invariance gap), and that they are equal with exact numerics.

The same greedy requests decoded plainly (K = 0: every row from a one-token pass) and with the
0.5B draft model (K = 4: rows from verify passes of up to 5 tokens), logprobs with the top 5
alternatives; over the positions where both runs have the same tokens so far (after the
first divergence the contexts differ), the largest |difference| of the chosen token's
log-probability and of the top-5 alternatives' (same ids), and the number of divergences.

    PYTHONPATH=src .venv/bin/python benchmarks/studies/logprobs_gap.py [--exact] [--per-category 1]
        [--new-tokens 64] [--out benchmarks/results/logprobs-gap-default.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    out = a.out or Path(f"benchmarks/results/logprobs-gap-{'exact' if a.exact else 'default'}.json")

    import specdec
    from specdec.prompt_sets import select_prompts
    from specdec.request import make_request
    from specdec.util.machine import machine_info

    pair = specdec.load(TARGET, DRAFT, n_threads=a.threads, exact=a.exact)
    prompts = select_prompts("spec_bench", per_category=a.per_category)
    rows = []
    t0 = time.monotonic()
    for p in prompts:
        runs = {}
        for k in (0, 4):
            req = make_request(p.text, max_new_tokens=a.new_tokens, k=k, logprobs=5, seed=0)
            runs[k] = pair.stream_request(req).run().result
        plain, spec = runs[0], runs[4]
        same = 0
        chosen: list[float] = []
        alternatives: list[float] = []
        for lp0, lp1 in zip(plain.logprobs or [], spec.logprobs or [], strict=False):
            if lp0.token != lp1.token:
                break
            same += 1
            chosen.append(abs(lp0.logprob - lp1.logprob))
            top1 = dict(lp1.top)
            alternatives += [abs(v - top1[i]) for i, v in lp0.top if i in top1]
        rows.append(
            {
                "prompt": p.id,
                "tokens": len(plain.tokens),
                "same_prefix": same,
                "diverged": same < min(len(plain.tokens), len(spec.tokens)),
                "drafted": spec.drafted_tokens,
                "accepted": spec.accepted_tokens,
                "max_abs_diff_chosen": max(chosen, default=0.0),
                "max_abs_diff_top5": max(alternatives, default=0.0),
                "bit_identical": chosen == [0.0] * len(chosen) and not any(alternatives),
            }
        )
        print(json.dumps(rows[-1]))
    summary = {
        "numerics": "exact" if a.exact else "llama.cpp default",
        "positions_compared": sum(r["same_prefix"] for r in rows),
        "prompts_diverged": sum(r["diverged"] for r in rows),
        "max_abs_diff_chosen": max(r["max_abs_diff_chosen"] for r in rows),
        "max_abs_diff_top5": max(r["max_abs_diff_top5"] for r in rows),
        "all_bit_identical": all(r["bit_identical"] for r in rows),
    }
    print(json.dumps(summary))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "what": __doc__.split("\n\n")[1].replace("\n", " "),
                "target": TARGET,
                "draft": DRAFT,
                "new_tokens": a.new_tokens,
                "seconds": time.monotonic() - t0,
                "machine": machine_info(),
                "summary": summary,
                "rows": rows,
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
