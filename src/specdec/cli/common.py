"""Options shared by the subcommands that load a draft/target pair."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specdec.configuration import MACHINE_DEFAULT, default_numerics
from specdec.errors import ConfigError
from specdec.models.loader import BACKENDS, DEVICES, DTYPES, ModelConfig
from specdec.pairs import (
    DEFAULT_DRAFT,
    DEFAULT_DRAFT_BACKEND,
    DEFAULT_K,
    DEFAULT_TARGET,
    DEFAULT_TARGET_BACKEND,
    DraftRef,
    ModelOptions,
    model_refs,
)
from specdec.util.bounds import MAX_LIST, check_n_ctx, check_seed, check_threads
from specdec.util.printable import printable

if TYPE_CHECKING:
    from specdec.api import Pair


SEEN_FLAGS = "_seen_boolean_flags"  # the namespace attribute OneOfBoolean records into


class OneOfBoolean(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag`` where giving both is a contradiction, not "the last one
    wins": every form given is recorded on the namespace, and ``check_common`` refuses a
    flag given both ways with one line."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen: dict[str, set[str]] = getattr(namespace, SEEN_FLAGS, None) or {}
        if option_string is not None:
            seen.setdefault(self.option_strings[0], set()).add(option_string)
        setattr(namespace, SEEN_FLAGS, seen)
        super().__call__(parser, namespace, values, option_string)


def check_contradictions(args: argparse.Namespace) -> None:
    """A ConfigError for a OneOfBoolean flag given both ways (``--exact --no-exact``)."""
    for forms in (getattr(args, SEEN_FLAGS, None) or {}).values():
        if len(forms) > 1:
            both = " and ".join(sorted(forms, key=len))
            raise ConfigError(f"{both} contradict each other: give one of them")


def add_model_args(p: argparse.ArgumentParser, *, n_ctx: int = 4096) -> None:
    g = p.add_argument_group("models")
    g.add_argument(
        "--draft",
        "-md",
        "--draft-model",
        dest="draft",
        default=DEFAULT_DRAFT,
        help="draft: store name, GGUF file, model directory, 'ngram' (prompt lookup), "
        "'suffix[:OPTS]' (suffix matching, drafts sized by the match), 'hybrid:MODEL' "
        f"(suffix where it matches, the model elsewhere) or 'none' (default: {DEFAULT_DRAFT})",
    )
    g.add_argument(
        "--target",
        "-m",
        "--model",
        dest="target",
        default=DEFAULT_TARGET,
        help=f"target: store name, GGUF file or model directory (default: {DEFAULT_TARGET})",
    )
    g.add_argument(
        "--draft-window",
        type=int,
        default=None,
        metavar="W",
        help="the draft model sees only the last W tokens of the context (its prefill of a "
        "long prompt shrinks to W tokens; lossless: the target verifies every draft); "
        "W < --n-ctx. Names the default draft model when no --draft is given",
    )
    g.add_argument("--draft-backend", default=DEFAULT_DRAFT_BACKEND, choices=BACKENDS)
    g.add_argument("--target-backend", default=DEFAULT_TARGET_BACKEND, choices=BACKENDS)
    g.add_argument(
        "--device",
        default="auto",
        choices=DEVICES,
        help="device for both models (transformers: auto = cuda > mps > cpu)",
    )
    g.add_argument("--draft-device", default=None, choices=DEVICES)
    g.add_argument("--target-device", default=None, choices=DEVICES)
    g.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="transformers dtype (auto: bf16 on CPUs with bf16, fp16 on GPUs)",
    )
    g.add_argument("--draft-dtype", default=None, choices=DTYPES)
    g.add_argument("--target-dtype", default=None, choices=DTYPES)
    g.add_argument(
        "--threads", type=int, default=None, help=f"CPU threads (default: all, {os.cpu_count()})"
    )
    g.add_argument("--n-ctx", type=int, default=n_ctx, help="context window to allocate")
    g.add_argument(
        "--exact",
        action=OneOfBoolean,
        default=None,
        help="exact numerics for the target (llama.cpp): a token's logits do not depend on "
        "how many tokens share its pass, so speculative output is plain decoding's, token for "
        "token (default: on for llama.cpp targets where they cost at most 3 %% on this "
        "machine and build, measured once and cached; --no-exact: llama.cpp's own numerics; "
        "docs/certify.md)",
    )


def draft_reference(args: argparse.Namespace) -> str:
    """The draft reference for ``specdec.load``: the machine's default ("default") when
    nothing about speculation was chosen (no --draft, -k, --adaptive, --auto or
    --draft-window), "none" for -k 0, else the named draft (the default draft model when
    only K was given)."""
    nothing = (
        not args.auto
        and args.draft is None
        and args.k is None
        and not args.adaptive
        and getattr(args, "draft_window", None) is None
    )
    if nothing or (args.auto and args.draft is None):
        return MACHINE_DEFAULT
    if args.k == 0 and not args.auto:  # plain decoding: no drafter to load
        return "none"
    return str(args.draft or DEFAULT_DRAFT)


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """'1,2,4' or '1-8' or '1-4,6,8' -> ints, in the given order (at most MAX_LIST of
    them: a range is measured before it is expanded)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if a > b:
                    raise ConfigError(f"bad {what} range {part!r}")
                if len(out) + b - a + 1 > MAX_LIST:
                    raise ConfigError(f"the {what} list {text!r} has more than {MAX_LIST:,} values")
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(f"bad {what} list {text!r}: use e.g. 1,2,4 or 1-8") from e
    if not out:
        raise ConfigError(f"empty {what} list")
    return tuple(out)


def check_common(args: argparse.Namespace) -> None:
    """Bounds of the shared numeric flags, before anything is loaded (specdec.util.bounds: the
    same rules for every subcommand; a subcommand's default of None is not checked), and
    flags given both ways (``check_contradictions``)."""
    check_contradictions(args)
    check_threads(getattr(args, "threads", None))
    check_n_ctx(getattr(args, "n_ctx", None))
    check_draft_window(args)
    check_seed(getattr(args, "seed", None))


def check_draft_window(args: argparse.Namespace) -> None:
    """--draft-window: >= 1, below --n-ctx (the draft model's context also holds the
    drafts), and not with --auto (which chooses the drafter itself)."""
    window = getattr(args, "draft_window", None)
    if window is None:
        return
    if window < 1:
        raise ConfigError(f"--draft-window must be >= 1, got {window}")
    n_ctx = getattr(args, "n_ctx", None)
    if n_ctx is not None and window >= n_ctx:
        raise ConfigError(
            f"--draft-window ({window}) must be smaller than --n-ctx ({n_ctx}): the draft "
            "model's context holds the window and the drafts"
        )
    if getattr(args, "auto", False):
        raise ConfigError("--draft-window names a draft model; --auto chooses the drafter itself")


def stderr_log(message: str) -> None:
    """What a command tells the user on the way (``[specdec] ...`` on stderr)."""
    print(f"[specdec] {printable(message)}", file=sys.stderr)


def model_options(args: argparse.Namespace, exact: bool | None) -> ModelOptions:
    """The model flags as one ``ModelOptions`` (the target's device and dtype fall back to
    the common ones); ``exact`` None lets the profile decide (``specdec.load`` only)."""
    return ModelOptions(
        target_backend=args.target_backend,
        draft_backend=args.draft_backend,
        device=args.target_device or args.device,
        dtype=args.target_dtype or args.dtype,
        draft_device=args.draft_device,
        draft_dtype=args.draft_dtype,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        exact=exact,
    )


def model_configs(
    args: argparse.Namespace, *, decide: bool = True, log: Callable[[str], None] = stderr_log
) -> tuple[DraftRef, ModelConfig]:
    """The named draft and target of the command line (``pairs.model_refs``), for
    the commands that load exactly what they are told (certify); the target's numerics, when
    neither --exact nor --no-exact was given, as ``specdec.load`` decides them
    (``configuration.default_numerics``: exact where they cost at most 3 % here; ``log``
    hears the decision the first time), or llama.cpp's own without ``decide`` (nothing
    loads)."""
    exact = getattr(args, "exact", None)
    options = model_options(args, bool(exact) if not decide else exact)
    if options.exact is None:
        options = dataclasses.replace(options, exact=default_numerics(args.target, options, log))
    return model_refs(args.target, args.draft, options)


def load_from_args(
    args: argparse.Namespace, *, prompt_tokens: int | None = None, new_tokens: int = 128
) -> Pair:
    """``specdec.load`` with the command line's model options (``generate``, ``serve``);
    says on stderr what the profile or the machine default chose, and why.
    ``prompt_tokens`` / ``new_tokens``: the request's size, for the choice of configuration."""
    from specdec.api import load

    draft, options = draft_reference(args), model_options(args, args.exact)
    pair = load(
        args.target,
        draft,
        **dataclasses.asdict(options),  # the model keywords, as ModelOptions names them
        auto=args.auto,
        draft_window=args.draft_window,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        log=stderr_log,
    )
    config = pair.config
    assert config is not None
    if config.how:  # the profile or the machine default chose: say what and why
        line = f"{config.how}: {config.label}: {config.reason}"
        print(f"[specdec] {printable(line)}", file=sys.stderr)
    return pair


def add_speculation_args(p: argparse.ArgumentParser, *, serving: bool = False) -> None:
    """-k, --adaptive and --auto, as ``generate`` and ``serve`` take them (a request to the
    server may still set K)."""
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
        help=f"{'serve' if serving else 'run'} what `specdec profile` recommends for this "
        "machine (profiled once, cached): the target's backend, the drafter or plain "
        "decoding, and K adapted from the profile's costs and the rounds' acceptance"
        + ("; a request may still set K" if serving else " (reproducible with --seed)"),
    )


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 disables")
    g.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 disables")
    g.add_argument("--seed", type=int, default=0)


def quiet_libraries() -> None:
    """Silence progress bars and info logs of transformers and friends (CLI only)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def numerics_line(pair: object, target: str, n_threads: int | None) -> str:
    """One line: whether the loaded target runs exact numerics, what they cost here and why
    (the cached decision of ``profiler.exact_default``; nothing is measured here)."""
    from specdec.profiler.exact_default import cached_decision, summary

    exact = getattr(getattr(pair, "target", None), "exact", None)
    if exact is None:  # transformers or a mock: no exact mode to choose
        return "exact numerics: not a llama.cpp target (its rows are as its backend computes them)"
    # a note: decided exact, refused at the load (``api.load``)
    note = getattr(getattr(pair, "config", None), "numerics_note", "")
    return summary(bool(exact), cached_decision(target, n_threads), note)
