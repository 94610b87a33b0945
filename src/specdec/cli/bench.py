"""`specdec bench`: measure plain vs speculative decoding over configurations, K and prompts."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from typing import Any

from specdec.bench.configs import MATRICES, check_unique_labels, parse_config
from specdec.bench.plan import CHAT_CHOICES, MODES, BenchPlan, full_plan, measurements, quick_plan
from specdec.cli import command_help
from specdec.cli.common import parse_int_list
from specdec.cli.endpoint import add_bench_args as add_endpoint_args
from specdec.cli.endpoint import run_bench as run_endpoint_bench
from specdec.errors import ConfigError
from specdec.prompt_sets import select_prompts
from specdec.util.printable import printable

DEFAULT_OUT = "runs/bench.jsonl"
QUICK_OUT = "runs/bench-quick.jsonl"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help=command_help("bench"),
        description=(
            "Run plain decoding (K = 0) and speculative decoding for every K of a sweep on the "
            "same prompts and seeds, for each draft -> target configuration, interleaved; "
            "profile each configuration's verify-batch scaling and step latencies; append one "
            "JSON line per measurement (fsynced). Default: the five configurations of the "
            "study, K = 1..8, greedy, one Spec-Bench prompt per category, 32 new tokens "
            "(an estimated 55-58 min on a 2-core CPU; --quick a few minutes)."
        ),
    )
    p.add_argument(
        "--config",
        action="append",
        metavar="SPEC",
        help="a configuration, repeatable: 'draft=MODEL|ngram[:N],target=MODEL,"
        "[draft_|target_]backend=...,[draft_|target_]dtype=...,[draft_|target_]device=...,"
        "n_ctx=...,n_threads=...,label=...' (default: the five study configurations)",
    )
    p.add_argument(
        "--matrix",
        choices=sorted(MATRICES),
        help="a named set of configurations: study (the default: the five of the study) or "
        "llamacpp (every drafter on the llama.cpp target: planned, suffix, n-gram, the draft "
        "model, hybrid)",
    )
    p.add_argument("--k", metavar="LIST", help="K sweep, e.g. 1,2,4 or 1-8 (default 1-8)")
    p.add_argument(
        "--modes",
        metavar="LIST",
        help=f"decoding modes among {','.join(MODES)} (greedy = argmax, sampled = temperature "
        "1.0; default greedy)",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="JSONL (field prompt, turns or text; optional category, id) or text file, one "
        "prompt per line (default: the packaged Spec-Bench set)",
    )
    p.add_argument(
        "--categories",
        metavar="LIST",
        help="keep these categories (coarse, e.g. mt_bench, or fine, e.g. coding; default: the "
        "six Spec-Bench categories, or all of a --prompts file)",
    )
    p.add_argument(
        "--prompts-per-category",
        type=int,
        metavar="N",
        help="seeded sample of N prompts per category; 0 = all (default 1, or all of a "
        "--prompts file)",
    )
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens per generation (32)")
    p.add_argument("--repeats", type=int, metavar="R", help="repeats of every measurement (1)")
    p.add_argument("--seed", type=int, help="seed for prompt sampling, order and sampling (0)")
    p.add_argument(
        "--chat",
        choices=CHAT_CHOICES,
        help="wrap prompts in the target's chat template (auto: when it has one)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    p.add_argument(
        "--reuse-prefix",
        action="store_true",
        help="let runs on the same prompt reuse the target's cached prompt (faster; decode "
        "speeds still compare, TTFT and end-to-end times do not)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="load every configuration at once and, for each repeat and prompt, run every "
        "configuration's measurements of that prompt before the next prompt, with the "
        "configuration order rotated per prompt, so that slow drift (thermal state, other "
        "load) falls on all configurations alike instead of on whole blocks; needs memory for "
        "all models at once (configurations naming the same model with the same settings "
        "share one loaded instance)",
    )
    p.add_argument(
        "--threads", type=int, metavar="N", help="CPU threads for every model (backend default)"
    )
    p.add_argument("--profile-repeats", type=int, metavar="R", help="profiler repeats (3)")
    p.add_argument("--verify-max", type=int, metavar="N", help="largest verify batch profiled (16)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small subset: configurations llamacpp->llamacpp and llamacpp->hf-bf16, K in "
        "{2,4}, greedy, one prompt from each of mt_bench, translation, summarization, 32 "
        "tokens (a few minutes on a 2-core CPU); other flags still override",
    )
    p.add_argument(
        "--out", metavar="FILE", help=f"results JSONL (default {DEFAULT_OUT}, --quick {QUICK_OUT})"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--resume", action="store_true", help="continue FILE, skipping recorded measurements"
    )
    g.add_argument("--overwrite", action="store_true", help="replace an existing FILE")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_endpoint_args(p)
    p.set_defaults(func=run)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def build_plan(args: argparse.Namespace) -> BenchPlan:
    plan = quick_plan() if args.quick else full_plan()
    changes: dict[str, Any] = {}
    if args.config and args.matrix:
        raise ConfigError("give --config or --matrix, not both")
    if args.matrix:
        changes["configs"] = tuple(MATRICES[args.matrix]())
    if args.config:
        configs = [parse_config(s) for s in args.config]
        check_unique_labels(configs)
        changes["configs"] = tuple(configs)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        cfgs = changes.get("configs", plan.configs)
        changes["configs"] = tuple(
            replace(
                c,
                target=replace(c.target, n_threads=args.threads),
                draft=replace(c.draft, n_threads=args.threads) if c.draft else None,
            )
            for c in cfgs
        )
    if args.k:
        changes["ks"] = parse_int_list(args.k, "K")
    if args.modes:
        changes["modes"] = _names(args.modes)
    if args.prompts:
        changes["prompt_source"] = args.prompts
        changes["categories"] = None
        changes["prompts_per_category"] = 0
    if args.categories:
        changes["categories"] = _names(args.categories)
    for flag, name in (
        ("prompts_per_category", "prompts_per_category"),
        ("max_new_tokens", "max_new_tokens"),
        ("repeats", "repeats"),
        ("seed", "seed"),
        ("chat", "chat"),
        ("profile_repeats", "profile_repeats"),
        ("verify_max", "verify_max"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[name] = value
    if args.ignore_eos:
        changes["stop_on_eos"] = False
    if args.reuse_prefix:
        changes["reuse_prefix"] = True
    if args.interleave:
        changes["interleave"] = True
    return replace(plan, **changes)


def print_plan(plan: BenchPlan) -> None:
    prompts = select_prompts(
        plan.prompt_source,
        categories=plan.categories,
        per_category=plan.prompts_per_category,
        seed=plan.seed,
    )
    cats = Counter(p.category for p in prompts)
    listed = ", ".join(f"{c} {n}" for c, n in cats.items())
    print(f"prompts: {len(prompts)} ({printable(listed)})")
    print(f"K sweep: {', '.join(map(str, plan.ks))}; modes: {', '.join(plan.modes)}")
    print(f"max new tokens: {plan.max_new_tokens}; repeats: {plan.repeats}; seed: {plan.seed}")
    total = 0
    for cfg in plan.configs:
        n = len(measurements(plan, cfg, prompts))
        total += n
        if cfg.free is not None:
            draft = cfg.free
        elif cfg.draft is not None:
            draft = ("hybrid:" if cfg.hybrid else "") + cfg.draft.label()
        else:
            draft = f"ngram {cfg.ngram}"
        ks = f" (K {', '.join(map(str, cfg.ks))})" if cfg.ks else ""
        line = f"{cfg.label}: {draft} -> {cfg.target.label()}{ks}: {n} generations"
        print(f"  {printable(line)}")
    print(f"total: {total} generations")


def run(args: argparse.Namespace) -> int:
    if args.endpoint or args.endpoint_off:  # a running server (docs/endpoint.md)
        return run_endpoint_bench(args)
    from specdec.bench.runner import run_bench
    from specdec.cli.common import check_common, quiet_libraries

    check_common(args)
    quiet_libraries()

    plan = build_plan(args)
    if args.dry_run:
        print_plan(plan)
        return 0
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    progress = not args.no_progress

    def log(msg: str) -> None:
        from tqdm import tqdm

        tqdm.write(printable(msg), file=sys.stderr)

    try:
        outcome = run_bench(
            plan,
            out,
            resume=args.resume,
            overwrite=args.overwrite,
            argv=["specdec", *sys.argv[1:]],
            progress=progress,
            log=log,
        )
    except KeyboardInterrupt:
        print(
            f"specdec bench: interrupted; finished measurements are in {out} "
            "(add --resume to continue)",
            file=sys.stderr,
        )
        raise
    if outcome.partial_line_cut:
        print(f"note: cut a partial last line off {out} before resuming", file=sys.stderr)
    for s in outcome.skipped_prompts:
        print(f"note: skipped {printable(s)}", file=sys.stderr)
    print(
        f"{outcome.measured} measurements written to {out}"
        + (f" ({outcome.already_done} already there)" if outcome.already_done else "")
    )
    print(f"report: specdec report {out}")
    return 0
