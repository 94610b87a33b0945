"""`specdec profile`: decide before speculating (see specdec.profiler)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from specdec.cli import command_help
from specdec.util.printable import printable


def register(sub: argparse._SubParsersAction) -> None:
    from specdec.pairs import DEFAULT_DRAFT, DEFAULT_TARGET

    p = sub.add_parser(
        "profile",
        help=command_help("profile"),
        description="Measure every way to run the target on this machine (plain decoding on "
        "each backend; each drafter with each backend and K), predict tokens/s and end-to-end "
        "time from the measured costs and a greedy acceptance probe on your prompts, check the "
        "top predictions with short real runs, and recommend one configuration with its "
        "reason. Results are cached per machine, package versions, model files (SHA-256) and "
        "settings.",
    )
    p.add_argument("--target", default=DEFAULT_TARGET, help="target model reference")
    p.add_argument(
        "--draft",
        action="append",
        default=None,
        help=f"a drafter to consider (repeatable; default: {DEFAULT_DRAFT}, ngram, suffix)",
    )
    p.add_argument(
        "--target-backend",
        action="append",
        default=None,
        choices=("llamacpp", "hf", "mock"),
        help="a target backend to consider (repeatable; default: llamacpp and hf)",
    )
    p.add_argument("--draft-backend", default="llamacpp", choices=("llamacpp", "hf", "mock"))
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompts", default=None, help="probe prompts (JSONL or text file)")
    src.add_argument("--category", action="append", default=None, help="Spec-Bench category")
    p.add_argument("--n-prompts", type=int, default=1, help="probe prompts per category (1)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens per probe run (32)")
    p.add_argument("--chat", choices=("auto", "on", "off"), default="auto")
    p.add_argument(
        "--check-top",
        type=int,
        default=2,
        help="real runs of the top N predictions (2), besides plain decoding and planned",
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=run)


def probe_prompts(args: argparse.Namespace) -> list[str]:
    from specdec.errors import ConfigError
    from specdec.prompt_sets import select_prompts

    if args.n_prompts < 1:
        raise ConfigError(f"--n-prompts must be >= 1, got {args.n_prompts}")
    prompts = select_prompts(args.prompts, categories=args.category, per_category=args.n_prompts)
    if not prompts:
        raise ConfigError("no probe prompts selected")
    return [p.text for p in prompts]


def spec_from_args(args: argparse.Namespace) -> Any:
    from specdec.profiler.run import ProfileSpec

    # the defaults are ProfileSpec's, so that the profile cached here is the one that
    # `generate` (no flags, or --auto) looks up
    default = ProfileSpec()
    return ProfileSpec(
        target=args.target,
        target_backends=tuple(args.target_backend or default.target_backends),
        drafts=tuple(args.draft or default.drafts),
        draft_backend=args.draft_backend,
        n_new=args.new_tokens,
        check_top=args.check_top,
        chat=args.chat != "off",
        n_ctx=args.n_ctx,
        n_threads=args.threads,
    )


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def render(result: Any) -> str:
    """The ranked table, the checks and the recommendation, as text."""
    from specdec.profiler.decide import DEFAULT_MARGIN, FALLBACK_MARGIN

    prompt = round(sum(result.prompt_tokens) / len(result.prompt_tokens))
    rec = result.rank_for(prompt, result.spec["n_new"])
    lines = [
        f"probe: {len(result.prompt_tokens)} prompts (mean {prompt} tokens), "
        f"{result.spec['n_new']} new tokens each, greedy",
        "",
        f"{'configuration':42} {'K':>3} {'tok/s':>7} {'decode':>7} {'e2e':>6}  kept/round",
    ]
    for s in rec.ranked:
        lines.append(
            f"{s.candidate.label:42} {s.k:>3} {_fmt(s.prediction.decode_tps, '.1f'):>7} "
            f"{_fmt(s.decode_speedup_vs_plain):>6}x {_fmt(s.speedup_vs_plain):>5}x  "
            f"{s.prediction.mean_kept:.2f} of {s.prediction.mean_drafted:.2f}"
        )
    lines.append(
        f"(predicted; speedups against the fastest plain decoder, {rec.plain.candidate.label})"
    )
    for backend, why in result.skipped_backends.items():
        lines.append(f"{backend}: {why}")
    if result.checks:
        head = (
            f"{'checked with real runs':42} {'K':>3} {'predicted':>9} {'measured':>9} {'error':>6}"
        )
        lines += ["", head]
        for c in result.checks:
            lines.append(
                f"{c['config']:42} {c['k']:>3} {_fmt(c['predicted_tps'], '.1f'):>9} "
                f"{_fmt(c['measured_tps'], '.1f'):>9} {_fmt(100 * c['error'], '+.0f'):>5}%"
            )
    r = result.recommendation
    # the measured choice agrees with the prediction: word it with the current rule
    same = r["label"] == rec.best.candidate.label and r["k"] == rec.best.k
    lines += [
        "",
        f"recommendation: {r['label']}" + (f", K={r['k']}" if r["k"] else ""),
        f"  {rec.reason if same else r['reason']}",
        f"  (speculation is chosen when measured {DEFAULT_MARGIN:.2f}x faster end to end than "
        "the fastest plain decoder; else the planned suffix drafter, which falls back to plain "
        f"steps by itself, unless it measured below {FALLBACK_MARGIN:.2f}x of it)",
    ]
    if result.exact:
        from specdec.profiler.exact_price import ExactPrice

        lines.append("  " + ExactPrice.from_dict(result.exact).sentence())
    if result.build:
        from specdec.models.llamacpp import build_line

        lines.append("  " + build_line(result.build))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from specdec.cli.common import check_common, quiet_libraries
    from specdec.profiler.run import run_profile
    from specdec.util.jsonable import json_ready

    check_common(args)  # --threads, --n-ctx: as generate checks them
    quiet_libraries()
    spec = spec_from_args(args)
    result = run_profile(
        spec,
        probe_prompts(args),
        refresh=args.refresh,
        log=lambda m: print(f"[specdec] {printable(m)}", file=sys.stderr),
    )
    if args.json:
        print(json.dumps(json_ready(result.to_dict()), allow_nan=False))
    else:
        print(render(result))
    return 0
