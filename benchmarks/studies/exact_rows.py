"""Per-row bitwise invariance: is each row of an n-token pass the same, bit for bit, as the row
a one-token pass gives for the same context?

For a GGUF (path or store name), each setting below runs in a process of its own (ggml reads
GGML_CPU_TILED_MM once per process). In each, for every thread count and context length, the
context is prefilled once (real text: the Spec-Bench questions), the next max(n) tokens are
scored one per pass, and, after rolling back, the first n of them in one pass for every n;
rows are compared with ``torch.eq`` (no tolerance). Prints, per setting, threads and
context, the first differing row of each pass size ('.' when all rows are identical) and the
largest logit difference, and writes JSON with ``--json``.

  exact            LlamaCppLM(exact=True): the repacked groups whose rows differ moved off
                   (all kept on the exact build), tiled K-quant path off (kept on the exact
                   build), flash attention with Q8_0 keys / F16 values (on the exact build
                   from version 4 llama.cpp's default attention: exact_kernels.exact_attention)
  default          llama.cpp as llama-cpp-python loads it (repack on, no flash attention,
                   tiled path on)
  exact_f16_cache  exact without its cache types (F16 keys and values): flash attention's
                   one-token path then splits the KV range across threads from 512 cells on
  hf_float32 / hf_bfloat16   the transformers backend on the same GGUF (dequantized)
  repack_row_invariant  exact's other settings with every optional kernel kept and the exact
                   build's row-invariant repacked kernels on (GGML_CPU_REPACK_ROW_INVARIANT=1;
                   on a stock build the variable does nothing: see make exact-build)
  repack_stock     the same with that mode off (the repacked gemm from 4 rows)

    PYTHONPATH=src python benchmarks/studies/exact_rows.py MODEL [--settings exact,default]
        [--threads 1,2,3] [--contexts 20,600,1100] [--ns 1-16] [--json out.json]

tests/test_exact.py runs the worker of this script on the small test model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# name -> (extra environment, loader options); "hf_*" load through the transformers backend
# ggml's process-wide switches that the settings set (read once per process)
GGML_SWITCHES = ("GGML_CPU_TILED_MM", "GGML_CPU_REPACK_ROW_INVARIANT")

SETTINGS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "exact": ({}, {"exact": True}),
    "default": ({}, {}),
    "exact_f16_cache": ({"GGML_CPU_TILED_MM": "0"}, {"repack": False, "flash_attn": True}),
    "repack_row_invariant": (
        {"GGML_CPU_TILED_MM": "0", "GGML_CPU_REPACK_ROW_INVARIANT": "1"},
        {"kernels": "all", "flash_attn": True, "type_k": "f16", "type_v": "q8_0"},
    ),
    "repack_stock": (
        {"GGML_CPU_TILED_MM": "0", "GGML_CPU_REPACK_ROW_INVARIANT": "0"},
        {"kernels": "all", "flash_attn": True, "type_k": "f16", "type_v": "q8_0"},
    ),
    # the exact build's row-invariant kernels with three KV-cache choices under flash
    # attention: exact numerics' own (F16 keys / Q8_0 values), the swap (Q8_0 keys / F16
    # values: also types that differ, so the one-token path does not split the KV range),
    # and the F16 cache (the split: the fixture that must differ at long contexts)
    "ri_kv_f16_q8": (
        {"GGML_CPU_REPACK_ROW_INVARIANT": "1"},
        {"flash_attn": True, "type_k": "f16", "type_v": "q8_0"},
    ),
    "ri_kv_q8_f16": (
        {"GGML_CPU_REPACK_ROW_INVARIANT": "1"},
        {"flash_attn": True, "type_k": "q8_0", "type_v": "f16"},
    ),
    "ri_kv_f16_f16": ({"GGML_CPU_REPACK_ROW_INVARIANT": "1"}, {"flash_attn": True}),
    # the row-invariant kernels with llama.cpp's default attention (no flash attention, the
    # F16 cache): its products on F16 run llamafile's sgemm from 2 rows and vec_dot for one,
    # so rows differ from 2 rows unless the build sums a lone row in sgemm's order (patch
    # version 4, whose exact numerics run this attention); ri_noflash_off: the same with the
    # mode off (the fixture that must differ on any build)
    "ri_noflash": ({"GGML_CPU_REPACK_ROW_INVARIANT": "1"}, {}),
    "ri_noflash_off": ({"GGML_CPU_REPACK_ROW_INVARIANT": "0"}, {}),
    "hf_float32": ({}, {"dtype": "float32"}),
    "hf_bfloat16": ({}, {"dtype": "bfloat16"}),
}


def parse_ints(text: str) -> list[int]:
    """'1,2,8' or '1-16' (or a mix: '1-4,8')."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return sorted(out)


def context_ids(lm: Any, n: int) -> list[int]:
    """n tokens of real text (the Spec-Bench questions, repeated as needed)."""
    from specdec.prompt_sets import load_spec_bench

    text = "\n".join(p.text for p in load_spec_bench())
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    return (ids * (n // len(ids) + 1))[:n]


def load(model: str, setting: str, threads: int, n_ctx: int) -> Any:
    from specdec.hub import resolve

    options = SETTINGS[setting][1]
    path = resolve(model, fetch=False)
    if setting.startswith("hf_"):
        from specdec.models.hf import load_hf

        return load_hf(path, n_ctx=n_ctx, n_threads=threads, **options)
    from specdec.llama_trust.ggml_bufts import Choice
    from specdec.models.llamacpp import LlamaCppLM

    if "kernels" in options:  # the optional kernels named outright (no check)
        options = {**options, "kernels": Choice.parse(str(options["kernels"]))}
    return LlamaCppLM(path, n_ctx=n_ctx, n_threads=threads, **options)


def worker(
    model: str, setting: str, threads: list[int], contexts: list[int], ns: list[int]
) -> None:
    """Runs in the subprocess; prints one JSON object {threads: {context: {n: [first row or
    None, max |diff|]}}}."""
    from specdec.models.exact import check_rows_exact

    out: dict[str, dict[str, dict[str, list[Any]]]] = {}
    for th in threads:
        lm = load(model, setting, th, max(contexts) + max(ns) + 8)
        out[str(th)] = {}
        for c in contexts:
            ids = context_ids(lm, c + max(ns))
            checks = check_rows_exact(lm, ids[:c], ids[c:], ns)
            out[str(th)][str(c)] = {str(k.n): [k.first_row, k.max_abs] for k in checks}
        del lm
    print(json.dumps(out), flush=True)


def differing_passes(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(threads, context, n) of every pass with a row that differs, in a ``run_setting``
    result."""
    return [
        (th, c, n)
        for th, by_ctx in result.items()
        for c, row in by_ctx.items()
        for n, (first, _) in row.items()
        if first is not None
    ]


def run_setting(
    model: str, setting: str, threads: list[int], contexts: list[int], ns: list[int]
) -> dict[str, Any]:
    """The worker in a fresh process (PYTHONPATH gets this checkout's src/)."""
    # each setting alone decides ggml's switches: one inherited from the caller (a test process
    # that loaded an exact model sets them) would run "default" as another setting
    env = {k: v for k, v in os.environ.items() if k not in GGML_SWITCHES}
    env.update(SETTINGS[setting][0])
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), model, "--worker", setting]
    cmd += ["--threads", ",".join(map(str, threads)), "--contexts", ",".join(map(str, contexts))]
    cmd += ["--ns", ",".join(map(str, ns))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
        raise RuntimeError(f"setting {setting} failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def format_table(results: dict[str, dict[str, Any]], ns: list[int]) -> str:
    head = "| setting | threads | context | " + " ".join(f"{n:>2}" for n in ns) + " | max abs |"
    lines = [head, "|---|---|---|---|---|"]
    for name, by_threads in results.items():
        for th, by_ctx in by_threads.items():
            for c, row in by_ctx.items():
                marks = " ".join(
                    f"{'.' if row[str(n)][0] is None else row[str(n)][0]:>2}" for n in ns
                )
                worst = max(v[1] for v in row.values())
                lines.append(f"| {name} | {th} | {c} | {marks} | {worst:.3g} |")
    lines.append(
        "('.': every row of that pass size identical to its one-token row; a number: "
        "the first row that differs)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a GGUF path or a store name")
    ap.add_argument("--settings", default="exact,default,exact_f16_cache")
    ap.add_argument("--threads", type=parse_ints, default=[1, 2, 3])
    ap.add_argument("--contexts", type=parse_ints, default=[20, 600, 1100])
    ap.add_argument("--ns", type=parse_ints, default=list(range(1, 17)))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.model, args.worker, args.threads, args.contexts, args.ns)
        return 0
    names = [s for s in args.settings.split(",") if s]
    unknown = [s for s in names if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    t0 = time.perf_counter()
    results = {}
    for name in names:
        print(f"[{name}] ...", file=sys.stderr, flush=True)
        results[name] = run_setting(args.model, name, args.threads, args.contexts, args.ns)
    print(format_table(results, args.ns))
    if args.json:
        from specdec.hub import resolve, sha256_file

        path = resolve(args.model, fetch=False)
        import llama_cpp

        from specdec.llama_trust.lib_identity import loaded

        system_info = llama_cpp.llama_print_system_info().decode()
        ident = loaded()  # the libggml-cpu the workers ran (the same LLAMA_CPP_LIB_PATH)
        report = {
            "model": str(path),
            "model_sha256": sha256_file(path),
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": system_info,
            "lib": ident.to_json() if ident is not None else None,
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "threads": args.threads,
            "contexts": args.contexts,
            "ns": args.ns,
            "seconds": time.perf_counter() - t0,
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
