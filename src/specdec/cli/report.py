"""`specdec report`: markdown and PNG plots from a `specdec bench` results file."""

from __future__ import annotations

import argparse

from specdec.cli import command_help
from specdec.util.printable import printable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help=command_help("report"),
        description=(
            "Read a results JSONL written by 'specdec bench' and write report.md plus PNG plots "
            "(speedup vs K with 95 % CIs, acceptance by draft position, verify-batch scaling, "
            "time split, acceptance by category, predicted vs measured speedup)."
        ),
    )
    p.add_argument("results", metavar="RESULTS.jsonl", help="results file from 'specdec bench'")
    p.add_argument(
        "--out", metavar="DIR", help="output directory (default: <results stem>-report/)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdec.bench.endpoint.records import is_endpoint_results

    if is_endpoint_results(args.results):  # from `specdec bench --endpoint`
        from specdec.bench.endpoint.report import write_report as write_endpoint_report

        md = write_endpoint_report(args.results, args.out)
        print(f"report written to {printable(md)}")
        return 0
    from specdec.bench.report import write_report

    md = write_report(args.results, args.out)
    print(f"report written to {printable(md)}")
    return 0
