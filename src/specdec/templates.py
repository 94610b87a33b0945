"""Chat templates rendered in a sandbox with limits.

A chat template comes from a model file (GGUF metadata or tokenizer_config.json): it is data
written by whoever made the file, not code we trust. Jinja's sandbox already stops attribute
access to Python internals and caps ``range``; on top of it this module bounds what a hostile
template can cost: repetition (``'a' * 10**10``) and powers are checked before they run,
rendering stops after ``MAX_SECONDS`` of template code (nested loops) and the output after
``MAX_OUTPUT_CHARS``. The globals and filters match what transformers gives templates
(``raise_exception``, ``strftime_now``, ``tojson``, loop controls), so the same template gives
the same text on both backends.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import Any

from specdec.errors import ConfigError


class TemplateError(ConfigError):
    """A chat template failed, raised, or ran past its limits."""


@dataclass(frozen=True)
class TemplateLimits:
    seconds: float = 2.0  # of template code, per render
    output_chars: int = 1_000_000
    sequence_items: int = 1_000_000  # longest str / list a repetition may build
    exponent: int = 1_000  # largest exponent ** may use


def _environment(limits: TemplateLimits) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if (
                        isinstance(seq, str | list | tuple)
                        and isinstance(n, int)
                        and len(seq) * max(n, 0) > limits.sequence_items
                    ):
                        raise TemplateError(
                            f"the chat template repeats a sequence of {len(seq)} items "
                            f"{n} times (limit {limits.sequence_items} items)"
                        )
            elif (
                operator == "**" and isinstance(right, int | float) and abs(right) > limits.exponent
            ):
                raise TemplateError(
                    f"the chat template raises to the power {right} (limit {limits.exponent})"
                )
            return super().call_binop(context, operator, left, right)

    env = LimitedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused the messages: {message}")

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class _Deadline:
    """A trace function that stops template code (frames compiled from the template) once the
    deadline has passed: the only way to bound loops that produce no output."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename == "<template>":
            return self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > self.end:
            raise TemplateError(f"the chat template ran for more than {self.seconds:g} s")
        return self._line


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    variables: Mapping[str, Any] | None = None,
    *,
    limits: TemplateLimits | None = None,
) -> str:
    """The text of ``template`` for ``messages`` (plus variables such as bos_token,
    add_generation_prompt), rendered in the limited sandbox. Raises TemplateError."""
    from jinja2 import TemplateError as JinjaError

    lim = limits or TemplateLimits()
    env = _environment(lim)
    try:
        compiled = env.from_string(template)
    except JinjaError as e:
        raise TemplateError(f"the chat template does not parse: {e}") from e
    deadline = _Deadline(lim.seconds)
    previous = sys.gettrace()
    sys.settrace(deadline)
    parts: list[str] = []
    size = 0
    try:
        for piece in compiled.generate({**(variables or {}), "messages": list(messages)}):
            size += len(piece)
            if size > lim.output_chars:
                raise TemplateError(
                    f"the chat template's output passed {lim.output_chars} characters"
                )
            if time.monotonic() > deadline.end:
                raise TemplateError(f"the chat template ran for more than {lim.seconds:g} s")
            parts.append(piece)
    except TemplateError:
        raise
    except JinjaError as e:
        raise TemplateError(f"the chat template failed: {e}") from e
    except (MemoryError, RecursionError, OverflowError, TypeError, ValueError) as e:
        raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e
    finally:
        sys.settrace(previous)
    return "".join(parts)
