"""`specdec generate`: text from the target model, faster, with the target's distribution."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, TextIO

from specdec.cli import command_help
from specdec.cli.common import (
    DEFAULT_K,
    add_model_args,
    add_sampling_args,
    check_common,
    json_ready,
    model_configs,
    quiet_libraries,
    read_prompt,
    resolve_speculation,
    sampling_config,
)
from specdec.decoding import GenerationResult, generate_stream
from specdec.detokenize import IncrementalDecoder
from specdec.errors import ConfigError
from specdec.models.base import CausalLM
from specdec.pairs import is_model_free, is_planned, load_pair
from specdec.policy import FixedK, KPolicy, capped_adaptive_k
from specdec.prompting import encode_request, read_messages
from specdec.stops import StopMatcher, check_stops, cut_at_stop


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
    # None: nothing chosen, so the default for this machine decides (see _default_choice)
    p.set_defaults(func=run, draft=None)


def _policy(args: argparse.Namespace, has_drafter: bool) -> KPolicy:
    if args.k < 0:
        raise ConfigError(f"-k must be >= 0, got {args.k}")
    if not has_drafter or args.k == 0:
        return FixedK(0)
    if args.adaptive:
        return capped_adaptive_k(args.k, args.max_new_tokens, args.n_ctx)
    return FixedK(args.k)


def _run_once(
    target: CausalLM,
    draft: Any,
    prompt_ids: list[int],
    args: argparse.Namespace,
    k: int | None,
    stream_to: TextIO | None,
    auto: Any = None,
) -> GenerationResult:
    if k == 0:
        policy: KPolicy = FixedK(0)
    elif auto is not None:
        policy = auto.policy()
    else:
        policy = _policy(args, draft is not None)
    decoder = IncrementalDecoder(target.tokenizer)
    stops = StopMatcher(args.stop or ())
    run = generate_stream(
        target,
        draft if k != 0 else None,
        prompt_ids,
        max_new_tokens=args.max_new_tokens,
        k=policy,
        sampling=sampling_config(args),
        seed=args.seed,
        stop_on_eos=not args.no_stop,
    )
    for ev in run:
        piece = stops.push(decoder.push(ev.tokens))
        if stops.stopped:
            run.stop("stop")
        if stream_to is not None:
            stream_to.write(piece)
            stream_to.flush()
    tail = stops.push(decoder.flush()) + stops.flush()
    if stream_to is not None:
        stream_to.write(tail + "\n")
        stream_to.flush()
    assert run.result is not None
    if stops.stopped and run.result.finish_reason != "stop":  # found in the flushed text
        return dataclasses.replace(run.result, finish_reason="stop")
    return run.result


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
    if res.extra.get("exact"):
        parts.append("exact numerics")
    if "draft_window" in res.extra:  # the draft's prefill (in TTFT) covers only the window
        parts.append(
            f"draft window {res.extra['draft_window']} ({res.extra['draft_rebases']} re-bases)"
        )
    parts.append(" ".join(f"{k} {100 * v / total:.0f}%" for k, v in split.items()))
    return f"[specdec{' ' + label if label else ''}] " + " | ".join(parts)


def run(args: argparse.Namespace) -> int:
    quiet_libraries()
    check_common(args)
    if args.prompt is not None and args.prompt_option is not None:
        raise ConfigError("give the prompt once: as the argument or with -p/--prompt")
    if args.prompt is None and args.prompt_option is None and args.messages is None:
        raise ConfigError("give a prompt (argument or -p/--prompt) or --messages FILE")
    given = args.prompt if args.prompt is not None else args.prompt_option
    prompt = read_prompt(given) if given is not None else None
    messages = read_messages(args.messages) if args.messages is not None else None
    if args.raw and (args.system is not None or messages is not None):
        raise ConfigError("a raw prompt takes no system prompt or messages: drop --raw")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.k is not None and args.k < 0:
        raise ConfigError(f"-k must be >= 0, got {args.k}")
    # nothing about speculation chosen: the machine's default (a cached profile's choice, or
    # the cost-aware suffix drafter on the target's own backend)
    machine_default = resolve_speculation(args)
    sampling_config(args)  # validate before loading anything
    check_stops(args.stop)
    if prompt is not None and not prompt.strip():
        raise ConfigError("the prompt is empty")
    draft_cfg, target_cfg = model_configs(args)
    auto = None
    text = prompt or "".join(m["content"] for m in messages or [])
    if args.auto or machine_default:
        auto = _auto_choice(args, text) if args.auto else _default_choice(args, text)
        print(
            f"[specdec] {'auto' if args.auto else 'default'}: {auto.label}: {auto.reason}",
            file=sys.stderr,
        )
        exact = auto.exact if args.exact is None else args.exact  # the profile's, unless said
        target_cfg = dataclasses.replace(target_cfg, backend=auto.target_backend, exact=exact)
        draft_cfg = (
            auto.draft_ref
            if is_model_free(auto.draft_ref)
            else dataclasses.replace(
                target_cfg, model=auto.draft_ref, backend=args.draft_backend, exact=False
            )
        )
        if not auto.speculative:
            draft_cfg = "none"
        args.k = auto.policy().next_k() if auto.speculative else 0
    t0 = time.perf_counter()
    draft, target = load_pair(
        draft_cfg if args.k > 0 or auto else "none",
        target_cfg,
        costs=_cost_provider(None if target_cfg.exact else auto) if is_planned(draft_cfg) else None,
        draft_window=args.draft_window,
    )
    t_load = time.perf_counter() - t0
    chat = True if args.chat else (False if args.raw else None)  # None: template if any
    prompt_ids = encode_request(target, prompt, messages=messages, system=args.system, chat=chat)
    print(f"[specdec] loaded in {t_load:.1f} s; prompt {len(prompt_ids)} tokens", file=sys.stderr)

    if args.compare and draft is None and auto is not None:
        print(
            "[specdec] --compare: the configuration chosen here is plain decoding, so there is "
            "nothing to compare; name a drafter (--draft, -k) to compare it",
            file=sys.stderr,
        )
    elif args.compare:
        if draft is None:
            raise ConfigError("--compare needs a drafter (-k > 0 and a --draft)")
        # warm both paths up so one-time initialisation is not billed to either
        for k in (0, args.k):
            _run_once(target, draft, prompt_ids, _short(args), k, None, auto)
        plain = _run_once(target, draft, prompt_ids, args, 0, None)
        print(stats_line(plain, "plain"), file=sys.stderr)
        spec = _run_once(
            target, draft, prompt_ids, args, None, None if args.json else sys.stdout, auto
        )
        label = f"K={args.k}" if auto is None else ("auto" if args.auto else "default")
        print(stats_line(spec, label), file=sys.stderr)
        # wall clock including prefill, per generated token (robust to different lengths)
        speedup = spec.e2e_tokens_per_second / plain.e2e_tokens_per_second
        same = spec.tokens == plain.tokens
        if args.stop:  # each run stops at the round that completes the stop: compare the text
            texts = [
                cut_at_stop(target.tokenizer.decode(r.tokens), args.stop) for r in (spec, plain)
            ]
            same = texts[0] == texts[1]
        if args.json:
            print(
                json.dumps(
                    json_ready(
                        {
                            "plain": plain.to_dict(),
                            "speculative": spec.to_dict(),
                            "speedup": speedup,
                            "identical_output": same,
                            "text": cut_at_stop(
                                target.tokenizer.decode(spec.tokens), args.stop or ()
                            ),
                        }
                    ),
                    allow_nan=False,
                )
            )
        else:
            print(
                f"[specdec] speedup {speedup:.2f}x wall clock ({plain.e2e_tokens_per_second:.2f} "
                f"-> {spec.e2e_tokens_per_second:.2f} tok/s incl. prefill); outputs identical: "
                f"{'yes' if same else 'no'}"
                + (
                    ""
                    if same or args.temperature > 0
                    else " (greedy divergence: see `specdec certify` for batch invariance)"
                ),
                file=sys.stderr,
            )
        return 0

    res = _run_once(target, draft, prompt_ids, args, None, None if args.json else sys.stdout, auto)
    if args.json:
        out = res.to_dict()
        out["text"] = cut_at_stop(target.tokenizer.decode(res.tokens), args.stop or ())
        out["load_seconds"] = t_load
        if auto is not None:  # what the default / --auto chose, and why
            out["configuration"] = {"label": auto.label, "k": args.k, "reason": auto.reason}
        print(json.dumps(json_ready(out), allow_nan=False))
    else:
        print(stats_line(res), file=sys.stderr)
    return 0


def _auto_choice(args: argparse.Namespace, prompt: str) -> Any:
    """The profile's choice for this request (profiling first when nothing is cached)."""
    from specdec.profiler.auto import auto_profile, choose

    result = auto_profile(
        args.target,
        draft=args.draft,
        target_backend=args.target_backend,
        draft_backend=args.draft_backend,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        log=lambda m: print(f"[specdec] {m}", file=sys.stderr),
    )
    assert result is not None  # only cached_only gives None
    # about 4 characters per token for English and code (only used to spot long prompts)
    return choose(result, len(prompt) // 4, args.max_new_tokens)


def _default_choice(args: argparse.Namespace, prompt: str) -> Any:
    """What runs when nothing about speculation was chosen (``profiler.auto.machine_default``)."""
    from specdec.profiler.auto import machine_default

    return machine_default(
        args.target,
        target_backend=args.target_backend,
        draft_backend=args.draft_backend,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        prompt_tokens=len(prompt) // 4,  # about 4 characters per token (spots long prompts)
        new_tokens=args.max_new_tokens,
    )


def _cost_provider(auto: Any) -> Any:
    """The target's costs for a planned drafter: the profile's when the choice came from one
    (None for exact numerics, whose kernels the profile did not time), else measured once on
    this machine and cached."""
    from specdec.profiler.target_costs import cached_target_costs

    def measure(cfg: Any, lm: CausalLM) -> Any:
        return cached_target_costs(cfg, lm, log=lambda m: print(f"[specdec] {m}", file=sys.stderr))

    return measure if auto is None else auto.costs_or(measure)


def _short(args: argparse.Namespace) -> argparse.Namespace:
    ns = argparse.Namespace(**vars(args))
    ns.max_new_tokens = min(8, args.max_new_tokens)
    return ns
