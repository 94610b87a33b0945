"""The ``--endpoint`` options of ``specdec bench`` and ``specdec certify`` and their runs.

Only argparse is imported at module level: the commands register these options without
loading the HTTP client or the statistics.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from specdec.util.printable import printable

BENCH_OUT = "runs/bench-endpoint.jsonl"
DEFAULT_CONCURRENCY = "1,2,4,8"
QUICK_CONCURRENCY = "1,2"


def _add_common(p: argparse.ArgumentParser, *, default_api: str) -> argparse._ArgumentGroup:
    g = p.add_argument_group(
        "endpoint (a running OpenAI-compatible server instead of local models)"
    )
    g.add_argument(
        "--endpoint",
        metavar="URL",
        help="the server with speculation on, e.g. http://127.0.0.1:8000 (the /v1 suffix is "
        "optional); without --endpoint-off, spec-off requests send speculative.n_max = 0 and "
        "the responses' draft counters must show that it took effect",
    )
    g.add_argument(
        "--endpoint-off", metavar="URL", help="a second server, without speculation (spec-off)"
    )
    g.add_argument(
        "--endpoint-model",
        metavar="NAME",
        help="the model to request (default: the one model the server lists)",
    )
    g.add_argument(
        "--endpoint-off-model",
        metavar="NAME",
        help="the spec-off server's model name (default: --endpoint-model, else its only one)",
    )
    g.add_argument(
        "--endpoint-api",
        choices=("completions", "chat"),
        default=default_api,
        help=f"/v1/completions (raw prompt) or /v1/chat/completions (default {default_api})",
    )
    g.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="sent as 'Authorization: Bearer KEY' (default: --api-key-file, else "
        "$SPECDEC_API_KEY, else none); never written to the results",
    )
    g.add_argument(
        "--api-key-file",
        metavar="FILE",
        default=None,
        help="read the API key from the first line of FILE (kept out of the process list)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds a request may wait for the next bytes of its reply (120)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds the whole of one request may take (default: --timeout plus 1 s per "
        "requested token); a reply slower than that is an error, not retried",
    )
    g.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="retries of a request after a network error, a timeout or HTTP 429/5xx, with "
        "exponential backoff (2)",
    )
    g.add_argument(
        "--max-rps",
        type=float,
        default=None,
        metavar="R",
        help="at most R requests started per second (default: no bound)",
    )
    return g


def add_bench_args(p: argparse.ArgumentParser) -> None:
    g = _add_common(p, default_api="chat")
    g.add_argument(
        "--concurrency",
        metavar="LIST",
        default=None,
        help=f"concurrent clients to sweep, e.g. 1,2,4,8 (default {DEFAULT_CONCURRENCY}; "
        f"--quick {QUICK_CONCURRENCY})",
    )


def add_certify_args(p: argparse.ArgumentParser) -> None:
    g = _add_common(p, default_api="completions")
    g.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="requests in flight at once per server (1; more is faster but lets batching "
        "change a server's numerics). With --endpoint-off both servers work at once",
    )
    g.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="N",
        help="independent requests per prompt and side in the sampled tests (full 250; quick: "
        "up to 150, as many as fit in --max-minutes)",
    )
    g.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        metavar="M",
        help="time budget of the run: a pilot times the sampled requests and lowers --samples "
        "to what fits, not below 30 (quick 5; 0 or unset without --quick: no budget)",
    )
    g.add_argument(
        "--pertoken",
        choices=("auto", "off"),
        default="auto",
        help="the per-token test of every spec-on token against the spec-off server's rows "
        "(auto: where the servers return token ids and prompt logprobs, e.g. vLLM)",
    )
    g.add_argument(
        "--pertoken-top",
        type=int,
        default=20,
        metavar="N",
        help="top tokens per row in the per-token test; the rest is one category (20, "
        "vLLM's default --max-logprobs)",
    )
    g.add_argument(
        "--tie-gap",
        type=float,
        default=0.1,
        metavar="NATS",
        help="largest log-probability gap (both sides) for a greedy divergence to count as a "
        "near-tie; fixed before running (0.1)",
    )
    g.add_argument(
        "--top-logprobs",
        type=int,
        default=5,
        metavar="N",
        help="top logprobs per token asked for in the greedy part, where the server gives them "
        "(5; OpenAI's API allows up to 20)",
    )


def _precheck(args: argparse.Namespace) -> None:
    from specdec.errors import ConfigError

    if not args.endpoint:
        raise ConfigError("--endpoint-off needs --endpoint (the spec-on server)")
    try:
        import httpx  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"--endpoint needs httpx ({e.name} is missing): pip install 'specdec[endpoint]'"
        ) from e


def _config(args: argparse.Namespace) -> Any:
    from specdec.endpoint.client import EndpointConfig
    from specdec.errors import ConfigError
    from specdec.util.credentials import read_api_key, redact_url

    for flag, url in (("--endpoint", args.endpoint), ("--endpoint-off", args.endpoint_off)):
        if url and redact_url(url) != url:
            raise ConfigError(
                f"{flag} holds a user name or password: give the key with --api-key-file or "
                "$SPECDEC_API_KEY instead (a URL is recorded with the results)"
            )
    return EndpointConfig(
        url=args.endpoint,
        model=args.endpoint_model,
        api_key=read_api_key(args.api_key, args.api_key_file),
        api=args.endpoint_api,
        timeout_s=args.timeout,
        request_timeout_s=args.request_timeout,
        retries=args.retries,
        max_rps=args.max_rps,
    )


def _refuse(args: argparse.Namespace, flags: dict[str, Any]) -> None:
    from specdec.errors import ConfigError

    given = [flag for flag, default in flags.items() if getattr(args, flag) not in (default,)]
    if given:
        names = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ConfigError(f"{names} do(es) not apply with --endpoint")


def run_bench(args: argparse.Namespace) -> int:
    """``specdec bench --endpoint``."""
    _precheck(args)
    import asyncio
    import random

    from specdec.bench.endpoint.report import write_report
    from specdec.bench.endpoint.runner import EndpointBenchPlan, run_endpoint_bench
    from specdec.cli.common import parse_int_list
    from specdec.endpoint.pairing import make_sides
    from specdec.prompt_sets import select_prompts

    _refuse(
        args,
        {
            "config": None,
            "k": None,
            "threads": None,
            "profile_repeats": None,
            "verify_max": None,
            "chat": None,
            "ignore_eos": False,
        },
    )
    quick = args.quick
    categories = (
        tuple(x.strip() for x in args.categories.split(",") if x.strip())
        if args.categories
        else (("mt_bench", "translation", "summarization") if quick and not args.prompts else None)
    )
    per_category = args.prompts_per_category
    if per_category is None:
        per_category = 0 if args.prompts else 1
    prompts = select_prompts(
        args.prompts, categories=categories, per_category=per_category, seed=args.seed or 0
    )
    conc = args.concurrency or (QUICK_CONCURRENCY if quick else DEFAULT_CONCURRENCY)
    plan = EndpointBenchPlan(
        prompts=tuple(prompts),
        concurrency=parse_int_list(conc, "concurrency"),
        modes=tuple(x.strip() for x in (args.modes or "greedy").split(",") if x.strip()),
        max_new_tokens=args.max_new_tokens or (32 if quick else 64),
        repeats=args.repeats or 1,
        seed=args.seed or 0,
    )
    sides = make_sides(_config(args), args.endpoint_off, args.endpoint_off_model)
    out = args.out or BENCH_OUT
    if args.dry_run:
        print(f"endpoint: {printable(sides.describe())}")
        print(f"prompts: {len(plan.prompts)}; concurrency {', '.join(map(str, plan.concurrency))}")
        print(
            f"modes: {', '.join(plan.modes)}; {plan.max_new_tokens} tokens; "
            f"{plan.repeats} repeat(s)"
        )
        return 0

    def log(msg: str) -> None:
        if not args.no_progress:
            print(f"specdec bench: {printable(msg)}", file=sys.stderr, flush=True)

    outcome = asyncio.run(
        run_endpoint_bench(
            plan,
            sides,
            out,
            resume=args.resume,
            overwrite=args.overwrite,
            argv=["specdec", *sys.argv[1:]],
            seed_rng=random.Random(plan.seed),
            log=log,
        )
    )
    for note in outcome.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    print(
        f"{outcome.measured_groups} groups measured into {out}"
        + (f" ({outcome.skipped_groups} already there)" if outcome.skipped_groups else "")
    )
    md = write_report(out)
    print(f"report: {md}")
    return 0


def _certify_command(args: argparse.Namespace) -> str:
    parts = ["specdec", "certify", "--endpoint", args.endpoint]
    for flag in (
        "endpoint_off",
        "endpoint_model",
        "endpoint_off_model",
        "prompts",
        "samples",
        "greedy_prompts",
        "sampled_prompts",
        "max_new_tokens",
        "sample_tokens",
        "temperature",
        "top_k",
        "top_p",
    ):
        v = getattr(args, flag, None)
        if v is not None:
            parts += ["--" + flag.replace("_", "-"), str(v)]
    parts += ["--endpoint-api", args.endpoint_api, "--seed", str(args.seed)]
    parts += ["--alpha", str(args.alpha), "--tie-gap", str(args.tie_gap)]
    if args.quick:
        parts.append("--quick")
    if args.scale != 1.0:
        parts += ["--scale", str(args.scale)]
    if args.concurrency != 1:
        parts += ["--concurrency", str(args.concurrency)]
    if args.pertoken != "auto":
        parts += ["--pertoken", args.pertoken]
    if args.max_minutes is not None:
        parts += ["--max-minutes", f"{args.max_minutes:g}"]
    return " ".join(shlex.quote(x) for x in parts)


def run_certify(args: argparse.Namespace) -> int:
    """``specdec certify --endpoint``: exit 0 for PASS (with or without caveats), 1 for FAIL."""
    _precheck(args)
    import asyncio
    from pathlib import Path

    from specdec.certify.common import FAIL
    from specdec.certify.endpoint.plan import make_plan
    from specdec.certify.endpoint.report import write_certificate
    from specdec.certify.endpoint.run import run_endpoint_certify
    from specdec.certify.prompts import load_certify_prompts
    from specdec.endpoint.pairing import make_sides

    _refuse(
        args,
        {
            "levels": "1,2,3",
            "constraint": None,
            "k": None,
            "seeds": None,
            "plain_seeds": None,
            "plain_tv_threshold": None,
            "inject_fault": None,
            "n_prompts": None,
        },
    )
    prompts = load_certify_prompts(args.prompts or "builtin", 0)
    texts = [str(t) for t in prompts.texts]  # a file's prompts are text
    plan = make_plan(
        texts,
        predictions=None if prompts.predictions is None else tuple(prompts.predictions),
        quick=args.quick,
        scale=args.scale,
        greedy_prompts=args.greedy_prompts,
        greedy_tokens=args.max_new_tokens,
        sampled_prompts=args.sampled_prompts,
        samples=args.samples,
        sample_tokens=args.sample_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        alpha=args.alpha,
        tie_gap=args.tie_gap,
        top_logprobs=args.top_logprobs,
        seed=args.seed,
        concurrency=args.concurrency,
        pertoken=args.pertoken == "auto",
        pertoken_top=args.pertoken_top,
        max_seconds=None if args.max_minutes is None else args.max_minutes * 60,
    )
    sides = make_sides(_config(args), args.endpoint_off, args.endpoint_off_model)

    def say(msg: str) -> None:
        print(f"specdec certify: {printable(msg)}", file=sys.stderr, flush=True)

    cert = asyncio.run(
        run_endpoint_certify(
            plan,
            sides,
            command=_certify_command(args),
            progress=say,
            out_dir=Path(args.out),
            resume=args.resume,
        )
    )
    j, m = write_certificate(cert, Path(args.out))
    print(printable(cert.verdict_line()))
    print(printable(cert.power_line()))
    print(f"wrote {m} and {j}")
    return 1 if cert.status == FAIL else 0
