"""`specdec certify`: statistically valid evidence that a setup is lossless."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from specdec.cli import command_help
from specdec.cli.common import add_model_args, check_common, model_configs, quiet_libraries
from specdec.cli.endpoint import add_certify_args as add_endpoint_args
from specdec.cli.endpoint import run_certify as run_endpoint_certify
from specdec.errors import ConfigError
from specdec.util.printable import printable

# specdec.certify.faults.ALL_FAULTS (not imported here: it pulls in torch at CLI start-up;
# a test checks that the two agree)
FAULT_CHOICES = (
    "residual-is-p",
    "always-accept",
    "residual-is-p-after-first-round",
    "wrong-rows",
    "stale-rollback",
    "position-after-truncate",
    "wrong-q",
    "constraint-draft-only",
    "constraint-no-rollback",
    "noisy-numerics",
    "constraint-target-only",
)
# specdec.certify.constrained.GRAMMAR_NAMES (literal for the same reason; a test checks it)
GRAMMAR_CHOICES = ("items", "json")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "certify",
        help=command_help("certify"),
        description="Level 1: the accept/reject walk on synthetic distributions (exact and "
        "Monte Carlo). Level 2: the decoding loop on mock models with exactly known "
        "distributions. Level 3: the real draft/target/backend setup (batch-invariance "
        "probe, greedy agreement, a per-token test of every sampled token against the "
        "shape-matched replay and against plain decoding). 'constrained': the decoding loop "
        "under a grammar on mock models, against the exact constrained distribution. Writes "
        "certificate.json and certificate.md.",
    )
    p.add_argument(
        "--levels",
        default="1,2,3",
        help="comma-separated subset of 1,2,3,probe,constrained ('probe': only the "
        "batch-invariance probe of the models; 'constrained': the loop under a grammar on "
        "mock models, needs the structured extra; default 1,2,3)",
    )
    p.add_argument(
        "--constraint",
        default=None,
        help="the grammars of the constrained level: a comma-separated subset of "
        f"{','.join(GRAMMAR_CHOICES)} (default: all; needs constrained in --levels)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="minutes instead of hours: a smoke test with small samples and low power",
    )
    p.add_argument(
        "--alpha", type=float, default=0.01, help="family-wise significance level (0.01)"
    )
    p.add_argument("--seed", type=int, default=0, help="base seed of every random stream")
    p.add_argument("-k", type=int, default=None, help="draft tokens per round in Level 3 (4)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature of the Level 3 sampled tests (1.0; greedy always runs)",
    )
    p.add_argument("--top-k", type=int, default=None, help="Level 3 sampled tests (0: off)")
    p.add_argument("--top-p", type=float, default=None, help="Level 3 sampled tests (1: off)")
    p.add_argument(
        "--prompts",
        default=None,
        help="Level 3 prompts: a JSONL / text file (a 'prediction' field is drafted in front "
        "of the draft), 'spec_bench' (packaged set), 'code_predict' (code edits with their "
        "predictions) or "
        "'builtin' (default: builtin with --quick, spec_bench otherwise)",
    )
    p.add_argument(
        "--n-prompts",
        type=int,
        default=None,
        help="Level 3 prompts in all (quick 6, full 56): greedy on the first (quick 3, full "
        "48), the probe on the last (3 / 8), the per-token test on the first (3 / 20)",
    )
    p.add_argument(
        "--greedy-prompts", type=int, default=None, help="Level 3 greedy prompts (3 / 48)"
    )
    p.add_argument(
        "--sampled-prompts",
        type=int,
        default=None,
        help="Level 3 per-token test: prompts (quick 3, full 20)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="Level 3 per-token test: independent speculative sequences per prompt (4 / 9)",
    )
    p.add_argument(
        "--sample-tokens",
        type=int,
        default=None,
        help="Level 3 per-token test: tokens per sequence (quick 32, full 64)",
    )
    p.add_argument(
        "--plain-seeds",
        type=int,
        default=None,
        help="Level 3 per-token test: sequences per prompt also scored one token per pass "
        "against plain decoding (quick 1, full 4)",
    )
    p.add_argument(
        "--plain-tv-threshold",
        type=float,
        default=None,
        help="largest per-token TV vs plain decoding (upper 95 %% bound) that is a caveat "
        "rather than a FAIL (0.02; fixed before running)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=None, help="Level 3 greedy length (32 / 128)"
    )
    p.add_argument(
        "--chat",
        choices=("auto", "on", "off"),
        default="auto",
        help="apply the target's chat template to the prompts (auto: when it has one)",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every sample size (below 1: smoke tests only, lower power)",
    )
    p.add_argument("--out", default="specdec-certificate", help="output directory")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from OUT/progress.jsonl (same options required)",
    )
    p.add_argument(
        "--inject-fault",
        choices=FAULT_CHOICES,
        default=None,
        help="self-test: break the walk, the way a grammar is applied (constraint-*: with "
        "--levels constrained) or wrap the models in a faulty backend on purpose (the "
        "certificate must FAIL), or a control that must not FAIL: 'noisy-numerics' (a "
        "correct backend with shape-dependent logit noise), 'constraint-target-only' (the "
        "draft's rows unmasked: lossless); see docs/certify.md",
    )
    add_model_args(p)
    add_endpoint_args(p)
    p.set_defaults(func=run)


def _command(args: argparse.Namespace) -> str:
    parts = ["specdec", "certify", "--levels", args.levels, "--seed", str(args.seed)]
    parts += ["--alpha", str(args.alpha)]
    if args.quick:
        parts.append("--quick")
    for flag, name in (
        ("-k", "k"),
        ("--temperature", "temperature"),
        ("--top-k", "top_k"),
        ("--top-p", "top_p"),
        ("--prompts", "prompts"),
        ("--n-prompts", "n_prompts"),
        ("--seeds", "seeds"),
        ("--max-new-tokens", "max_new_tokens"),
        ("--greedy-prompts", "greedy_prompts"),
        ("--sampled-prompts", "sampled_prompts"),
        ("--sample-tokens", "sample_tokens"),
        ("--plain-seeds", "plain_seeds"),
        ("--plain-tv-threshold", "plain_tv_threshold"),
        ("--constraint", "constraint"),
        ("--inject-fault", "inject_fault"),
    ):
        v = getattr(args, name)
        if v is not None:
            parts += [flag, str(v)]
    if args.scale != 1.0:
        parts += ["--scale", str(args.scale)]
    if "3" in args.levels or "probe" in args.levels:
        parts += ["--draft", args.draft, "--target", args.target]
        parts += ["--draft-backend", args.draft_backend, "--target-backend", args.target_backend]
        parts += ["--device", args.device, "--dtype", args.dtype, "--chat", args.chat]
        if args.draft_window is not None:
            parts += ["--draft-window", str(args.draft_window)]
        if args.exact:
            parts.append("--exact")
    return " ".join(shlex.quote(x) for x in parts)


def _windowed(label: str | None, window: int | None) -> str | None:
    """The draft's label, with its draft window when there is one."""
    return label if window is None or label is None else f"{label} (window {window})"


def run(args: argparse.Namespace) -> int:
    check_common(args)  # --seed, --threads, --n-ctx, --draft-window: as generate checks them
    if args.endpoint or args.endpoint_off:  # a running server (docs/endpoint.md)
        if args.draft_window is not None:
            raise ConfigError("--draft-window applies to the models certify loads, not to a server")
        return run_endpoint_certify(args)
    from specdec.certify.common import FAIL
    from specdec.certify.plan import make_plan, parse_levels
    from specdec.certify.prompts import load_certify_prompts
    from specdec.certify.runner import CertifyConfig, model_label, run_certificate
    from specdec.pairs import draft_label, load_pair

    levels = parse_levels(args.levels)
    grammars = None
    if args.constraint is not None:
        if "constrained" not in levels:
            raise ConfigError(
                "--constraint picks the constrained level's grammars: add constrained to --levels"
            )
        grammars = tuple(x.strip() for x in args.constraint.split(",") if x.strip())
    plan = make_plan(
        quick=args.quick,
        seed=args.seed,
        alpha=args.alpha,
        k=args.k,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seeds=args.seeds,
        n_prompts=args.n_prompts,
        max_new_tokens=args.max_new_tokens,
        sample_tokens=args.sample_tokens,
        plain_seeds=args.plain_seeds,
        plain_tv_threshold=args.plain_tv_threshold,
        greedy_prompts=args.greedy_prompts,
        sampled_prompts=args.sampled_prompts,
        scale=args.scale,
        grammars=grammars,
    )
    needs_models = "3" in levels or "probe" in levels
    draft_cfg, target_cfg = model_configs(args, decide=needs_models)
    window = args.draft_window
    prompts = args.prompts or ("builtin" if args.quick else "spec_bench")
    cfg = CertifyConfig(
        levels=levels,
        plan=plan,
        quick=args.quick,
        seed=args.seed,
        alpha=args.alpha,
        draft=_windowed(draft_label(draft_cfg), window) if needs_models else None,
        target=model_label(target_cfg) if needs_models else None,
        prompts_source=prompts if needs_models else None,
        chat=args.chat,
        out_dir=Path(args.out),
        resume=args.resume,
        fault=args.inject_fault,
        command=_command(args),
    )
    # read before the first level runs, so that a bad prompt file fails at once
    read_prompts = load_certify_prompts(prompts, plan.prompts) if needs_models else None
    if needs_models:
        quiet_libraries()

    def say(msg: str) -> None:
        print(f"specdec certify: {printable(msg)}", file=sys.stderr, flush=True)

    from specdec.api import measured_costs
    from specdec.pairs import is_planned

    costs = measured_costs if is_planned(draft_cfg) else None
    cert = run_certificate(
        cfg,
        lambda: load_pair(draft_cfg, target_cfg, costs=costs, draft_window=window),
        progress=say,
        prompts=read_prompts,
    )
    print(printable(cert.verdict_line()))
    print(f"wrote {Path(args.out) / 'certificate.md'} and {Path(args.out) / 'certificate.json'}")
    return 1 if cert.status == FAIL else 0
