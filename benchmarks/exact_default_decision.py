"""How stable the first-use decision "exact numerics by default?" is on this machine: the
decision's measurement (``profiler.exact_price.measure_exact_price``, as the first load of a
target makes it, extra rounds while unsure included) repeated ``--repeats`` times, each an
independent verdict, with its figures. A user gets one of these verdicts, cached; where they
disagree, the price sits within this machine's noise of the 3 % rule.

    .venv/bin/python benchmarks/exact_default_decision.py --repeats 3 \\
        --json benchmarks/results/exact-default-decision.json

Run it on a quiet machine (nothing else heavy): it times the target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specdec.hub import resolve
from specdec.models.llamacpp import build_identity
from specdec.profiler.exact_price import DEFAULT_MAX_COST, measure_exact_price
from specdec.util.machine import machine_line

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    ident = build_identity()
    if ident is None or ident[1] <= 0:
        print("error: the installed llama-cpp-python has no row-invariant mode", file=sys.stderr)
        return 2
    path = str(resolve(args.target, fetch=False))
    out = {
        "command": " ".join(sys.argv),
        "machine": machine_line(),
        "threads": args.threads,
        "row_invariant_version": ident[1],
        "rule": f"each of plain step, 8-token verify, prefill at most {DEFAULT_MAX_COST:.0%}",
        "decisions": [],
    }
    for i in range(args.repeats):
        t0 = time.perf_counter()
        price = measure_exact_price(path, args.threads)
        row = {**price.to_dict(), "seconds": round(time.perf_counter() - t0, 1)}
        out["decisions"].append(row)
        print(f"[{i + 1}/{args.repeats}] {price.sentence()} in {row['seconds']} s", flush=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")  # after each: resumable by eye
    yes = sum(d["default"] for d in out["decisions"])
    print(f"exact numerics the default in {yes} of {args.repeats} independent decisions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
