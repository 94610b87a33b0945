"""Replay model-free drafters on recorded greedy outputs: deterministic speed estimates.

A suffix drafter's proposals depend only on the context, and under greedy decoding the target
keeps a draft token exactly when it equals the target's own next token. So given the target's
greedy output for a prompt (a *trace*: prompt ids plus output ids, from
``benchmarks/studies/greedy_traces.py``), every round of a model-free drafter can be replayed
without running the model: which drafts it proposes, how many the target keeps, and how many
rows each verification pass has. Charging each round the measured verify curve (``--curve``)
gives its speed relative to plain decoding with no timing noise at all, so drafters and
draft-length policies can be compared on the same outputs, including

  oracle   the suffix drafter's proposals cut to the lengths that are best *given the
           number of tokens the target will keep* (not causal), planned over the whole
           output by dynamic programming (``profiler.predict.best_length_plan``): the
           ceiling of any length policy over these proposals on this verify curve.
  tree-oracle  every candidate continuation the suffix index offers (after each earlier
           occurrence of the context's last min_match tokens, no candidate limit), the one
           the target follows longest, cut to the best lengths like oracle, K <= 16, and
           charged only that path's rows: the ceiling of any token tree over suffix
           candidates (a real tree verifies more rows than the path it keeps).

The estimate shares the speed model's limits: it uses a verify curve measured at one context
length and ignores per-round Python overhead beyond the curve (see ``theory.Costs``). Where
speculative decoding's batch numerics change the greedy output (llama.cpp, see
docs/certify.md), a real run follows a different text than the trace.

It also prints the acceptance rates per match-length bucket that the cost-aware planner
(``drafters/planned.py``) uses as priors, measured on the traces.

    python benchmarks/studies/planner_replay.py \\
        --traces benchmarks/results/greedy-traces-train.jsonl \\
        --curve benchmarks/results/verify-curve-1.5b-q4_k_m-wide.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specdec.core.drafter import Drafter
from specdec.core.sampling import SamplingConfig, make_generator
from specdec.drafters.planned import BUCKETS, PlannedSuffixDrafter, bucket_of, planned_suffix
from specdec.drafters.prediction_state import kept_prefix
from specdec.drafters.suffix import SuffixDrafter, parse_suffix_options
from specdec.profiler.measure import model_free_probe, round_walk_probe
from specdec.profiler.predict import ProbeSequence, best_length_plan, plan_seconds, simulate
from specdec.theory import Costs

GREEDY = SamplingConfig()
K_CAP = 16  # the oracles' draft-length cap
Trace = dict[str, Any]  # id, category, prompt_ids, tokens


def load_traces(path: Path) -> list[Trace]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_curve(path: Path, setting: str = "default", n_max: int = 16) -> tuple[float, ...]:
    """verify seconds for n = 1..n_max from a verify-curve file (benchmarks/verify_curve.py,
    medians, linear between measured n, the last one held beyond) or a cached profile's
    ``costs``."""
    data = json.loads(path.read_text())
    if "costs" in data:
        return tuple(float(x) for x in data["costs"]["verify_s"])
    samples = data["settings"][setting]["samples_s"]
    ns = sorted(int(n) for n in samples)
    med = {n: statistics.median(samples[str(n)]) for n in ns}
    out = []
    for n in range(1, n_max + 1):
        lo = max(m for m in ns if m <= n)
        hi = min((m for m in ns if m >= n), default=lo)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out.append(med[lo] + w * (med[hi] - med[lo]))
    return tuple(out)


def replay(drafter: Drafter, trace: Trace, k: int, costs: Costs) -> tuple[float, list[int]]:
    """(seconds, drafts per round) of replaying a drafter over one trace at K = k: the
    profiler's own round walk (``round_walk_probe``, ``simulate``, ``plan_seconds``)."""
    seq = round_walk_probe(drafter, trace["prompt_ids"], trace["tokens"], k)
    plan = simulate(seq, k)
    return plan_seconds(plan, costs), list(plan.drafted)


def oracle_probe(trace: Trace, k_cap: int = K_CAP) -> ProbeSequence:
    """What the suffix drafter proposes at every position of the trace (up to k_cap tokens)
    and how much of it the target keeps: its proposal depends only on the context, the
    prompt plus the fixed greedy output up to there."""
    drafter = SuffixDrafter(parse_suffix_options(""))
    return model_free_probe(drafter, trace["prompt_ids"], trace["tokens"], k_cap)


def oracle_seconds(trace: Trace, costs: Costs, k_cap: int = K_CAP) -> float:
    """Decode seconds of ``oracle``: the suffix drafter's proposals cut to the lengths that
    are best over the whole output (reads the trace: a ceiling, not a drafter)."""
    return plan_seconds(best_length_plan(oracle_probe(trace, k_cap), k_cap, costs), costs)


def candidate_positions(context: Sequence[int], min_match: int) -> list[int]:
    """Every earlier position j (min_match <= j < len(context)) whose preceding min_match
    tokens equal the context's last min_match: the positions that follow an earlier
    occurrence of the context's suffix, for every suffix length >= min_match the suffix
    drafter looks up (a longer match implies this one), with no ``max_candidates`` limit."""
    length = len(context)
    if length < min_match:
        return []
    tail = list(context[length - min_match :])
    return [j for j in range(min_match, length) if list(context[j - min_match : j]) == tail]


def tree_matched(context: Sequence[int], future: Sequence[int], min_match: int) -> int:
    """The most leading tokens of ``future`` that one candidate continuation matches, over
    every candidate of ``candidate_positions``. Candidate j continues with context[j:] and,
    past the end, periodically (context[j + (d mod (len - j))]), as the suffix drafter's
    draft does, so every suffix proposal is a prefix of some candidate."""
    length = len(context)
    best = 0
    for j in candidate_positions(context, min_match):
        period = length - j
        n = 0
        while n < len(future) and context[j + n % period] == future[n]:
            n += 1
        best = max(best, n)
        if best == len(future):
            break
    return best


def tree_probe(trace: Trace, k_cap: int = K_CAP, min_match: int | None = None) -> ProbeSequence:
    """For every position of the trace, (k_cap, the most leading output tokens one candidate
    continuation matches, ``tree_matched``) where the context offers a candidate, else (0, 0):
    a candidate continues indefinitely (periodically past the context's end), so a path of
    any length up to k_cap can be drafted along the best one."""
    mm = parse_suffix_options("").min_match if min_match is None else min_match
    prompt, out = [int(x) for x in trace["prompt_ids"]], [int(x) for x in trace["tokens"]]
    proposals: list[tuple[int, int]] = []
    for t in range(len(out)):
        context = prompt + out[:t]
        if candidate_positions(context, mm):
            proposals.append((k_cap, tree_matched(context, out[t : t + k_cap], mm)))
        else:
            proposals.append((0, 0))
    return ProbeSequence(len(prompt), len(out), proposals=tuple(proposals))


def tree_oracle_seconds(
    trace: Trace, costs: Costs, k_cap: int = K_CAP, min_match: int | None = None
) -> float:
    """Decode seconds of ``tree-oracle``, the ceiling of token trees over suffix candidates
    (reads the trace: not a drafter).

    A tree verifies several candidate continuations in one pass, one row per node; under
    greedy decoding a round keeps the longest prefix of some candidate that equals the
    target's output. This oracle looks at every candidate the context offers
    (``tree_matched``), takes the one the target follows longest, and cuts it to the lengths
    that are best over the whole output (``best_length_plan``), as ``oracle`` does; each
    round is charged only that path, verify(n + 1), while a real tree holding the path has
    at least that many rows. So no tree built from suffix-index candidates, sized by any
    policy, beats it."""
    probe = tree_probe(trace, k_cap, min_match)
    return plan_seconds(best_length_plan(probe, k_cap, costs), costs)


def gmean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def bucket_rates(traces: Sequence[Trace]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(kept, tried) per match-length bucket for the first draft token and for continuation
    tokens, over every position of every trace where the suffix drafter has a proposal."""
    first = [(0, 0)] * len(BUCKETS)
    cont = [(0, 0)] * len(BUCKETS)
    for tr in traces:
        d = SuffixDrafter(parse_suffix_options(""))
        prompt, out = list(tr["prompt_ids"]), list(tr["tokens"])
        gen = make_generator(0)
        d.prefill(prompt[:-1])
        for t in range(len(out) - 1):
            draft = d.propose(prompt + out[:t], 16, GREEDY, gen).tokens
            if not draft:
                continue
            b, m = bucket_of(d.last_match_len), kept_prefix(draft, out[t:])  # what greedy keeps
            first[b] = (first[b][0] + int(m >= 1), first[b][1] + 1)
            tried = min(len(draft), m + 1) - 1  # continuation tokens that were tested
            cont[b] = (cont[b][0] + min(m, len(draft)) - int(m >= 1), cont[b][1] + max(0, tried))
    return first, cont


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, action="append", required=True)
    ap.add_argument("--curve", type=Path, required=True, help="verify curve or cached costs")
    ap.add_argument("--setting", default="default", help="which setting of a verify-curve file")
    ap.add_argument("--planner-curve", type=Path, help="the curve the planner believes")
    ap.add_argument(
        "--ends",
        default="",
        help="the target's end-of-generation ids, comma-separated (as specdec's pairs give "
        "the suffix drafter; Qwen2.5: 151643,151645,151662,151663,151664): no draft past one",
    )
    args = ap.parse_args()
    try:
        ends = frozenset(int(x) for x in args.ends.split(",") if x.strip())
    except ValueError:
        ap.error(f"--ends: comma-separated token ids, got {args.ends!r}")
    traces = [t for p in args.traces for t in load_traces(p)]
    costs = Costs(verify_s=load_curve(args.curve, args.setting), prefill_tps=math.inf)
    believed = (
        Costs(verify_s=load_curve(args.planner_curve, args.setting), prefill_tps=math.inf)
        if args.planner_curve
        else costs
    )
    v1 = costs.verify_s[0]
    print(
        f"{len(traces)} traces; verify(n)/verify(1), n = 1..8: "
        + ", ".join(f"{v / v1:.2f}" for v in costs.verify_s[:8])
    )

    def suffix() -> SuffixDrafter:
        return SuffixDrafter(parse_suffix_options(""), ends=ends)

    def planned_64() -> SuffixDrafter:
        drafter = planned_suffix()
        drafter.ends = ends
        return drafter

    def walk(make: Callable[[], Drafter], k: int) -> Callable[[Trace], float]:
        return lambda tr: replay(make(), tr, k, costs)[0]

    policies: dict[str, Callable[[Trace], float]] = {
        **{f"suffix K={k}": walk(suffix, k) for k in (1, 2, 3, 4, 8)},
        "planned K=16": walk(lambda: PlannedSuffixDrafter(suffix(), believed), 16),
        "planned, long": walk(  # exploring drafts as long as optimism says (before 11-30)
            lambda: PlannedSuffixDrafter(suffix(), believed, explore_len=None), 16
        ),
        "planned, no budget": walk(  # drafts unbounded in total (before 12-07)
            lambda: PlannedSuffixDrafter(suffix(), believed, explore_budget=None), 16
        ),
        "planned-64": walk(lambda: PlannedSuffixDrafter(planned_64(), believed), 64),
        "planned-64, no budget": walk(
            lambda: PlannedSuffixDrafter(planned_64(), believed, explore_budget=None), 64
        ),
        "oracle K=16": lambda tr: oracle_seconds(tr, costs, K_CAP),
        "tree-oracle": lambda tr: tree_oracle_seconds(tr, costs, K_CAP),  # K = 16 too
    }
    by_cat: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, seconds_of in policies.items():
        for tr in traces:
            seconds = seconds_of(tr)
            by_cat[name][tr["category"]].append(
                len(tr["tokens"]) * costs.round_seconds(0) / seconds
            )
    cats = sorted({tr["category"] for tr in traces})
    print("\nreplayed speed relative to plain decoding (geometric mean per category)")
    print(f"{'policy':22} " + " ".join(f"{c[:10]:>10}" for c in cats) + f" {'all':>7} {'worst':>6}")
    for name in policies:
        allv = [x for c in cats for x in by_cat[name][c]]
        cells = [
            f"{gmean(by_cat[name][c]):10.3f}" if by_cat[name][c] else f"{'':>10}" for c in cats
        ]
        print(f"{name:22} " + " ".join(cells) + f" {gmean(allv):7.3f} {min(allv):6.2f}")
    first, cont = bucket_rates(traces)
    print("\nacceptance per match-length bucket, every position with a proposal:")
    for b, lo in enumerate(BUCKETS):
        (fk, ft), (ck, ct) = first[b], cont[b]
        if ft:
            print(
                f"  match >= {lo}: first token {fk}/{ft} = {fk / ft:.2f}; "
                f"continuation {ck}/{ct} = {ck / max(ct, 1):.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
