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
    check_common,
    draft_reference,
    quiet_libraries,
    read_prompt,
    read_text_file,
)
from specdec.errors import ConfigError
from specdec.jsonable import json_ready
from specdec.pairs import DEFAULT_K

if TYPE_CHECKING:
    from specdec.api import Completion, GenerationResult, Pair


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help=command_help("generate"),
        description="Generate text from the target model with a draft proposing K tokens per "
        "round. Greedy output equals the target's own; sampled output has its distribution.",
    )
    p.add_argument("prompt", nargs="?", help="prompt text ('-' reads standard input)")
    p.add_argument("-p", "--prompt", dest="prompt_option", help="the prompt, as an option")
    p.add_argument(
        "-k",
        type=int,
        default=None,
        help="draft tokens per round; 0 = plain decoding (default: chosen for this machine, "
        f"see --auto; {DEFAULT_K} when a --draft is given)",
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="adapt K each round from the measured acceptance (K is the maximum)",
    )
    p.add_argument(
        "--auto",
        action="store_true",
        help="run what `specdec profile` recommends for this machine (profiled once, cached): "
        "the target's backend, the drafter or plain decoding, and K adapted from the "
        "profile's costs and the rounds' acceptance (reproducible with --seed)",
    )
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


def stats_line(res: GenerationResult, label: str = "") -> str:
    split = res.time_split()
    total = sum(split.values()) or 1.0
    acc = " ".join("-" if a != a else f"{a:.2f}" for a in res.acceptance_by_position())
    parts = [
        f"{len(res.tokens)} tokens in {res.t_total:.2f} s",
        f"TTFT {res.ttft:.2f} s ({len(res.prompt_ids)}-token prompt)",
        f"{res.tokens_per_second:.2f} tok/s",
        f"{res.n_rounds} rounds, {res.mean_tokens_per_round:.2f} tokens/round",
    ]
    if acc:
        parts.append(f"acceptance by position {acc}")
    if "prediction_tokens" in res.extra:
        accepted, rejected = res.prediction_tokens()
        parts.append(f"prediction {accepted} accepted / {rejected} rejected")
    if res.extra.get("exact"):
        parts.append("exact numerics")
    if "draft_window" in res.extra:  # the draft's prefill (in TTFT) covers only the window
        parts.append(
            f"draft window {res.extra['draft_window']} ({res.extra['draft_rebases']} re-bases)"
        )
    parts.append(" ".join(f"{k} {100 * v / total:.0f}%" for k, v in split.items()))
    return f"[specdec{' ' + label if label else ''}] " + " | ".join(parts)


def run(args: argparse.Namespace) -> int:
    from specdec.api import check_request, load

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
    from specdec.prompting import read_messages

    messages = read_messages(args.messages) if args.messages is not None else None
    if args.raw and (args.system is not None or messages is not None):
        raise ConfigError("a raw prompt takes no system prompt or messages: drop --raw")
    prediction = read_text_file(args.prediction, "--prediction") if args.prediction else None
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
    pair = load(
        args.target,
        draft_reference(args),
        target_backend=args.target_backend,
        draft_backend=args.draft_backend,
        device=args.target_device or args.device,
        dtype=args.target_dtype or args.dtype,
        draft_device=args.draft_device,
        draft_dtype=args.draft_dtype,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        auto=args.auto,
        draft_window=args.draft_window,
        exact=args.exact,
        prompt_tokens=len(text) // 4,  # about 4 characters per token (spots long prompts)
        new_tokens=args.max_new_tokens,
        log=lambda m: print(f"[specdec] {m}", file=sys.stderr),
    )
    t_load = time.perf_counter() - t0
    config = pair.config
    assert config is not None
    if config.how:  # the profile or the machine default chose: say what and why
        print(f"[specdec] {config.how}: {config.label}: {config.reason}", file=sys.stderr)
    chat = True if args.chat else (False if args.raw else None)  # None: template if any
    ids = pair.encode(prompt, messages=messages, system=args.system, chat=chat)
    print(f"[specdec] loaded in {t_load:.1f} s; prompt {len(ids)} tokens", file=sys.stderr)
    options: dict[str, Any] = {
        **request,
        "adaptive": args.adaptive,
        "seed": args.seed,
        "stop_on_eos": not args.no_stop,
        "prediction": prediction,
    }
    if args.compare:
        return _compare(pair, ids, args, options)
    out = None if args.json else sys.stdout
    done = _run(pair, ids, options, args.k, out)
    if args.json:
        record = _record(done)
        record["load_seconds"] = t_load
        if config.how:  # what the default / --auto chose, and why
            k = config.k if args.k is None else args.k
            record["configuration"] = {"label": config.label, "k": k, "reason": config.reason}
        print(json.dumps(json_ready(record), allow_nan=False))
    else:
        print(stats_line(done.result), file=sys.stderr)
    return 0


def _run(
    pair: Pair, ids: list[int], options: dict[str, Any], k: int | None, out: Any
) -> Completion:
    """One generation; its text streamed to ``out`` as rounds are accepted (None: not)."""
    stream = pair.stream(ids, k=k, **options)
    for piece in stream:
        if out is not None:
            out.write(piece)
            out.flush()
    if out is not None:
        out.write("\n")
        out.flush()
    assert stream.completion is not None
    return stream.completion


def _record(c: Completion) -> dict[str, Any]:
    record = c.result.to_dict()
    record["text"] = c.text
    return record


def _compare(pair: Pair, ids: list[int], args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Plain decoding and the configured speculation back to back on the same pair."""
    if options["prediction"] is None and (
        args.k == 0 or pair.draft is None or (pair.auto is not None and not pair.auto.speculative)
    ):
        if pair.auto is None:
            raise ConfigError("--compare needs a drafter (-k > 0 and a --draft) or --prediction")
        print(
            "[specdec] --compare: the configuration chosen here is plain decoding, so there is "
            "nothing to compare; name a drafter (--draft, -k) or give a --prediction",
            file=sys.stderr,
        )
        done = _run(pair, ids, options, args.k, None if args.json else sys.stdout)
        print(stats_line(done.result), file=sys.stderr)
        return 0
    warm = {**options, "max_new_tokens": min(8, args.max_new_tokens)}
    for k in (0, args.k):  # warm both paths up so one-time initialisation is billed to neither
        pair.generate(ids, k=k, **warm)
    plain = pair.generate(ids, k=0, **options)
    print(stats_line(plain.result, "plain"), file=sys.stderr)
    spec = _run(pair, ids, options, args.k, None if args.json else sys.stdout)
    how = pair.config.how if pair.config is not None else ""
    label = "prediction" if options["prediction"] is not None else how or f"K={args.k}"
    print(stats_line(spec.result, label), file=sys.stderr)
    # wall clock including prefill, per generated token (robust to different lengths)
    speedup = spec.result.e2e_tokens_per_second / plain.result.e2e_tokens_per_second
    same = spec.text == plain.text if args.stop else spec.tokens == plain.tokens
    if args.json:
        print(
            json.dumps(
                json_ready(
                    {
                        "plain": plain.result.to_dict(),
                        "speculative": spec.result.to_dict(),
                        "speedup": speedup,
                        "identical_output": same,
                        "text": spec.text,
                    }
                ),
                allow_nan=False,
            )
        )
        return 0
    note = ""
    if not same and args.temperature == 0:
        exact = bool(spec.result.extra.get("exact"))
        note = (
            " (a bug: exact numerics must give plain decoding's tokens)"
            if exact
            else " (a near-tie that llama.cpp's batched kernels flip: --exact makes speculative "
            "output plain decoding's, bit for bit)"
        )
    print(
        f"[specdec] speedup {speedup:.2f}x wall clock ({plain.result.e2e_tokens_per_second:.2f} "
        f"-> {spec.result.e2e_tokens_per_second:.2f} tok/s incl. prefill); outputs identical: "
        f"{'yes' if same else 'no'}{note}",
        file=sys.stderr,
    )
    return 0
