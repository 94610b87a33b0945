"""The ``specdec`` command line: one module per subcommand, each with ``register``.

Subcommands are registered lazily: only the module of the command being run is imported, so
``specdec --help`` and ``specdec models list`` start without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from specdec import __version__
from specdec.errors import SpecdecError
from specdec.util.printable import MAX_ERROR_CHARS, printable

# name -> (module, one-line help shown by `specdec --help` without importing the module)
COMMANDS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "generate": ("specdec.cli.generate", "generate text with speculative decoding"),
        "demo": (
            "specdec.cli.demo",
            "this machine's verdict, then a code edit plain and with its prediction",
        ),
        "models": ("specdec.cli.models", "list, fetch and verify the real models of the store"),
        "bench": (
            "specdec.cli.bench",
            "measure speedup, acceptance and costs of speculative decoding",
        ),
        "report": ("specdec.cli.report", "write a markdown report with plots from bench results"),
        "profile": (
            "specdec.cli.profile",
            "measure this machine, predict every configuration, recommend one",
        ),
        "certify": (
            "specdec.cli.certify",
            "certify that speculative decoding is lossless (3 levels + batch-invariance probe)",
        ),
        "serve": (
            "specdec.cli.serve",
            "serve the target over the OpenAI API with speculative decoding inside",
        ),
        "doctor": (
            "specdec.cli.doctor",
            "this machine, its llama.cpp build, kernel checks and caches (for bug reports)",
        ),
    }
)


def command_help(name: str) -> str:
    """The one-line help of a subcommand (one source for the lazy and the full parser)."""
    return COMMANDS[name][1]


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv (the first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching (``--temp`` is a real alias, not a guess), for the
    top-level parser and, through ``add_subparsers``, every subcommand."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the full options of the command named in ``argv`` (all commands'
    full options when argv is None)."""
    parser = Parser(
        prog="specdec",
        description="Lossless speculative decoding: generate, measure, certify.",
    )
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = None if argv is None else _command_in(argv)
    for name, (module, help_text) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if sys.stdout is None or sys.stdout.closed:
        # started with file descriptor 1 closed: every result would be lost without a word
        print("specdec: error: standard output is closed", file=sys.stderr)
        return 2
    try:
        rc = args.func(args)
        return int(rc or 0)
    except SpecdecError as e:
        if args.debug:
            traceback.print_exc()
        print(f"specdec: error: {printable(e, MAX_ERROR_CHARS)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        # the file system or the OS said no (read-only or full disk, a path that is a file or
        # a directory, a closed stream): one line, like any user-facing error
        if args.debug:
            traceback.print_exc()
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        message = f"{e.strerror or e}{where}"
        print(f"specdec: error: {printable(message, MAX_ERROR_CHARS)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
