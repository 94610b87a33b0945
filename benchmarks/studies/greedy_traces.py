"""Greedy traces of the target: prompt token ids and the target's own greedy output ids, one
JSON line per prompt, for ``benchmarks/studies/planner_replay.py``. No timing is taken.

    # generate: the target decodes each prompt greedily (plain steps, one token per pass)
    python benchmarks/studies/greedy_traces.py --source all --per-category 6 \\
        --exclude benchmarks/results/bench-llamacpp.jsonl --out traces.jsonl
    # or take the plain runs' outputs from a bench result file (prompts re-encoded)
    python benchmarks/studies/greedy_traces.py \\
        --from-bench benchmarks/results/bench-llamacpp.jsonl \\
        --out traces.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--source", default="all", help="prompt set: spec_bench, code, all, a file")
    ap.add_argument("--per-category", type=int, default=6)
    ap.add_argument(
        "--exclude",
        type=Path,
        action="append",
        default=[],
        help="skip the prompts of this bench result file (held-out sets)",
    )
    ap.add_argument("--from-bench", type=Path, help="use the plain outputs of this result file")
    ap.add_argument("--max-prompt-tokens", type=int, default=900)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from specdec.core.loop import generate
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.prompt_sets import select_prompts
    from specdec.prompting import encode_prompt

    lm = LlamaCppLM(resolve(args.model), n_ctx=4096, n_threads=args.threads)
    prompts = {p.id: p for p in select_prompts(args.source, per_category=1000)}
    done = set()
    if args.out.exists():  # resume: keep what an earlier run wrote
        done = {json.loads(line)["id"] for line in args.out.read_text().splitlines() if line}
    with args.out.open("a") as out:
        if args.from_bench:
            recs = [json.loads(line) for line in args.from_bench.read_text().splitlines() if line]
            for r in recs:
                if r.get("type") != "measurement" or r["k"] != 0 or r["prompt_id"] in done:
                    continue
                ids = encode_prompt(lm, prompts[r["prompt_id"]].text, chat=True)
                assert len(ids) == r["prompt_tokens"], "the prompt encodes differently now"
                row = {
                    "id": r["prompt_id"],
                    "category": r["category"],
                    "prompt_ids": ids,
                    "tokens": r["tokens"],
                }
                out.write(json.dumps(row) + "\n")
                done.add(r["prompt_id"])
            return 0
        skip = {
            json.loads(line).get("prompt_id")
            for path in args.exclude
            for line in path.read_text().splitlines()
            if line
        }
        for p in select_prompts(args.source, per_category=args.per_category):
            if p.id in skip or p.id in done:
                continue
            ids = encode_prompt(lm, p.text, chat=True)
            if len(ids) > args.max_prompt_tokens:
                continue
            res = generate(lm, None, ids, max_new_tokens=args.new_tokens, k=0, reuse_prefix=False)
            row = {"id": p.id, "category": p.category, "prompt_ids": ids, "tokens": res.tokens}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(p.id, p.category, len(ids), len(res.tokens), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
