"""Per-kernel row invariance: which of llama.cpp's CPU kernels give a token the same logits,
bit for bit, whether it is scored alone or inside an n-token pass?

For each model, configurations start from exact numerics' settings with *every* weight on the
plain kernels (``plain``: no optional kernel, tiled K-quant path off, flash attention, F16 keys
/ Q8_0 values) and change one thing each:

  BUFT/TYPE   that one group (a weight type in an extra buffer type, ``llama_trust.ggml_bufts``)
              back on its optional kernel (CPU_REPACK's repacked gemm/gemv), others plain
  tiled       the tiled K-quant path on (GGML_CPU_TILED_MM unset: K-quant weights on the
              plain buffer, 8+ rows; ggml reads the variable once per process, so it cannot
              be chosen per tensor)
  no-fa       no flash attention (F16 cache): attention as batched F16 mat-muls
  f16-v       flash attention with an F16 value cache (the one-token path's split KV)

Each configuration runs in a process of its own; in it, for each thread count and context,
the context (real text) is prefilled once, the next max(n) tokens are scored one per pass,
and after rolling back the first n of them in one pass, for every n; rows are compared with
``torch.eq`` (``models.exact.check_rows_exact``). The weights on the plain buffer run ggml's
``vec_dot`` per output element, or llamafile's sgemm for the types it has (Q8_0, Q4_0, Q5_0,
F16 ...; from 2 rows): ``plain`` covers those, per model. Numbers, not timings: a busy machine
gives the same bits.

    PYTHONPATH=src python benchmarks/studies/kernel_rows.py [--models NAME ...] [--threads 1,2]
        [--contexts 20,1100] [--ns 1-32,65] [--requantize q4_0] [--json FILE]

``--json`` merges what ran into the file's results (per model, configuration, thread count
and context), so the grid can be run in parts: long contexts only where attention is the
question, a smaller grid for the largest model.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exact_rows import context_ids, parse_ints

MODELS = (
    "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder-1.5b-instruct-q4_k_m",
)
TILED_ENV = "GGML_CPU_TILED_MM"
# name -> (tiled path on, flash attention, type_k, type_v); groups are added per model
FIXED = {
    "plain": (False, True, "f16", "q8_0"),
    "tiled": (True, True, "f16", "q8_0"),
    "no-fa": (False, False, "f16", "f16"),
    "f16-v": (False, True, "f16", "f16"),
}


def groups_of(path: Path) -> list[str]:
    """The (buffer type, weight type) groups llama.cpp's default load uses for ``path``."""
    import llama_cpp

    from specdec.hub.gguf import check_gguf_header
    from specdec.llama_trust.ggml_bufts import Choice, ggml, weight_groups

    return list(weight_groups(ggml(llama_cpp), check_gguf_header(path).tensors, Choice()))


def settings(config: str, groups: list[str]) -> tuple[bool, dict[str, Any]]:
    """(tiled on, LlamaCppLM options) of a configuration."""
    from specdec.llama_trust.ggml_bufts import Choice

    if config in FIXED:
        tiled, fa, tk, tv = FIXED[config]
        keep: set[str] = set()
    else:
        tiled, fa, tk, tv = FIXED["plain"]
        keep = {config}
    kernels = Choice(avoid=tuple(sorted(set(groups) - keep)))
    return tiled, {"kernels": kernels, "flash_attn": fa, "type_k": tk, "type_v": tv}


def worker(path: str, config: str, threads: list[int], contexts: list[int], ns: list[int]) -> None:
    """In the child: {threads: {context: {n: [first differing row or None, max |diff|]}}}."""
    from specdec.models.exact import check_rows_exact
    from specdec.models.llamacpp import LlamaCppLM

    _, options = settings(config, groups_of(Path(path)))
    out: dict[str, dict[str, dict[str, list[Any]]]] = {}
    for th in threads:
        lm = LlamaCppLM(path, n_ctx=max(contexts) + max(ns) + 8, n_threads=th, **options)
        out[str(th)] = {}
        for c in contexts:
            ids = context_ids(lm, c + max(ns))
            checks = check_rows_exact(lm, ids[:c], ids[c:], ns)
            out[str(th)][str(c)] = {str(k.n): [k.first_row, k.max_abs] for k in checks}
        del lm
    print(json.dumps(out), flush=True)


def run_config(
    path: Path, config: str, groups: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    tiled, _ = settings(config, groups)
    env = {k: v for k, v in os.environ.items() if k != TILED_ENV}
    if not tiled:
        env[TILED_ENV] = "0"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", config, "--path", str(path)]
    cmd += ["--threads", ",".join(map(str, args.threads))]
    cmd += ["--contexts", ",".join(map(str, args.contexts)), "--ns", ",".join(map(str, args.ns))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
        raise RuntimeError(f"{path.name} {config} failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def ranges(ns: list[int]) -> str:
    """[2, 3, 4, 8] -> '2-4, 8'; [] -> 'none'."""
    if not ns:
        return "none"
    parts, start, prev = [], ns[0], ns[0]
    for n in [*ns[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def summary(result: dict[str, Any]) -> list[tuple[str, str, str, float]]:
    """(threads, context, pass sizes whose rows differ, max |diff|) per cell."""
    out = []
    for th, by_ctx in result.items():
        for c, row in by_ctx.items():
            bad = sorted(int(n) for n, (first, _) in row.items() if first is not None)
            out.append((th, c, ranges(bad), max(v[1] for v in row.values())))
    return out


def format_table(report: dict[str, Any]) -> str:
    lines = [
        "| model | configuration | threads | context | n whose rows differ | max abs |",
        "|---|---|---|---|---|---|",
    ]
    for model, entry in report["results"].items():
        for config, result in entry["configs"].items():
            for th, c, bad, worst in summary(result):
                lines.append(f"| {model} | {config} | {th} | {c} | {bad} | {worst:.3g} |")
    return "\n".join(lines)


def model_paths(names: list[str], requantize_to: str | None) -> list[tuple[str, Path]]:
    from specdec.hub import find_entry, model_path

    out = []
    for name in names:
        entry = find_entry(name)
        if entry is None or not model_path(entry).exists():
            print(f"skipped {name}: not in the store", file=sys.stderr)
            continue
        out.append((name, model_path(entry)))
    if requantize_to and out:
        from specdec.models.requantize import requantize

        name, path = out[0]
        for ftype in requantize_to.split(","):
            pure = not ftype.endswith(("_k_m", "_k_s"))  # a mix keeps its mixing rules
            out.append((f"{name}-as-{ftype}", requantize(path, ftype, pure=pure).path))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--configs", default="", help="comma-separated (default: all)")
    ap.add_argument("--threads", type=parse_ints, default=[1, 2])
    ap.add_argument("--contexts", type=parse_ints, default=[20, 1100])
    ap.add_argument("--ns", type=parse_ints, default=[*range(1, 33), 65])
    ap.add_argument(
        "--requantize", help="also the first model requantized to these types (q4_0,q4_k_m)"
    )
    ap.add_argument("--skip-first", action="store_true", help="only the requantized copies")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.path, args.worker, args.threads, args.contexts, args.ns)
        return 0
    results: dict[str, dict[str, Any]] = {}
    paths = model_paths(args.models, args.requantize)
    for name, path in paths[1:] if args.skip_first and args.requantize else paths:
        t_model = time.perf_counter()
        groups = groups_of(path)
        configs = ["plain", *groups, *[c for c in FIXED if c != "plain"]]
        if args.configs:
            configs = [c for c in configs if c in args.configs.split(",")]
        by_config = {}
        for config in configs:
            print(f"[{name} {config}] ...", file=sys.stderr, flush=True)
            by_config[config] = run_config(path, config, groups, args)
        results[name] = {
            "groups": groups,
            "threads": args.threads,
            "contexts": args.contexts,
            "ns": args.ns,
            "seconds": round(time.perf_counter() - t_model, 1),
            "configs": by_config,
        }
    import llama_cpp

    from specdec.util.machine import cpu_model

    report: dict[str, Any] = {"results": {}}
    if args.json and args.json.is_file():  # earlier models' results stay (--merge)
        report = json.loads(args.json.read_text(encoding="utf-8"))
    report.update(
        llama_cpp_python=llama_cpp.__version__,
        system_info=llama_cpp.llama_print_system_info().decode(),
        machine={"cpu": cpu_model(), "platform": platform.platform(), "cpus": os.cpu_count()},
    )
    for name, entry in results.items():  # merged per model, configuration, threads, context
        have = report["results"].setdefault(name, {**entry, "configs": {}})
        have["seconds"] = round(have.get("seconds", 0) + entry["seconds"], 1)
        for key in ("threads", "contexts", "ns"):
            have[key] = sorted({*have.get(key, []), *entry[key]})
        for config, by_threads in entry["configs"].items():
            cell = have["configs"].setdefault(config, {})
            for th, by_ctx in by_threads.items():
                cell.setdefault(th, {}).update(by_ctx)
    print(format_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
