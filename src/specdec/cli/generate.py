"""`specdec generate`: text from the target model, faster, with the target's distribution.

The command is ``specdec.load`` (the configuration resolved in ``specdec.configuration``) and
``Pair.stream`` / ``Pair.generate``; ``--compare`` is two runs of the same pair."""

from __future__ import annotations

import argparse
import json
import sys
import time

from specdec.cli import command_help
from specdec.cli.common import (
    add_model_args,
    add_sampling_args,
    add_speculation_args,
    check_common,
    load_from_args,
    quiet_libraries,
)
from specdec.cli.inputs import read_inputs
from specdec.errors import ConfigError
from specdec.util.jsonable import json_ready


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help=command_help("generate"),
        description="Generate text from the target model with a draft proposing K tokens per "
        "round. Greedy output equals the target's own; sampled output has its distribution.",
    )
    p.add_argument("prompt", nargs="?", help="prompt text ('-' reads standard input)")
    p.add_argument("-p", "--prompt", dest="prompt_option", help="the prompt, as an option")
    add_speculation_args(p)
    p.add_argument("--max-new-tokens", "-n", "--max-tokens", type=int, default=128)
    chat = p.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat",
        action="store_true",
        help="require the target's chat template (the default uses it when the model has one)",
    )
    chat.add_argument(
        "--raw", action="store_true", help="the prompt as raw text, without the chat template"
    )
    p.add_argument("--system", metavar="TEXT", help="system prompt (chat template models)")
    p.add_argument(
        "--messages",
        metavar="FILE",
        help="earlier chat turns: a JSON list of {role, content} (system, user, assistant, "
        "tool); the prompt, when given, is appended as the last user turn",
    )
    p.add_argument(
        "--prediction",
        metavar="FILE",
        help="the output you expect, or most of it (the code being edited; '-' reads standard "
        "input): drafted from where the output stands in it (OpenAI's Predicted Outputs); the "
        "output stays what it would be without it, only faster",
    )
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        metavar="FILE",
        help="the output is one JSON value this JSON Schema (a file) accepts; draft and target "
        "are masked alike, so greedy output is plain decoding's under the schema "
        "(docs/structured-outputs.md; needs the structured extra)",
    )
    shape.add_argument(
        "--grammar",
        metavar="FILE",
        help="the output follows this grammar (a file): Lark as llguidance takes it, or GBNF "
        "(llama.cpp's format, told apart by its '::=')",
    )
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="read special-token text (such as <|im_end|>) inside the prompt, --system, "
        "--messages and --prediction as special tokens; by default all of it is plain text",
    )
    p.add_argument("--no-stop", action="store_true", help="do not stop at end-of-sequence")
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="S",
        help="stop right before the first occurrence of S (repeatable; exact across tokens "
        "and rounds: the text after it is never printed)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON result, no streaming")
    p.add_argument(
        "--compare",
        action="store_true",
        help="run plain decoding and speculative decoding back to back and print "
        "the measured speedup",
    )
    add_model_args(p)
    add_sampling_args(p)
    # None: nothing chosen, so the default for this machine decides (see draft_reference)
    p.set_defaults(func=run, draft=None)


def run(args: argparse.Namespace) -> int:
    quiet_libraries()
    check_common(args)
    given = read_inputs(args)
    t0 = time.perf_counter()
    pair = load_from_args(  # about 4 characters per token (spots long prompts)
        args, prompt_tokens=len(given.text) // 4, new_tokens=args.max_new_tokens
    )
    t_load = time.perf_counter() - t0
    ids = pair.prompt_ids(given)
    request = given.with_prompt_ids(ids)
    print(f"[specdec] loaded in {t_load:.1f} s; prompt {len(ids)} tokens", file=sys.stderr)
    show = None if args.json else _write
    config = pair.config
    assert config is not None
    if args.compare and pair.speculates(request.k, request.prediction):
        label = "prediction" if request.prediction else config.how or f"K={args.k}"
        c = pair.compare_request(request, on_text=show)
        if args.json:
            print(json.dumps(json_ready(c.to_dict()), allow_nan=False))
        else:
            _write("\n")
            print(*c.report(label), sep="\n", file=sys.stderr)
        return 0
    if args.compare and pair.auto is None:
        raise ConfigError("--compare needs a drafter (-k > 0 and a --draft) or --prediction")
    if args.compare:
        print("[specdec] --compare: what was chosen here is plain decoding: nothing to compare; "
              "name a drafter (--draft, -k) or give a --prediction", file=sys.stderr)  # fmt: skip
    done = pair.stream_request(request).run(show)
    if args.json:
        record = {**done.to_dict(), "load_seconds": t_load}
        if config.how:  # what the default / --auto chose, and why
            k = config.k if args.k is None else args.k
            record["configuration"] = {"label": config.label, "k": k, "reason": config.reason}
        print(json.dumps(json_ready(record), allow_nan=False))
    else:
        _write("\n")
        print(done.result.summary(), file=sys.stderr)
    return 0


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()
