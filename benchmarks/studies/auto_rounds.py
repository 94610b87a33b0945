"""What ``--auto``'s drafts cost in real decoding, per prompt, from its own rounds.

For every prompt it runs what ``specdec generate --auto`` runs (the cached profile's choice
for the prompt's length: the planned suffix drafter with the profile's costs, or plain
decoding), greedy, and records its rounds. Pooled over all prompts, the median verify time
of the rounds that verified j drafts, over that of the plain rounds (j = 0), is what a round
of j drafts really costs in plain steps here: the same ratio as the profile's verify curve
v(j + 1) / v(1), but measured inside real decoding, at the real contexts. Each prompt's
rounds charged those ratios give its speed against plain decoding without further timing
noise: tokens / sum over rounds of ratio(j).

    python benchmarks/studies/auto_rounds.py --categories math_reasoning,qa,translation,mt_bench
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--source", default="spec_bench")
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--categories", default="math_reasoning,qa,translation,mt_bench")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    from plain_baselines import auto_choice

    from specdec.core.loop import generate
    from specdec.drafters.planned import PlannedSuffixDrafter
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.pairs import parse_drafter
    from specdec.prompt_sets import select_prompts
    from specdec.prompting import encode_prompt

    lm = LlamaCppLM(resolve(args.model), n_ctx=4096, n_threads=args.threads)
    wanted = set(args.categories.split(","))
    prompts = [
        p
        for p in select_prompts(args.source, per_category=args.per_category)
        if p.category in wanted
    ]
    verify_by_k: dict[int, list[float]] = defaultdict(list)
    runs = []
    profile_ratios: list[float] = []
    for p in prompts:
        ids = encode_prompt(lm, p.text, chat=True)
        choice = auto_choice(args.model, args.threads, len(ids), args.new_tokens)
        if not choice.speculative:
            print(f"{p.id}: --auto runs plain decoding here ({len(ids)} prompt tokens)")
            continue
        drafter = PlannedSuffixDrafter(parse_drafter(choice.draft_ref), choice.costs)
        res = generate(
            lm, drafter, ids, max_new_tokens=args.new_tokens, k=choice.policy(), reuse_prefix=False
        )
        for r in res.rounds[1:]:  # the first round also carries the first token's latency
            verify_by_k[r.k].append(r.t_verify)
        runs.append((p, res))
        v = choice.costs.verify_s
        profile_ratios = [x / v[0] for x in v]
    step = statistics.median(verify_by_k[0])
    ratio = {k: statistics.median(ts) / step for k, ts in verify_by_k.items()}
    print(
        "rounds by drafts verified (all prompts, first rounds left out): "
        f"plain step {step * 1e3:.1f} ms"
    )
    for k in sorted(ratio):
        prof = f", profile {profile_ratios[k]:.2f}x" if k < len(profile_ratios) else ""
        print(f"  {k} drafts: {len(verify_by_k[k]):4} rounds, {ratio[k]:.2f}x a plain step{prof}")
    print(
        f"\n{'prompt':18} {'category':15} {'rounds':>6} {'drafted':>7} {'kept':>5} "
        f"{'speed vs plain':>15}"
    )
    speeds = defaultdict(list)
    for p, res in runs:
        drafted = [r for r in res.rounds if r.k]
        steps = sum(ratio.get(r.k, float("nan")) for r in res.rounds)
        speed = len(res.tokens) / steps
        speeds[p.category].append(speed)
        print(
            f"{p.id[:18]:18} {p.category[:15]:15} {len(res.rounds):6} "
            f"{sum(r.k for r in drafted):7} {sum(r.n_accepted for r in drafted):5} "
            f"{speed:14.3f}x"
        )
    print("\nper category, mean over prompts:")
    for c, xs in speeds.items():
        print(f"  {c}: {statistics.fmean(xs):.3f}x (lowest {min(xs):.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
