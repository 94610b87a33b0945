"""Suffix drafts on a prompt set: match rate, accepted runs, and the time ratio to plain.

For each prompt, plain greedy decoding (K = 0) and suffix-drafted greedy decoding run back to
back on the same llama.cpp target, so slow drift hits both alike. Reports, per prompt and
overall: the share of rounds that found a match and drafted, accepted drafts per drafted
round, per-token acceptance of drafted tokens, the longest accepted run, whether the tokens
equal plain decoding's, and decode tokens/s of both (prefill excluded) with their ratio.
Only meaningful on a quiet machine; the machine's load average is recorded.

    PYTHONPATH=src python benchmarks/studies/suffix_acceptance.py MODEL \\
        [--prompts code_edit] [--k 16]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def encode(lm: Any, text: str, category: str, chat: str) -> list[int]:
    use_chat = chat == "yes" or (chat == "auto" and category != "code_completion")
    if use_chat and lm.tokenizer.chat_template:
        return list(lm.tokenizer.apply_chat([{"role": "user", "content": text}]))
    return list(lm.tokenizer.encode(text))


def main(argv: list[str] | None = None) -> int:
    from specdec.core.loop import generate
    from specdec.drafters.suffix import SuffixDrafter, SuffixOptions
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.prompt_sets import select_prompts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="target GGUF path or store name")
    ap.add_argument("--prompts", default="code_edit", help="a named set or a prompt file")
    ap.add_argument("--categories", help="comma-separated categories to keep")
    ap.add_argument("--per-category", type=int, default=0, help="seeded sample; 0 = all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--chat", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--pad-to", type=int, help="pad verify passes to this many rows")
    ap.add_argument("--pad-min", type=int)
    ap.add_argument("--no-repack", action="store_true")
    ap.add_argument("--min-match", type=int, default=SuffixOptions.min_match)
    ap.add_argument("--max-match", type=int, default=SuffixOptions.max_match)
    ap.add_argument("--draft-per-match", type=float, default=SuffixOptions.draft_per_match)
    ap.add_argument("--min-confidence", type=float, default=SuffixOptions.min_confidence)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    options = SuffixOptions(
        max_draft=max(1, args.k),
        min_match=args.min_match,
        max_match=args.max_match,
        draft_per_match=args.draft_per_match,
        min_confidence=args.min_confidence,
    )
    prompts = select_prompts(
        args.prompts,
        categories=args.categories.split(",") if args.categories else None,
        per_category=args.per_category,
        seed=args.seed,
    )
    target = LlamaCppLM(
        resolve(args.model, fetch=False),
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        repack=not args.no_repack,
        pad_to=args.pad_to,
        pad_min=args.pad_min,
    )
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    runs: Counter[int] = Counter()
    for p in prompts:
        ids = encode(target, p.text, p.category, args.chat)
        if len(ids) + args.max_new_tokens >= target.n_ctx:
            print(f"skip {p.id}: {len(ids)} prompt tokens", file=sys.stderr)
            continue
        common = {"max_new_tokens": args.max_new_tokens, "stop_on_eos": True}
        plain = generate(target, None, ids, k=0, **common)
        drafter = SuffixDrafter(options)
        padded_before = target.padded_calls
        spec = generate(target, drafter, ids, k=args.k, **common)
        drafted = [r for r in spec.rounds if r.k > 0]
        n_drafted = sum(r.k for r in drafted)
        n_accepted = sum(r.n_accepted for r in drafted)
        runs.update(r.n_accepted for r in drafted)
        row = {
            "id": p.id,
            "category": p.category,
            "prompt_tokens": len(ids),
            "tokens": len(spec.tokens),
            "same_tokens_as_plain": spec.tokens == plain.tokens,
            "rounds": spec.n_rounds,
            "match_rate": len(drafted) / spec.n_rounds if spec.rounds else float("nan"),
            "accepted_per_drafted_round": n_accepted / len(drafted) if drafted else 0.0,
            "token_acceptance": n_accepted / n_drafted if n_drafted else float("nan"),
            "longest_run": max((r.n_accepted for r in drafted), default=0),
            "plain_tok_s": plain.tokens_per_second,
            "suffix_tok_s": spec.tokens_per_second,
            "ratio": spec.tokens_per_second / plain.tokens_per_second,
            "padded_passes": target.padded_calls - padded_before,
        }
        rows.append(row)
        print(
            f"{p.id:<36} in {len(ids):>4}  match {row['match_rate']:.2f}  "
            f"acc/round {row['accepted_per_drafted_round']:.1f}  "
            f"tok acc {row['token_acceptance']:.2f}  run {row['longest_run']:>2}  "
            f"{row['plain_tok_s']:.1f} -> {row['suffix_tok_s']:.1f} tok/s  "
            f"x{row['ratio']:.2f}{'' if row['same_tokens_as_plain'] else '  (tokens differ)'}",
            flush=True,
        )
    load_after = os.getloadavg()
    by_cat: dict[str, list[float]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r["ratio"])
    for cat, ratios in by_cat.items():
        print(f"{cat}: geometric mean ratio x{geomean(ratios):.2f} over {len(ratios)} prompts")
    print(f"accepted-run histogram (drafted rounds): {dict(sorted(runs.items()))}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    if args.json:
        report = {
            "model": str(target.path),
            "k": args.k,
            "options": options.__dict__,
            "max_new_tokens": args.max_new_tokens,
            "threads": args.threads,
            "pad_to": target.pad_to,
            "pad_min": target.pad_min,
            "repack": target.repack,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "geomean_ratio_by_category": {c: geomean(v) for c, v in by_cat.items()},
            "accepted_run_histogram": dict(sorted(runs.items())),
            "prompts": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
