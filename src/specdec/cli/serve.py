"""`specdec serve`: an OpenAI-compatible server (completions, chat, streaming) over one pair."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import Any

from specdec.cli import command_help
from specdec.cli.common import (
    add_model_args,
    add_speculation_args,
    check_common,
    load_from_args,
    numerics_line,
    quiet_libraries,
)
from specdec.errors import ConfigError
from specdec.pairs import release
from specdec.util.credentials import API_KEY_ENV, read_api_key
from specdec.util.printable import printable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help=command_help("serve"),
        description="Serve the target model over the OpenAI API (POST /v1/completions, "
        "/v1/chat/completions, GET /v1/models, /health, /metrics) with speculative decoding "
        "inside. Requests may set K per request (speculative.n_max; 0 = plain). "
        "Needs the serve extra: pip install 'specdec[serve]'.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (default: --api-key-file, else "
        f"${API_KEY_ENV}; none: open)",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        default=None,
        help="read the API key from the first line of FILE (kept out of the process list)",
    )
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="read special-token text (such as <|im_end|>) inside prompts, chat messages and "
        "predictions as special tokens; by default it is plain text, so no request can forge "
        "a turn",
    )
    p.add_argument(
        "--logprobs-mode",
        choices=("raw_logprobs", "processed_logprobs"),
        default="raw_logprobs",
        help="what logprobs are of (vLLM's names): the model's own distribution (default), or "
        "the one each token was drawn from (after logit bias, penalties, temperature, top-k, "
        "top-p); a request's logprobs_mode overrides it",
    )
    add_speculation_args(p, serving=True)
    p.add_argument(
        "--max-tokens",
        "-n",
        type=int,
        default=512,
        dest="default_max_tokens",
        help="tokens generated when a request names no max_tokens",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait behind the running one; more get 429",
    )
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument(
        "--served-model-name", default=None, help="the model id of /v1/models (default: target)"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds the running request gets to finish on Ctrl-C or SIGTERM before it is "
        "cut (with a final event); queued requests get 503 at once",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a request's line and headers (else the connection "
        "is closed)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="open connections at most; one more closes the oldest idle one",
    )
    add_model_args(p)
    # None: nothing chosen, so the machine's default decides (as in `specdec generate`)
    p.set_defaults(func=run, draft=None)


def _check(args: argparse.Namespace) -> None:
    check_common(args)
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    from specdec.request import check_limits

    # K and the default length: the checks every generation request goes through
    check_limits(k=args.k, max_new_tokens=args.default_max_tokens)
    if args.max_queue < 0:
        raise ConfigError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.max_body_bytes < 1024:
        raise ConfigError(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    from specdec.serve.server import ConnectionLimits, check_shutdown_timeout

    check_shutdown_timeout(args.shutdown_timeout)
    args.limits = ConnectionLimits(args.header_timeout, args.max_connections)
    args.api_key = read_api_key(args.api_key, args.api_key_file)


def _load(args: argparse.Namespace) -> Any:
    """The pair, on the worker thread; a pair with a draft gets the costs that size a
    prediction's drafts measured now (once per machine, and said), not in its first request."""
    pair = load_from_args(args)
    if pair.draft is not None:
        pair.target_costs()
    return pair


def run(args: argparse.Namespace) -> int:
    quiet_libraries()
    _check(args)
    try:
        from specdec.serve import ServeConfig, ServeSettings, create_app, server
    except ImportError as e:
        raise ConfigError(
            f"specdec serve needs the serve extra ({e.name} is missing): "
            "pip install 'specdec[serve]'"
        ) from e
    _check_listen(args.host, args.port)  # before the models load: a busy port is one line
    from specdec.serve.engine import worker_thread

    # loaded, checked and measured on the thread that will generate (engine.worker_thread)
    worker = worker_thread()
    pair = worker.submit(_load, args).result()
    config = pair.config
    assert config is not None
    name = args.served_model_name or Path(args.target).name.removesuffix(".gguf")
    config_ = ServeConfig(
        settings=ServeSettings(
            model_name=name,
            k=args.k,  # None: the pair decides (Pair.default_k), as for generate
            adaptive=args.adaptive,
            default_max_tokens=args.default_max_tokens,
            parse_special=args.parse_special,
            logprobs_mode=args.logprobs_mode,
        ),
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
    )
    app = create_app(pair, config_, worker)
    k = pair.default_k() if args.k is None else args.k
    how = (
        f"{config.how}: {config.label}"
        if k is None
        else f"K={k}{', adaptive' if args.adaptive else ''}"
    )
    line = (
        f"serving {name!r} on http://{args.host}:{args.port}/v1 ({how}, "
        f"{'API key required' if args.api_key else 'no API key'})"
    )
    print(f"[specdec] {printable(line)}", file=sys.stderr)
    print(f"[specdec] {printable(numerics_line(pair, args.target, args.threads))}", file=sys.stderr)
    try:
        server.run(
            app,
            host=args.host,
            port=args.port,
            shutdown_timeout=args.shutdown_timeout,
            limits=args.limits,
        )
    except SystemExit as e:  # uvicorn's start-up failure (the port was taken meanwhile)
        if e.code in (0, None):
            raise
        raise ConfigError(f"cannot serve on {args.host}:{args.port} (exit {e.code})") from e
    finally:
        release(pair.draft, pair.target)
    return 0


def _check_listen(host: str, port: int) -> None:
    """ConfigError naming why host:port cannot be listened on (a busy port, an address of
    another machine, a privileged port), tried as uvicorn binds it."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (OSError, UnicodeError) as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e}") from e
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.close()
