"""`specdec generate`: text from the target model, faster, with the target's distribution.

The command is ``specdec.load`` (the configuration resolved in ``specdec.configuration``) and
``Pair.stream`` / ``Pair.generate``; ``--compare`` is two runs of the same pair."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from specdec.cli import command_help
from specdec.cli.common import (
    add_model_args,
    add_sampling_args,
    add_speculation_args,
    check_common,
    load_from_args,
    quiet_libraries,
    read_prompt,
    read_text_file,
)
from specdec.errors import ConfigError
from specdec.jsonable import json_ready

if TYPE_CHECKING:
    from specdec.api import Comparison


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
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="read special-token text inside the prompt, --system and --messages (such as "
        "<|im_end|>) as special tokens; by default a chat prompt's text is plain text",
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
    from specdec.api import check_request

    quiet_libraries()
    check_common(args)
    if args.prompt is not None and args.prompt_option is not None:
        raise ConfigError("give the prompt once: as the argument or with -p/--prompt")
    if args.prompt is None and args.prompt_option is None and args.messages is None:
        raise ConfigError("give a prompt (argument or -p/--prompt) or --messages FILE")
    given = args.prompt if args.prompt is not None else args.prompt_option
    prompt = read_prompt(given) if given is not None else None
    if prompt is not None and not prompt.strip():
        raise ConfigError("the prompt is empty")
    prediction = read_text_file(args.prediction, "--prediction") if args.prediction else None
    from specdec.prompting import read_messages

    messages = read_messages(args.messages) if args.messages is not None else None
    if args.raw and (args.system is not None or messages is not None):
        raise ConfigError("a raw prompt takes no system prompt or messages: drop --raw")
    request = {  # checked now, before anything is loaded
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "stop": args.stop,
    }
    check_request(k=args.k, **request)
    text = prompt or "".join(m["content"] for m in messages or [])
    t0 = time.perf_counter()
    pair = load_from_args(  # about 4 characters per token (spots long prompts)
        args, prompt_tokens=len(text) // 4, new_tokens=args.max_new_tokens
    )
    t_load = time.perf_counter() - t0
    chat = True if args.chat else (False if args.raw else None)  # None: template if any
    ids = pair.encode(
        prompt,
        messages=messages,
        system=args.system,
        chat=chat,
        parse_special=args.parse_special,
    )
    print(f"[specdec] loaded in {t_load:.1f} s; prompt {len(ids)} tokens", file=sys.stderr)
    options: dict[str, Any] = {
        **request,
        "adaptive": args.adaptive,
        "seed": args.seed,
        "stop_on_eos": not args.no_stop,
        "prediction": prediction,
    }
    show = None if args.json else _write
    if args.compare and pair.speculates(args.k, prediction):
        config = pair.config
        label = "prediction" if prediction else (config.how if config else "") or f"K={args.k}"
        return _compare(pair.compare(ids, k=args.k, on_text=show, **options), args, label)
    if args.compare:
        if pair.auto is None:
            raise ConfigError("--compare needs a drafter (-k > 0 and a --draft) or --prediction")
        print(
            "[specdec] --compare: the configuration chosen here is plain decoding, so there is "
            "nothing to compare; name a drafter (--draft, -k) or give a --prediction",
            file=sys.stderr,
        )
    stream = pair.stream(ids, k=args.k, **options)
    for piece in stream:
        if show is not None:
            show(piece)
    done = stream.completion
    assert done is not None
    if args.json and not args.compare:
        config = pair.config
        assert config is not None
        record = {**done.result.to_dict(), "text": done.text, "load_seconds": t_load}
        if config.how:  # what the default / --auto chose, and why
            k = config.k if args.k is None else args.k
            record["configuration"] = {"label": config.label, "k": k, "reason": config.reason}
        print(json.dumps(json_ready(record), allow_nan=False))
    else:
        if show is not None:
            show("\n")
        print(done.result.summary(), file=sys.stderr)
    return 0


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _compare(c: Comparison, args: argparse.Namespace, label: str) -> int:
    """Print a comparison: the two stats lines and the speedup (or one JSON object)."""
    if args.json:
        record = {
            "plain": c.plain.result.to_dict(),
            "speculative": c.speculative.result.to_dict(),
            "speedup": c.speedup,
            "identical_output": c.identical,
            "text": c.speculative.text,
        }
        print(json.dumps(json_ready(record), allow_nan=False))
        return 0
    _write("\n")
    spec = c.speculative.result
    print(c.plain.result.summary("plain"), file=sys.stderr)
    print(spec.summary(label), file=sys.stderr)
    note = ""
    if not c.identical and args.temperature == 0:
        note = (
            " (a bug: exact numerics must give plain decoding's tokens)"
            if spec.extra.get("exact")
            else " (a near-tie that llama.cpp's batched kernels flip: --exact makes speculative "
            "output plain decoding's, bit for bit)"
        )
    print(
        f"[specdec] speedup {c.speedup:.2f}x wall clock ({c.plain.result.e2e_tokens_per_second:.2f}"
        f" -> {spec.e2e_tokens_per_second:.2f} tok/s incl. prefill); outputs identical: "
        f"{'yes' if c.identical else 'no'}{note}",
        file=sys.stderr,
    )
    return 0
