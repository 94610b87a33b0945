"""What exact numerics cost on this machine, side by side with llama.cpp's default settings.

Settings, each in processes of its own (ggml reads GGML_CPU_TILED_MM once per process),
alternated over ``--rounds`` rounds (A B C, C B A, ...) so that drift falls on all alike:

  default        llama.cpp as llama-cpp-python loads it (repack on, no flash attention, tiled
                 K-quant path on, F16 KV cache): what a user runs without specdec
  exact          LlamaCppLM(exact=True): the optional kernels that keep rows bit-identical
                 stay, the groups that do not (llama_trust.exact_kernels' verdict, cached; on x86
                 the repacked Q4_K gemm) move to the plain kernels; tiled path off, flash
                 attention, the KV cache types of exact_kernels.EXACT_KV (Q8_0 keys / F16
                 values; F16 keys / Q8_0 values before 2026-12-03)
  exact-none     (``--with-none``) exact numerics with every optional kernel off, as they
                 were before the per-group verdict (repack=False)
  exact-patched  (``--patched-lib DIR``) exact numerics on another llama.cpp build, loaded
                 through LLAMA_CPP_LIB_PATH=DIR without installing it (the exact build, whose
                 row-invariant repacked kernels exact numerics keep: ``make install``)
  default-patched  (with ``--patched-lib``) llama.cpp's defaults on that build (its row-
                 invariant mode off): what the patch costs where it is not asked for
  specdec-default  (``--specdec-default``) llama.cpp's default settings with specdec's
                 default configuration decoding (the planned drafter, costs measured for
                 these numerics): what exact numerics cost specdec's own default decode
  default-stock  (``--stock-lib DIR``) llama.cpp's defaults on the unpatched build in DIR
                 (``make stock-build``'s library): against ``default`` on the installed
                 patched build, what the patch costs where its mode is off

``--only a,b`` runs those settings alone (``default`` always: the ratios' base).

In each process, on the default target (2 threads):
  * prefill throughput: a 512-token prompt, best of 2;
  * the plain step (one-token pass) after 100 and after 1,000 tokens of context, and verify(n)
    for n in 2..16 after 100 tokens: medians of ``--repeats`` passes, n ascending and
    descending in turn;
  * decode speed of a short generation per prompt (``--per-category`` Spec-Bench questions
    per category, 1 by default: 8 prompts with the 2 HumanEval ones; chat template, 64 new
    tokens, greedy): llama-cpp-python's own
    loop (``Llama.create_completion``) on a default instance in ``default`` processes, and
    specdec's default configuration (the planned suffix drafter, costs measured for these
    numerics) on the exact target in ``exact`` processes; decode tokens/s from the first
    token to the last, prefill excluded.

The report gives per-figure medians over rounds and the ratio exact / default with the
spread of the per-round ratios; ``--json`` keeps every sample, written after every round
(``--resume`` continues a stopped run after its last finished round). Timings are only
meaningful on a quiet machine.

    PYTHONPATH=src python benchmarks/exact_cost.py --rounds 3 --with-none \
        [--patched-lib DIR] [--stock-lib DIR] [--per-category N] --json OUT.json
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

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
NS = (1, 2, 3, 4, 6, 8, 12, 16)
TILED_OFF = {"GGML_CPU_TILED_MM": "0"}


def settings(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The settings run, name -> extra environment. Exact numerics set ggml's tiled switch
    themselves (off on a stock build, kept on by the exact build's row-invariant mode)."""
    out = {"default": {}, "exact": {}}
    if getattr(args, "with_none", False):
        out["exact-none"] = dict(TILED_OFF)
    if getattr(args, "patched_lib", None):
        out["default-patched"] = {"LLAMA_CPP_LIB_PATH": str(args.patched_lib)}
        out["exact-patched"] = {"LLAMA_CPP_LIB_PATH": str(args.patched_lib)}
    if getattr(args, "specdec_default", False):
        out["specdec-default"] = {}
    if getattr(args, "stock_lib", None):
        out["default-stock"] = {"LLAMA_CPP_LIB_PATH": str(args.stock_lib)}
    only = getattr(args, "only", None)
    if only:
        wanted = {"default", *only.split(",")}
        unknown = wanted - set(out)
        if unknown:
            raise SystemExit(f"--only: no setting {sorted(unknown)[0]!r} in this run")
        out = {k: v for k, v in out.items() if k in wanted}
    return out


def prompts(per_category: int = 1) -> list[str]:
    from specdec.prompt_sets import load_code_completion, load_spec_bench, sample_per_category

    return [p.text for p in sample_per_category(load_spec_bench(), per_category, seed=0)] + [
        p.text for p in load_code_completion()[:2]
    ]


def time_passes(
    lm: Any, ids: list[int], context: int, ns: tuple[int, ...], repeats: int
) -> dict[int, float]:
    """Median seconds of one pass over n tokens after ``context`` tokens, per n."""
    lm.truncate(0)
    lm.extend(ids[:context], last_only=True)
    fill = ids[context : context + max(ns)]
    for n in (max(ns), 1):  # warm-up
        lm.extend(fill[:n])
        lm.truncate(context)
    samples: dict[int, list[float]] = {n: [] for n in ns}
    for r in range(repeats):
        for n in ns if r % 2 == 0 else tuple(reversed(ns)):
            t0 = time.perf_counter()
            lm.extend(fill[:n])
            samples[n].append(time.perf_counter() - t0)
            lm.truncate(context)
    return {n: statistics.median(s) for n, s in samples.items()}


def llama_cpp_decode(llm: Any, ids: list[int], n_new: int) -> tuple[float, int]:
    """(decode seconds, tokens after the first) of llama-cpp-python's own greedy loop."""
    import llama_cpp

    stamps: dict[int, float] = {}

    def at_token(seen, _logits) -> bool:  # type: ignore[no-untyped-def]
        stamps.setdefault(len(seen), time.perf_counter())
        return False

    llm.reset()
    for _ in llm.create_completion(
        ids,
        max_tokens=n_new,
        temperature=0.0,
        top_k=1,
        stream=True,
        stopping_criteria=llama_cpp.StoppingCriteriaList([at_token]),
    ):
        pass
    t = sorted(stamps.values())
    return t[-1] - t[0], len(t) - 1


def specdec_decode(
    target: Any, drafter: Any, ids: list[int], n_new: int, k: int
) -> tuple[float, int]:
    """(decode seconds, tokens after the first) of specdec's loop, prefill excluded."""
    from specdec.core.loop import generate

    res = generate(target, drafter, ids, max_new_tokens=n_new, k=k, reuse_prefix=False)
    first = res.rounds[0]
    return res.t_total - res.t_prefill - first.t_round, len(res.tokens) - first.n_emitted


def worker(
    setting: str, threads: int, repeats: int, n_new: int, per_category: int = 1
) -> dict[str, Any]:
    from specdec.hub import resolve
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.prompting import encode_prompt

    exact = setting.startswith("exact")
    path = resolve(TARGET, fetch=False)
    repack = False if setting == "exact-none" else None
    lm = LlamaCppLM(path, n_ctx=4096, n_threads=threads, exact=exact, repack=repack)
    from specdec.llama_trust.lib_identity import loaded

    ident = loaded()
    out_kernels = {
        "choice": lm.kernel_choice.text(),
        "lib_path": os.environ.get("LLAMA_CPP_LIB_PATH"),
        "lib": ident.to_json() if ident is not None else None,
        "row_invariant": lm.row_invariant,
    }
    text = "\n".join(prompts() * 4)
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    out: dict[str, Any] = {"setting": setting, "kernels": out_kernels}
    best = float("inf")
    for _ in range(2):
        lm.truncate(0)
        t0 = time.perf_counter()
        lm.extend(ids[:512], last_only=True)
        best = min(best, time.perf_counter() - t0)
    out["prefill_tps"] = 512 / best
    out["step_ms"] = {c: 1e3 * time_passes(lm, ids, c, (1,), repeats)[1] for c in (100, 1000)}
    verify = time_passes(lm, ids, 100, NS, repeats)
    out["verify_ms"] = {n: 1e3 * t for n, t in verify.items()}
    lm.truncate(0)
    gen: list[tuple[float, int]] = []
    if exact or setting == "specdec-default":
        from specdec.drafters.planned import PlannedSuffixDrafter, planned_suffix
        from specdec.models.loader import ModelConfig
        from specdec.pairs import PLANNED_K
        from specdec.profiler.target_costs import cached_target_costs

        cfg = ModelConfig(TARGET, "llamacpp", n_ctx=4096, n_threads=threads, exact=exact)
        # the costs are measured on (and cached for) the target as configured; the
        # kernel choice is part of what the cache key reads from the loaded model
        if setting in ("exact", "specdec-default"):
            costs = cached_target_costs(cfg, lm)
        else:  # other kernels than the cache's exact target: measured for this run only
            from specdec.profiler.target_costs import REPEATS, fitted_passes, target_costs

            n_max, context = fitted_passes(lm.n_ctx)
            costs = target_costs(lm, n_max=n_max, context_tokens=context, repeats=REPEATS)
        # as pairs.load_pair builds the default: the planned options, drafts stopping at an
        # end of generation (before 2026-12-08 this used SuffixDrafter's plain options)
        inner = planned_suffix()
        inner.ends = lm.eos_token_ids
        drafter = PlannedSuffixDrafter(inner, costs)
        for text in prompts(per_category):
            pids = encode_prompt(lm, text, chat=True)
            gen.append(specdec_decode(lm, drafter, pids, n_new, PLANNED_K))
    else:
        for text in prompts(per_category):
            pids = encode_prompt(lm, text, chat=True)
            gen.append(llama_cpp_decode(lm.llm, pids, n_new))
    out["decode_tps"] = [n / s for s, n in gen]
    return out


def run_worker(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    drop = ("GGML_CPU_TILED_MM", "LLAMA_CPP_LIB_PATH", "GGML_CPU_REPACK_ROW_INVARIANT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(settings(args)[setting])
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", setting]
    cmd += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
    cmd += ["--new-tokens", str(args.new_tokens), "--per-category", str(args.per_category)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{setting} failed:\n" + "\n".join(proc.stderr.strip().splitlines()[-10:]))
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_builds_differ(one_round: dict[str, dict[str, Any]]) -> None:
    """Stop a run whose patched build is the installed one's file (it would compare the
    installed build with itself)."""
    from specdec.llama_trust.lib_identity import recorded_problems

    kernels = {name: r.get("kernels", {}) for name, r in one_round.items()}
    problems = recorded_problems({n: (k.get("lib"), k.get("lib_path")) for n, k in kernels.items()})
    if problems:
        raise SystemExit("; ".join(problems))


def gmean(xs: list[float]) -> float:
    return float(statistics.geometric_mean(xs))


def figures(r: dict[str, Any]) -> dict[str, float]:
    """The figures compared, by name (higher is better for tps, lower for ms)."""
    out = {"prefill tok/s (512)": r["prefill_tps"]}
    out.update({f"plain step ms (ctx {c})": v for c, v in r["step_ms"].items()})
    one = r["verify_ms"]["1"]
    out.update({f"verify({n}) / verify(1)": v / one for n, v in r["verify_ms"].items() if n != "1"})
    out[f"decode tok/s ({len(r['decode_tps'])} prompts, gmean)"] = gmean(r["decode_tps"])
    return out


def report(rounds: list[dict[str, dict[str, Any]]]) -> str:
    names = [s for s in rounds[0] if s != "default"]
    per = [{s: figures(r[s]) for s in r} for r in rounds]
    figs = list(per[0]["default"])
    lines = [
        f"{len(rounds)} rounds; medians over rounds; setting / default per round (min..max)",
        "",
        "| figure | default | " + " | ".join(f"{s} | {s} / default | range" for s in names) + " |",
        "|---|---|" + "---|---|---|" * len(names),
    ]
    for fig in figs:
        cells = [f"{statistics.median(p['default'][fig] for p in per):.3g}"]
        for s in names:
            ratios = [p[s][fig] / p["default"][fig] for p in per]
            cells += [
                f"{statistics.median(p[s][fig] for p in per):.3g}",
                f"{statistics.median(ratios):.3f}",
                f"{min(ratios):.3f}..{max(ratios):.3f}",
            ]
        lines.append(f"| {fig} | " + " | ".join(cells) + " |")
    for s in names:
        lines.append(f"{s}: kernels {rounds[0][s].get('kernels')}")
    lines += [
        "",
        "decode tok/s: default = llama-cpp-python's own loop on its default instance; exact* and "
        "specdec-default = specdec's default configuration (planned suffix drafts) on the exact "
        "target and on the default one.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--with-none", action="store_true", help="also exact with no optional kernel")
    ap.add_argument("--patched-lib", type=Path, help="also exact on the build in this lib dir")
    ap.add_argument("--specdec-default", action="store_true", help="also specdec's default decode")
    ap.add_argument(
        "--stock-lib", type=Path, help="also llama.cpp's defaults on the unpatched build here"
    )
    ap.add_argument(
        "--per-category", type=int, default=1, help="Spec-Bench prompts per category decoded"
    )
    ap.add_argument("--only", help="run only these settings (comma-separated) and default")
    ap.add_argument("--json", type=Path, help="written after every round")
    ap.add_argument("--resume", action="store_true", help="continue the rounds in --json")
    ap.add_argument("--from-json", type=Path, help="print the report of a saved run")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(
            json.dumps(
                worker(args.worker, args.threads, args.repeats, args.new_tokens, args.per_category)
            )
        )
        return 0
    if args.from_json:
        print(report(json.loads(args.from_json.read_text())["rounds"]))
        return 0
    for lib in (args.patched_lib, args.stock_lib):
        if lib is not None:
            from specdec.llama_trust.lib_identity import lib_dir_problem

            if (problem := lib_dir_problem(lib)) is not None:
                raise SystemExit(problem)
    load = os.getloadavg()
    names = list(settings(args))
    rounds: list[dict[str, Any]] = []
    spent = 0.0
    if args.resume and args.json and args.json.is_file():  # the rounds a stopped run finished
        done = json.loads(args.json.read_text())
        if sorted(done.get("settings", [])) != sorted(names):
            raise SystemExit(f"--resume: {args.json} holds other settings {done.get('settings')}")
        rounds, spent = list(done["rounds"]), float(done.get("seconds", 0.0))
        print(f"resuming after {len(rounds)} round(s) from {args.json}", file=sys.stderr)
    t0 = time.perf_counter()
    for i in range(len(rounds), args.rounds):
        order = names if i % 2 == 0 else list(reversed(names))
        rounds.append({s: run_worker(s, args) for s in order})
        check_builds_differ(rounds[-1])
        print(
            f"round {i + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr
        )
        if args.json:  # after every round: a stopped run loses at most the round it was in
            write_json(args, names, rounds, load, spent + time.perf_counter() - t0)
    print(report(rounds))
    if args.json:
        print(f"wrote {args.json}")
    return 0


def write_json(
    args: argparse.Namespace,
    names: list[str],
    rounds: list[dict[str, Any]],
    load: tuple[float, float, float],
    seconds: float,
) -> None:
    import llama_cpp

    args.json.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "target": TARGET,
        "threads": args.threads,
        "repeats": args.repeats,
        "settings": names,
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "loadavg_before": load,
            "loadavg_after": os.getloadavg(),
        },
        "seconds": seconds,
        "complete": len(rounds) >= args.rounds,
        "rounds": rounds,
    }
    tmp = args.json.with_name(args.json.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(args.json)


if __name__ == "__main__":
    sys.exit(main())
