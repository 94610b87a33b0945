"""Sweep one llama.cpp pass over n new tokens, verify(n) / verify(1), under several settings.

For a GGUF (a path or a store name) and n in {1, 2, 3, 4, 6, 8, 12, 16, 24, 32} after a
~100-token context, each setting runs in its own subprocess (ggml reads GGML_CPU_TILED_MM
once per process, and the repack choice is made at load):

  default             as specdec loads it today (repack on, tiled K-quant path on)
  tiled_off           env GGML_CPU_TILED_MM=0
  no_repack           llama_model_params.use_extra_bufts = False
  no_repack_tiled_off both
  pad16               default, with passes of pad_min..15 tokens padded to 16 rows (pad rows
                      non-output, removed from the cache after the pass)
  row_invariant       env GGML_CPU_REPACK_ROW_INVARIANT=1 (the exact build's mode; also
                      row_invariant_tiled_off, tiled_forced, no_repack_tiled_forced)
  flash_q8v           exact numerics' attention settings alone: flash attention, F16 keys,
                      Q8_0 values (flash: flash attention with the F16 cache; flash_q8k:
                      Q8_0 keys, F16 values)
  exact               exact numerics as a whole (``exact=True``; on the exact build its
                      row-invariant mode on)

Each pass is timed as ``extend`` then ``truncate`` back to the context; repeats alternate
ascending and descending n; the table shows medians. Prints a table and writes JSON with the
raw samples, the machine's load average before and after, and whether llama.cpp's load log
mentioned a CPU_REPACK buffer. Timings are only meaningful on a quiet machine.

    PYTHONPATH=src python benchmarks/verify_curve.py MODEL [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)

# name -> (extra environment, LlamaCppLM keyword options)
SETTINGS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "default": ({}, {}),
    "tiled_off": ({"GGML_CPU_TILED_MM": "0"}, {}),
    "no_repack": ({}, {"repack": False}),
    "no_repack_tiled_off": ({"GGML_CPU_TILED_MM": "0"}, {"repack": False}),
    "pad16": ({}, {"pad_to": 16}),
    # the exact build's row-invariant mode (`make exact-build`; ignored by the stock build)
    "row_invariant": ({"GGML_CPU_REPACK_ROW_INVARIANT": "1"}, {}),
    "row_invariant_tiled_off": (
        {"GGML_CPU_REPACK_ROW_INVARIANT": "1", "GGML_CPU_TILED_MM": "0"},
        {},
    ),
    # the tiled K-quant path for every row count (ggml's test switch), with and without repack
    # exact numerics' attention settings alone (flash attention, F16 keys / Q8_0 values)
    "flash_q8v": ({}, {"flash_attn": True, "type_k": "f16", "type_v": "q8_0"}),
    "flash": ({}, {"flash_attn": True}),  # flash attention with the F16 cache
    "flash_q8k": ({}, {"flash_attn": True, "type_k": "q8_0", "type_v": "f16"}),  # the swap
    # exact numerics as a whole (on the exact build: its row-invariant mode on, kernels kept)
    "exact": ({}, {"exact": True}),
    "tiled_forced": ({"GGML_CPU_TILED_MM_FORCE": "1"}, {}),
    "no_repack_tiled_forced": ({"GGML_CPU_TILED_MM_FORCE": "1"}, {"repack": False}),
}


def parse_ns(text: str) -> list[int]:
    ns = sorted({int(x) for x in text.split(",") if x.strip()})
    if not ns or ns[0] < 1:
        raise argparse.ArgumentTypeError(f"n values must be >= 1, got {text!r}")
    return ns


def time_passes(lm: Any, context: list[int], ns: list[int], repeats: int) -> dict[int, list[float]]:
    """Seconds of one extend over n tokens after ``context``, per n (repeats samples each)."""
    base = len(context)
    pool = context[1:]
    fill = [pool[i % len(pool)] for i in range(max(ns))]
    lm.truncate(0)
    lm.extend(context, last_only=True)
    for n in (max(ns), 1, max(ns)):  # warm-up
        lm.extend(fill[:n])
        lm.truncate(base)
    samples: dict[int, list[float]] = {n: [] for n in ns}
    for r in range(repeats):
        for n in ns if r % 2 == 0 else reversed(ns):
            t0 = time.perf_counter()
            lm.extend(fill[:n])
            samples[n].append(time.perf_counter() - t0)
            lm.truncate(base)
    return samples


def worker(args: argparse.Namespace) -> None:
    """Runs in the subprocess: load, time, print one JSON line on stdout."""
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.profiler.passes import profile_context

    _, options = SETTINGS[args.worker]
    if "pad_to" in options:
        options = {**options, "pad_min": args.pad_min}
    path = resolve(args.model, fetch=False)
    lm = LlamaCppLM(
        path,
        n_ctx=args.context + max(args.ns) + 32,
        n_threads=args.threads,
        verbose=True,  # the load log goes to stderr; the parent looks for CPU_REPACK there
        **options,
    )
    context = profile_context(lm, args.context)
    samples = time_passes(lm, context, args.ns, args.repeats)
    padded = [n for n in args.ns if lm.will_pad(n)] if lm.pad_to else []
    print(
        json.dumps(
            {
                "samples_s": {str(n): s for n, s in samples.items()},
                "padded_ns": padded,
                "n_threads": lm.n_threads,
                "n_threads_batch": lm.n_threads_batch,
                "n_ubatch": lm.n_ubatch,
                "repack": lm.repack,
                "pad_to": lm.pad_to,
                "pad_min": lm.pad_min,
            }
        ),
        flush=True,
    )


def run_setting(name: str, args: argparse.Namespace) -> dict[str, Any]:
    extra_env, _ = SETTINGS[name]
    env = {**os.environ, **extra_env}
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        args.model,
        "--worker",
        name,
        "--ns",
        ",".join(map(str, args.ns)),
        "--repeats",
        str(args.repeats),
        "--context",
        str(args.context),
        "--threads",
        str(args.threads),
        "--pad-min",
        str(args.pad_min),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"setting {name} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    med = {int(n): statistics.median(s) for n, s in result["samples_s"].items()}
    one = med[min(med)]
    result.update(
        {
            "env": extra_env,
            "median_ms": {str(n): 1e3 * t for n, t in sorted(med.items())},
            "ratio": {str(n): t / one for n, t in sorted(med.items())},
            "repack_buffer_in_log": "CPU_REPACK" in proc.stderr,
            "wall_s": wall,
        }
    )
    return result


def format_table(results: dict[str, dict[str, Any]], ns: list[int]) -> str:
    head = "| setting | verify(1) ms | " + " | ".join(f"n={n}" for n in ns) + " | repack buf |"
    sep = "|---|---|" + "---|" * len(ns) + "---|"
    lines = [head, sep]
    for name, r in results.items():
        ratios = " | ".join(
            f"{r['ratio'][str(n)]:.2f}{'*' if n in r.get('padded_ns', []) else ''}" for n in ns
        )
        lines.append(
            f"| {name} | {r['median_ms'][str(ns[0])]:.1f} | {ratios} | "
            f"{'yes' if r['repack_buffer_in_log'] else 'no'} |"
        )
    lines.append("(* = that pass ran padded to pad_to rows)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a GGUF path or a store name")
    ap.add_argument("--ns", type=parse_ns, default=list(DEFAULT_NS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=100, help="context tokens before each pass")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--pad-min",
        type=int,
        default=2,
        help="pad16 pads passes of pad-min..15 tokens (default 2, so every n < 16 is shown "
        "padded; compare with default to pick where padding pays)",
    )
    ap.add_argument(
        "--settings", default=",".join(SETTINGS), help=f"subset of {', '.join(SETTINGS)}"
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.worker:
        worker(args)
        return 0
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in names if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    load_before = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"[{name}] running ...", file=sys.stderr, flush=True)
        results[name] = run_setting(name, args)
    load_after = os.getloadavg()
    print(format_table(results, args.ns))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    if args.json:
        from specdec.hub import resolve, sha256_file

        path = resolve(args.model, fetch=False)
        report = {
            "model": str(path),
            "model_sha256": sha256_file(path),
            "context_tokens": args.context,
            "threads": args.threads,
            "repeats": args.repeats,
            "ns": args.ns,
            "machine": {
                "platform": platform.platform(),
                "processor": platform.processor(),
                "cpu_count": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
            },
            "settings": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
