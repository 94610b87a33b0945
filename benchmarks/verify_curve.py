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

With ``--rounds R`` the settings run in turn R times (the order reversed every other round)
and each setting's pass time is also shown over the first setting's in the same round, median
and range over rounds: settings run one after the other drift apart on a shared machine by
more than the few per cent a kernel change costs, while neighbours in one round do not.

Builds are compared in one run with ``--lib LABEL=DIR`` (another build's lib directory,
loaded through LLAMA_CPP_LIB_PATH) and settings named ``SETTING@LABEL``. Each worker records
the ``libggml-cpu`` it really mapped (path, SHA-256, the exact build's row-invariant version;
``specdec.llama_trust.lib_identity``), and a run whose differently named builds mapped one file, or
whose lib directory holds different files under ``libggml-cpu.so`` and ``.so.0``, stops.

    PYTHONPATH=src python benchmarks/verify_curve.py MODEL [--repeats 5] [--rounds R] \\
        [--lib v3=DIR --settings default,exact,exact@v3] [--json out.json]
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
# ggml's process-wide switches that the settings set (read once per process)
GGML_SWITCHES = ("GGML_CPU_TILED_MM", "GGML_CPU_REPACK_ROW_INVARIANT")

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
    # probes of the row-invariant mode's parts: they need a build of the exact patch with
    # results/exact-build-v3-probe-switches.diff on top (each switch puts one stock part back,
    # so those rows are not row-invariant); any other build ignores them
    "ri_stockq6": ({"GGML_CPU_REPACK_ROW_INVARIANT": "1", "PROBE_STOCK_Q6": "1"}, {}),
    "ri_stockquant": ({"GGML_CPU_REPACK_ROW_INVARIANT": "1", "PROBE_STOCK_QUANT": "1"}, {}),
    "ri_nocolblock": ({"GGML_CPU_REPACK_ROW_INVARIANT": "1", "PROBE_NO_COLBLOCK": "1"}, {}),
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
    from specdec.llama_trust.lib_identity import loaded
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
                "lib": (ident.to_json() if (ident := loaded()) is not None else None),
            }
        ),
        flush=True,
    )


def split_setting(name: str) -> tuple[str, str | None]:
    """``SETTING@LABEL`` -> (SETTING, LABEL); a plain name runs on the installed build."""
    base, _, label = name.partition("@")
    return base, (label or None)


def parse_lib(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--lib wants LABEL=DIR, got {text!r}")
    return label, Path(path)


def run_setting(name: str, args: argparse.Namespace) -> dict[str, Any]:
    base, label = split_setting(name)
    extra_env, _ = SETTINGS[base]
    # the setting alone decides ggml's switches (an inherited one would relabel "default")
    env = {k: v for k, v in os.environ.items() if k not in GGML_SWITCHES}
    env.update(extra_env)
    if label is not None:  # another build; a plain name keeps the caller's LLAMA_CPP_LIB_PATH
        env["LLAMA_CPP_LIB_PATH"] = str(dict(args.lib or [])[label])
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        args.model,
        "--worker",
        base,
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
            "lib_dir": env.get("LLAMA_CPP_LIB_PATH"),
            "median_ms": {str(n): 1e3 * t for n, t in sorted(med.items())},
            "ratio": {str(n): t / one for n, t in sorted(med.items())},
            "repack_buffer_in_log": "CPU_REPACK" in proc.stderr,
            "wall_s": wall,
        }
    )
    return result


def check_builds_differ(per_round: dict[str, list[dict[str, Any]]]) -> None:
    """Stop a run whose settings name different builds but ran one library file."""
    from specdec.llama_trust.lib_identity import recorded_problems

    first = {name: runs[0] for name, runs in per_round.items() if runs}
    problems = recorded_problems({n: (r.get("lib"), r.get("lib_dir")) for n, r in first.items()})
    if problems:
        raise SystemExit("; ".join(problems))


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting over its rounds: medians of all samples pooled, and each round's medians
    (``round_median_ms``) for the per-round ratios of ``vs_first``."""
    out = dict(runs[0])
    ns = sorted(int(n) for n in runs[0]["samples_s"])
    samples = {str(n): [x for r in runs for x in r["samples_s"][str(n)]] for n in ns}
    med = {n: statistics.median(samples[str(n)]) for n in ns}
    out.update(
        {
            "samples_s": samples,
            "median_ms": {str(n): 1e3 * med[n] for n in ns},
            "ratio": {str(n): med[n] / med[ns[0]] for n in ns},
            "round_median_ms": [r["median_ms"] for r in runs],
            "wall_s": sum(r["wall_s"] for r in runs),
        }
    )
    return out


def vs_first(results: dict[str, dict[str, Any]], first: str, ns: list[int]) -> dict[str, Any]:
    """Per setting and n: the pass time over the first setting's in the same round (the two
    ran next to each other), as median and range over rounds."""
    base = results[first]["round_median_ms"]
    out: dict[str, Any] = {}
    for name, r in results.items():
        if name == first:
            continue
        rows = {}
        for n in ns:
            ratios = [
                a[str(n)] / b[str(n)] for a, b in zip(r["round_median_ms"], base, strict=True)
            ]
            rows[str(n)] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "per_round": ratios,
            }
        out[name] = rows
    return out


def format_vs(results: dict[str, dict[str, Any]], first: str, ns: list[int]) -> str:
    table = vs_first(results, first, ns)
    head = f"| pass time / {first}'s, same round | " + " | ".join(f"n={n}" for n in ns) + " |"
    lines = [head, "|---|" + "---|" * len(ns)]
    for name, rows in table.items():
        cells = " | ".join(
            f"{rows[str(n)]['median']:.3f} [{rows[str(n)]['min']:.2f}, {rows[str(n)]['max']:.2f}]"
            for n in ns
        )
        lines.append(f"| {name} | {cells} |")
    lines.append("(median [range] over rounds of the ratio of round medians)")
    return "\n".join(lines)


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
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the settings in turn this many times (order reversed every other round); "
        "with more than one, each setting's pass time is also given over the first setting's "
        "in the same round",
    )
    ap.add_argument(
        "--lib",
        type=parse_lib,
        action="append",
        metavar="LABEL=DIR",
        help="another llama.cpp build's lib directory (LLAMA_CPP_LIB_PATH); settings named "
        "SETTING@LABEL run on it, so builds are compared in one run",
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
    unknown = [s for s in names if split_setting(s)[0] not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    libs = dict(args.lib or [])
    unlabelled = sorted({lab for s in names if (lab := split_setting(s)[1]) and lab not in libs})
    if unlabelled:
        ap.error(f"settings name builds no --lib gives: {unlabelled}")
    from specdec.llama_trust.lib_identity import lib_dir_problem

    for libdir in libs.values():
        if (problem := lib_dir_problem(libdir)) is not None:
            ap.error(problem)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    load_before = os.getloadavg()
    per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.rounds):  # settings in turn, the order reversed every other round
        for name in names if r % 2 == 0 else list(reversed(names)):
            print(f"[round {r + 1}/{args.rounds}: {name}] running ...", file=sys.stderr, flush=True)
            per_round[name].append(run_setting(name, args))
        if r == 0:
            check_builds_differ(per_round)
    load_after = os.getloadavg()
    results = {name: pooled(runs) for name, runs in per_round.items()}
    print(format_table(results, args.ns))
    if args.rounds > 1:
        print(format_vs(results, names[0], args.ns))
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
            "rounds": args.rounds,
            "ns": args.ns,
            "machine": {
                "platform": platform.platform(),
                "processor": platform.processor(),
                "cpu_count": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
            },
            "lib_dirs": {label: str(d) for label, d in libs.items()},
            "settings": results,
            "vs_first": vs_first(results, names[0], args.ns) if args.rounds > 1 else None,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
