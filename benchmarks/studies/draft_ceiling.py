"""The most a draft model could speed up decoding on a measured verify curve, at any acceptance.

A round drafting K tokens with a draft model whose step costs c target steps costs
K * c + verify(K + 1) / verify(1) target steps and keeps at most K + 1 tokens, so even if every
draft is accepted the speedup over plain decoding is at most
max_K (K + 1) / (K * c + verify(K + 1) / verify(1)) (``theory.draft_model_ceiling``). This
prints that ceiling for a table of c values with K + 1 <= 8, with K + 1 <= 16 (the cap the
replay and the default use) and over the curve's whole measured range, and the break-even c:
the largest c whose ceiling is still >= 1.0, found by bisection (the ceiling falls strictly
with c), with the closed form max_K (K + 1 - verify(K + 1) / verify(1)) / K beside it as a
check. A draft dearer than the break-even loses to plain decoding even with perfect
acceptance.

The curve is the medians of a ``verify_curve.py`` file, linear between the measured n. On each
linear piece (K + 1) / (K * c + v(K + 1)) is a ratio of linear functions of K, so monotone: the
best K + 1 is always a measured n or the end of the range, and the interpolation does not
raise the ceiling. With ``--bench``, the measured c of each model draft in a bench file's
profile records (``"draft_kind": "model"``) is printed with its ceiling.

    python benchmarks/studies/draft_ceiling.py \\
        --curve benchmarks/results/verify-curve-1.5b-q4_k_m-wide.json \\
        --bench benchmarks/results/bench-llamacpp-v2.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from planner_replay import load_curve

from specdec.theory import draft_model_ceiling

DEFAULT_CS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.66)
SHORT_N = 8  # drafts of up to 7 tokens, the lengths a model draft runs at in practice
REPLAY_N = 16  # the replay's and the default's cap: K <= 15 drafts, K + 1 <= 16 rows


def curve_ratios(path: Path, setting: str = "default") -> tuple[list[int], list[float]]:
    """(measured n, ratios): ratios[n - 1] = verify(n) / verify(1) for n = 1 .. the largest
    measured n, from the medians, linear between measured n (``planner_replay.load_curve``)."""
    ns = sorted(int(n) for n in json.loads(path.read_text())["settings"][setting]["samples_s"])
    if ns[0] != 1:
        raise ValueError(f"{path}: the curve needs n = 1, got n from {ns[0]}")
    seconds = load_curve(path, setting, n_max=ns[-1])
    return ns, [s / seconds[0] for s in seconds]


def break_even_c(ratios: Sequence[float], iterations: int = 60) -> float | None:
    """The largest c with ``draft_model_ceiling(c, ratios)`` >= 1.0 (bisection), or None when
    even a free draft (c = 0) stays below 1. The ceiling is below 1 at c = 2 on any curve
    ((K + 1) / (2K + v) < 1 for K >= 1, v > 0), so [0, 2] brackets it."""
    if draft_model_ceiling(0.0, ratios)[1] < 1.0:
        return None
    lo, hi = 0.0, 2.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if draft_model_ceiling(mid, ratios)[1] >= 1.0:
            lo = mid
        else:
            hi = mid
    return lo


def closed_form_break_even(ratios: Sequence[float]) -> float:
    """max_K (K + 1 - v(K + 1)) / K: where some K's ceiling term crosses 1."""
    return max((k + 1 - ratios[k]) / k for k in range(1, len(ratios)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curve", type=Path, required=True, help="a verify_curve.py JSON file")
    ap.add_argument("--setting", default="default", help="which setting of the curve file")
    ap.add_argument("--c", type=float, action="append", help="draft step costs (repeatable)")
    ap.add_argument("--bench", type=Path, help="a bench JSONL: quote its model drafts' c")
    args = ap.parse_args()
    ns, ratios = curve_ratios(args.curve, args.setting)
    ranges = {f"K+1 <= {n}": ratios[:n] for n in (SHORT_N, REPLAY_N) if n < ns[-1]}
    ranges[f"K+1 <= {ns[-1]}"] = ratios
    print(
        f"{args.curve.name}, setting {args.setting!r}: verify(n)/verify(1) at measured n = "
        + ", ".join(f"{n}: {ratios[n - 1]:.2f}" for n in ns)
        + " (linear between)"
    )
    print("\nceiling = max_K (K+1) / (K*c + v(K+1)): every draft accepted, draft prefill free")
    print(f"{'c':>6} " + " ".join(f"{name + ': K, ceiling':>22}" for name in ranges))
    for c in args.c or DEFAULT_CS:
        cells = []
        for r in ranges.values():
            k, ceiling = draft_model_ceiling(c, r)
            cells.append(f"{k:>13d} {ceiling:8.3f}")
        print(f"{c:6.3f} " + " ".join(cells))
    print("\nbreak-even c (largest c with ceiling >= 1.0):")
    for name, r in ranges.items():
        be = break_even_c(r)
        text = "none (a free draft stays below 1)" if be is None else f"{be:.4f}"
        print(f"  {name}: bisection {text}; closed form {closed_form_break_even(r):.4f}")
    if args.bench:
        print(f"\nmodel drafts measured in {args.bench.name} (profile records):")
        for line in args.bench.read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("type") != "profile" or rec.get("draft_kind") != "model":
                continue
            c = float(rec["c"])
            cells = []
            for name, r in ranges.items():
                k, ceiling = draft_model_ceiling(c, r)
                cells.append(f"{name}: K = {k}, ceiling {ceiling:.3f}")
            print(f"  {rec['config']}: c = {c:.3f}; " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
