"""`specdec doctor`: this machine, its builds, checks and caches on one screen (specdec.doctor)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.cli import command_help


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help=command_help("doctor"),
        description=(
            "Print what a bug report needs: CPU model and flags, OS, Python, package versions, "
            "llama.cpp's system info, optional kernels and build, the kernel checks' verdicts, "
            "the GPUs torch sees, the model store and the profile cache. Reads only; "
            "--check runs the kernel check of a model (cached)."
        ),
    )
    p.add_argument("--json", action="store_true", help="the same as JSON")
    p.add_argument(
        "--check",
        metavar="MODEL",
        help="run (or read from the cache) the kernel check of a GGUF or store model",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdec.doctor import format_report, gather

    check: Path | None = None
    if args.check:
        from specdec.hub import resolve

        check = resolve(args.check)
    report = gather(check=check)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0
