"""The ``specdec`` command line: one module per subcommand, each with ``register``."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from specdec import __version__
from specdec.errors import SpecdecError


def build_parser() -> argparse.ArgumentParser:
    from specdec.cli import bench, certify, generate, models, report

    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Lossless speculative decoding: generate, measure, certify.",
    )
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (generate, models, bench, report, certify):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
        return int(rc or 0)
    except SpecdecError as e:
        if args.debug:
            traceback.print_exc()
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
