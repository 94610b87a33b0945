"""Requantize a draft GGUF (default: the store's 0.5B Q4_K_M draft) to Q4_0 and record it.

The copy goes to requantized/ in the model store ($SPECDEC_CACHE, default
~/.cache/specdec/models) with a JSON sidecar holding its SHA-256 and the
source's (see ``specdec.models.requantize``); a verified cached copy is reused. Optionally
times one decode step of the source and of the copy (``--time-steps``; only meaningful on a
quiet machine) and writes everything as JSON.

    PYTHONPATH=src python benchmarks/studies/requantize_draft.py [MODEL] [--type q4_0] [--pure]
        [--time-steps] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def step_ms(path: Path, threads: int, repeats: int) -> float:
    """Median ms of one single-token decode step after a 100-token context."""
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.profiler.passes import profile_context

    lm = LlamaCppLM(path, n_ctx=256, n_threads=threads)
    ctx = profile_context(lm, 100)
    lm.extend(ctx, last_only=True)
    base = len(ctx)
    lm.extend([ctx[1]])  # warm-up
    lm.truncate(base)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        lm.extend([ctx[1 + i % (base - 1)]])
        times.append(time.perf_counter() - t0)
        lm.truncate(base)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from specdec.hub import resolve
    from specdec.models.requantize import FTYPES, requantize

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=DEFAULT_DRAFT, help="GGUF path or store name")
    ap.add_argument("--type", default="q4_0", choices=sorted(FTYPES))
    ap.add_argument("--pure", action="store_true", help="every tensor in --type (head too)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="requantize even if cached")
    ap.add_argument("--time-steps", action="store_true", help="time one decode step of each")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    source = resolve(args.model, fetch=False)
    res = requantize(source, args.type, pure=args.pure, n_threads=args.threads, force=args.force)
    how = "reused" if res.reused else f"made in {res.seconds:.1f} s"
    print(f"{res.path} ({how})")
    print(f"  sha256 {res.sha256}")
    print(f"  {res.source.stat().st_size / 1e6:.1f} MB -> {res.size / 1e6:.1f} MB")
    report: dict[str, Any] = {"requantized": res.to_dict()}
    if args.time_steps:
        src_ms = step_ms(res.source, args.threads, args.repeats)
        out_ms = step_ms(res.path, args.threads, args.repeats)
        print(f"  decode step: {src_ms:.1f} ms -> {out_ms:.1f} ms ({out_ms / src_ms:.2f}x)")
        report["step_ms"] = {"source": src_ms, "requantized": out_ms, "threads": args.threads}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
