"""`specdec demo`: what speculation does on this machine, shown on one code edit.

1. This machine's verdict, in one line: the cached profile's recommendation and why (or that
   there is none yet), and what exact numerics would cost here when the profile measured it.
2. A code-editing request from the packaged ``code_predict`` set (a long function to edit,
   passed with the code before the edit as its prediction), decoded plainly and then with the
   prediction drafted, on the same loaded pair: the edited code, a stats line for each, the
   measured speedup and whether the two outputs are identical.
3. The same request through llama-cpp-python's own greedy loop on the same loaded weights
   (``bench.llama_own``: the fastest plain decoder of the GGUF), and the speculative decode
   speed as a ratio to it, beside the ratio to specdec's own plain loop.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from specdec.cli import command_help
from specdec.cli.common import check_common, numerics_line, quiet_libraries
from specdec.errors import ConfigError
from specdec.pairs import DEFAULT_TARGET
from specdec.util.printable import printable

if TYPE_CHECKING:
    from specdec.completion import Comparison

DEMO_TASK = "code_predict:rename_1"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help=command_help("demo"),
        description="This machine's verdict in one line, then a code edit decoded plainly and "
        "with its prediction drafted: the speedup and whether the outputs are identical.",
    )
    p.add_argument("--target", "-m", default=DEFAULT_TARGET, help="the target model")
    p.add_argument("--task", default=DEMO_TASK, help="a task id of the code_predict set")
    p.add_argument("--max-new-tokens", "-n", type=int, default=512)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.set_defaults(func=run)


def verdict(target: str, n_threads: int | None) -> str:
    """One line: what the cached profile of this machine recommends and why."""
    from specdec.profiler.auto import auto_profile, choose
    from specdec.profiler.exact_price import ExactPrice
    from specdec.util.machine import cpu_model

    result = auto_profile(
        target,
        draft="qwen2.5-coder-0.5b-instruct-q4_k_m",
        target_backend="auto",
        draft_backend="auto",
        n_ctx=4096,
        n_threads=n_threads,
        cached_only=True,
    )
    where = cpu_model() or "this CPU"
    if result is None:
        return (
            f"{where}: no profile yet (`specdec profile` measures every configuration here); "
            "the default drafts only where the text repeats, sized by the target's measured "
            "verify cost"
        )
    choice = choose(result, None, int(result.spec["n_new"]))
    reason = choice.reason.split(" Prediction:")[0].rstrip(".")  # measured, not forecast
    line = f"{where}: the profile recommends {choice.label} ({reason})"
    if result.exact:
        price = ExactPrice.from_dict(result.exact)
        cost = price.cost  # None: a profile cached before verify passes were timed
        what = "per plain step" if cost is None else "(the dearest of step, verify, prefill)"
        line += (
            f"; exact numerics cost {price.decode_cost if cost is None else cost:+.0%} {what} here"
        )
    return line


def run(args: argparse.Namespace) -> int:
    from specdec.api import load
    from specdec.prompt_sets import load_code_predict

    check_common(args)  # --threads: as every other subcommand checks it
    quiet_libraries()
    tasks = {p.id: p for p in load_code_predict()}
    if args.task not in tasks:
        raise ConfigError(f"no task {args.task!r} in the code_predict set")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    task = tasks[args.task]
    print(f"[specdec] {verdict(args.target, args.threads)}", file=sys.stderr)
    pair = load(
        args.target, n_threads=args.threads, log=lambda m: print(f"[specdec] {printable(m)}")
    )
    print(f"[specdec] {numerics_line(pair, args.target, args.threads)}", file=sys.stderr)
    ids = pair.encode(task.text)
    instruction = task.text.split("\n\n", 1)[0]
    print(f"[specdec] task {task.id} ({len(ids)}-token prompt): {instruction}", file=sys.stderr)
    c = pair.compare(ids, max_new_tokens=args.max_new_tokens, prediction=task.prediction)
    print(c.speculative.text)
    for line in c.report("with the prediction"):
        print(line, file=sys.stderr)
    print(f"[specdec] {against_llama_cpp(pair.target, ids, c)}", file=sys.stderr)
    return 0


def against_llama_cpp(target: object, ids: list[int], c: Comparison) -> str:
    """One line: the speculative run's decode speed against llama-cpp-python's own loop on the
    same request and the same loaded weights (run now, after a short warm-up of its own),
    and against specdec's plain loop, both over the tokens after the first."""
    from specdec.bench.llama_own import decode_window, own_loop

    n_new = len(c.plain.tokens)
    if own_loop(target, ids, min(8, n_new)) is None:  # the warm-up, or not llama.cpp
        return "llama-cpp-python's own loop: not measured (the target is not a llama.cpp model)"
    own = own_loop(target, ids, n_new)
    assert own is not None
    spec_n, spec_s = decode_window(c.speculative.result)
    plain_n, plain_s = decode_window(c.plain.result)
    spec, plain = spec_n / spec_s, plain_n / plain_s
    same = own.same_output(c.plain.tokens)
    return (
        f"against llama-cpp-python's own loop on the same weights ({own.tokens_per_second:.1f} "
        f"tok/s after the first token): {spec / own.tokens_per_second:.2f}x with the "
        f"prediction ({spec:.1f} tok/s), specdec's plain loop {plain / own.tokens_per_second:.2f}x "
        f"({plain:.1f} tok/s); its output is plain decoding's: {'yes' if same else 'no'}"
    )
