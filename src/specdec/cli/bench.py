"""`specdec bench` (not implemented yet)."""

from __future__ import annotations

import argparse

from specdec.errors import SpecdecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="(not implemented yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SpecdecError("'specdec bench' is not implemented yet")
