"""Replay the prediction drafter on recorded greedy outputs: timing-free speeds and ceilings.

Under greedy decoding the target keeps a draft token exactly when it equals the target's own
next token, so given the target's greedy output for a request (a trace from
``benchmarks/studies/greedy_traces.py``) every round of the prediction drafter can be replayed
without the model: what it drafts, how much is kept, the rows of each pass. Charging each round a
verify curve (``--curve``: a ``verify_curve.py`` JSON, or a cached costs/profile JSON) gives
its speed relative to plain decoding with no timing noise, beside the request's verify-curve
ceiling (``specdec.bench.copy_ceiling``). Decoders:

  K<=16   the prediction drafter in front of the planned suffix drafter, drafts capped at 16
  K<=64   the same, capped at 64 (the default)

Prints per request: the ceiling, each decoder's predicted speedup over plain decoding and its
fraction of the ceiling, rounds, mean rows per pass, the longest pass, and the positions the
prediction's index examined per round; then geometric means per kind of task.

    PYTHONPATH=src python benchmarks/studies/prediction_replay.py --traces traces.jsonl \\
        --curve benchmarks/results/verify-curve-1.5b-q4_k_m-wide.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.bench.copy_ceiling import request_ceiling
from specdec.core.drafter import Drafter
from specdec.drafters.planned import PlannedSuffixDrafter, planned_suffix
from specdec.drafters.prediction import PredictionDrafter
from specdec.profiler.measure import round_walk_probe
from specdec.profiler.predict import plan_seconds, simulate
from specdec.theory import Costs

N_MAX = 65  # the longest pass a curve is read to


def load_curve(path: Path, setting: str = "default", n_max: int = N_MAX) -> tuple[float, ...]:
    """verify(n) / verify(1) for n = 1..n_max, linear between measured n, from a
    ``verify_curve.py`` JSON (its ``setting``); or a cached costs or profile JSON's
    ``verify_s`` (as far as it goes)."""
    data = json.loads(path.read_text())
    if "costs" in data and "verify_s" in data["costs"]:
        v = [float(x) for x in data["costs"]["verify_s"]][:n_max]
        return tuple(x / v[0] for x in v)
    samples = data["settings"][setting]["samples_s"]
    med = {int(n): statistics.median(s) for n, s in samples.items()}
    ns = sorted(med)
    out = []
    for n in range(1, min(n_max, ns[-1]) + 1):
        lo = max(m for m in ns if m <= n)
        hi = min(m for m in ns if m >= n)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out.append(med[lo] + w * (med[hi] - med[lo]))
    return tuple(x / out[0] for x in out)


def replay(
    make: Callable[[], Drafter], trace: dict[str, Any], k: int, costs: Costs
) -> dict[str, Any]:
    """One decoder's replay of one trace: predicted speedup over plain, rounds, rows."""
    drafter = make()
    seq = round_walk_probe(drafter, trace["prompt_ids"], trace["tokens"], k)
    plan = simulate(seq, k)
    seconds = plan_seconds(plan, costs)
    plain = len(trace["tokens"]) * costs.round_seconds(0)
    index = getattr(drafter, "index", None)
    probes = getattr(index, "probes", None)
    rounds = len(plan.drafted)
    return {
        "speedup": plain / seconds,
        "rounds": rounds,
        "rows_per_pass": sum(d + 1 for d in plan.drafted) / rounds,
        "longest_pass": max(d + 1 for d in plan.drafted),
        "drafted": sum(plan.drafted),
        "kept": sum(plan.kept),
        "probes_per_round": probes / rounds if probes is not None else math.nan,
    }


def gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--curve", type=Path, required=True)
    ap.add_argument("--setting", default="default", help="the curve file's setting")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import llama_cpp

    from specdec.hub import resolve
    from specdec.prompt_sets import load_code_predict

    vocab = llama_cpp.Llama(str(resolve(args.model)), vocab_only=True, verbose=False)
    predictions = {p.id: p for p in load_code_predict()}
    ratios = load_curve(args.curve, args.setting)
    costs = Costs(verify_s=ratios, prefill_tps=math.inf)
    traces = [json.loads(line) for line in args.traces.read_text().splitlines() if line]
    decoders = {"K<=16": 16, "K<=64": 64}
    rows: dict[str, dict[str, Any]] = {}
    print(
        f"curve {args.curve} ({len(ratios)} points): "
        + ", ".join(
            f"v({n})={ratios[n - 1]:.2f}"
            for n in (2, 4, 8, 16, 17, 24, 32, 48, 64)
            if n <= len(ratios)
        )
    )
    print(
        f"{'request':28} {'ceiling':>8} {'alpha':>6} {'K*':>3} "
        + " ".join(f"{d + ' speed (of ceiling) rows/pass max probes/round':>50}" for d in decoders)
    )
    for tr in traces:
        p = predictions[tr["id"]]
        pred = list(vocab.tokenize(p.prediction.encode(), add_bos=False, special=False))
        ceiling = request_ceiling(pred, tr["tokens"], ratios)
        row: dict[str, Any] = {"kind": p.fine_category, "ceiling": ceiling.to_dict()}
        cells = []
        for name, k in decoders.items():

            def make(pred: list[int] = pred) -> Drafter:
                planned = PlannedSuffixDrafter(planned_suffix(), costs)
                return PredictionDrafter(pred, costs=costs, fallback=planned)

            r = replay(make, tr, k, costs)
            r["of_ceiling"] = r["speedup"] / ceiling.speedup
            row[name] = r
            cells.append(
                f"{r['speedup']:.3f}x ({r['of_ceiling']:.3f}) {r['rows_per_pass']:6.2f} "
                f"{r['longest_pass']:3d} {r['probes_per_round']:8.1f}"
            )
        rows[tr["id"]] = row
        print(
            f"{tr['id'][:28]:28} {ceiling.speedup:7.3f}x {ceiling.alpha:6.3f} "
            f"{ceiling.best_k:3d} " + " ".join(f"{c:>50}" for c in cells)
        )
    kinds = sorted({r["kind"] for r in rows.values()})
    edits = [r for r in rows.values() if not r["kind"].startswith("control_")]
    for name in decoders:
        print(
            f"{name}: edits, geometric mean of speed / ceiling "
            f"{gmean([r[name]['of_ceiling'] for r in edits]):.3f}, speedup "
            f"{gmean([r[name]['speedup'] for r in edits]):.3f}x"
        )
        for kind in kinds:
            sel = [r for r in rows.values() if r["kind"] == kind]
            print(
                f"  {kind:20} {gmean([r[name]['of_ceiling'] for r in sel]):.3f} of ceiling, "
                f"{gmean([r[name]['speedup'] for r in sel]):.3f}x ({len(sel)} requests)"
            )
    if args.json:
        args.json.write_text(json.dumps({"curve": ratios, "requests": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
