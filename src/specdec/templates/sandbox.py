"""Jinja's immutable sandbox, with a size check on every operation that can build a value.

A chat template comes from a model file: it is data written by whoever made the file. Jinja's
sandbox stops access to Python internals; this module bounds what the template can build, by
checking the size of a result *before* the operation runs wherever the operation could build
something large in one step (one C call the time limit cannot interrupt):

- strings, lists and tuples: at most ``sequence_items`` items from repetition (``*``),
  concatenation (``+``, ``~``), ``%``- and ``format``-formatting, ``join``, ``replace``,
  ``center``/``ljust``/``rjust``/``zfill``, ``expandtabs``, ``translate``, ``indent``,
  ``wordwrap``, ``batch``, ``slice``, ``tojson``, ``pprint``, ``string``;
- integers: at most ``int_bits`` bits from ``*`` and ``**`` (a power tower such as
  ``((7 ** 1000) ** 1000) ** 1000`` is refused at its second step), and ``to_bytes``;
- text: every ``{{ ... }}`` output at most ``output_chars`` characters, measured on the value
  before it is turned into text (a list of a million references to one long string is
  small in memory and huge as text), and the rendered output as a whole too.

``lipsum`` (a loop in Python that no template needs) is removed from the globals. Template
code stops after ``seconds`` (``_Deadline``: a trace on the template's own frames). This is
the in-process layer; ``specdec.templates.isolation`` runs it in a separate process with a
hard memory and time limit, which bounds whatever this list does not name.
"""

from __future__ import annotations

import json
import math
import re
import string
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import wraps
from types import FrameType
from typing import Any, TypeGuard

from specdec.errors import ConfigError


class TemplateError(ConfigError):
    """A chat template failed, raised, or ran past its limits."""


@dataclass(frozen=True)
class TemplateLimits:
    """What one rendering may cost."""

    seconds: float = 2.0  # of template code, per render
    output_chars: int = 1_000_000  # the rendered text, and any one {{ }} output
    sequence_items: int = 1_000_000  # longest str / list / tuple one operation may build
    int_bits: int = 100_000  # largest integer one operation may build
    memory_bytes: int = 256 << 20  # address space the rendering process may add (isolated)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------


def text_size(value: Any, cap: int) -> int:
    """An estimate of ``len(str(value))`` that walks containers and stops once past ``cap``
    (so it costs at most about ``cap`` steps, never the size of the text)."""
    from jinja2.utils import Namespace

    total = 0
    stack = [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, str | bytes | bytearray):
            total += len(v) + 2
        elif isinstance(v, bool) or v is None or isinstance(v, float):
            total += 24
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, Mapping):
            total += 4 * len(v) + 2
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list | tuple | set | frozenset):
            total += 2 * len(v) + 2
            if len(v) > cap:
                return total
            stack.extend(v)
        elif isinstance(v, Namespace):
            total += 16
            stack.append(v._Namespace__attrs)
        else:
            total += 64  # a macro, a loop, an Undefined: a short repr
    return total


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)
_NUMBER = re.compile(r"\d+")


class _Checks:
    """The limits, applied to the operations that can build large values."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.lim = limits

    # -- the primitives --

    def items(self, n: int, what: str) -> None:
        if n > self.lim.sequence_items:
            raise TemplateError(
                f"the chat template would build {n:,} items with {what} "
                f"(limit {self.lim.sequence_items:,})"
            )

    def bits(self, n: float, what: str) -> None:
        if n > self.lim.int_bits:
            raise TemplateError(
                f"the chat template would build an integer of about {int(min(n, 1e18)):,} "
                f"bits by {what} (limit {self.lim.int_bits:,})"
            )

    def text(self, values: Iterable[Any], what: str) -> int:
        """The summed text size of ``values``, checked against the item limit."""
        cap = self.lim.sequence_items
        total = 0
        for v in values:
            total += text_size(v, cap - total)
            if total > cap:
                raise TemplateError(
                    f"the chat template would build a text of more than {cap:,} characters "
                    f"with {what}"
                )
        return total

    def width(self, n: Any, what: str) -> None:
        if isinstance(n, int) and not isinstance(n, bool):
            self.items(n, what)

    # -- operators --

    def binop(self, op: str, left: Any, right: Any) -> None:
        seqs = str | bytes | list | tuple
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, seqs) and isinstance(n, int):
                    self.items(len(seq) * max(n, 0), f"a repetition of {len(seq):,} items")
            if _is_int(left) and _is_int(right):
                self.bits(left.bit_length() + right.bit_length(), "multiplication")
        elif op == "**":
            if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
                self.bits(right * math.log2(abs(left)), f"raising to the power {right}")
        elif op == "+":
            if isinstance(left, seqs) and isinstance(right, seqs):
                self.items(len(left) + len(right), "concatenation")
        elif op == "%" and isinstance(left, str):
            self.percent(left, right)

    def percent(self, fmt: str, args: Any) -> None:
        for m in _PERCENT_SPEC.finditer(fmt):
            for n in m.group(1, 2):
                if n == "*":
                    raise TemplateError("the chat template uses a '*' width in %-formatting")
                if n:
                    self.items(int(n), "a %-format width")
        values = args.values() if isinstance(args, Mapping) else args
        self.text((fmt, *(values if isinstance(values, tuple) else (values,))), "%-formatting")

    def format_string(self, fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        try:
            fields = list(string.Formatter().parse(fmt))
        except ValueError as e:
            raise TemplateError(f"the chat template has a bad format string: {e}") from e
        for _, _, spec, _ in fields:
            if spec and "{" in spec:
                raise TemplateError("the chat template nests fields in a format spec")
            for n in _NUMBER.findall(spec or ""):
                self.items(int(n), "a format width")
        self.text((fmt, *args, *kwargs.values()), "str.format")

    # -- methods of str / bytes / int --

    def method(self, obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Check a call of a str / bytes / int method; returns the arguments to call it with
        (an iterable given to ``join`` is read into a bounded list first)."""
        owner = getattr(obj, "__self__", None)
        name = getattr(obj, "__name__", "")
        if isinstance(owner, str | bytes):
            if name == "join" and args:
                return (self.join(args[0], len(owner)), *args[1:])
            self.text_method(owner, name, args, kwargs)
        elif _is_int(owner) and name == "to_bytes":
            self.width(args[0] if args else kwargs.get("length", 1), "int.to_bytes")
        return args

    def text_method(
        self, s: str | bytes, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        if name in ("center", "ljust", "rjust", "zfill") and args:
            self.width(args[0], f"str.{name}")
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if _is_int(tab):
                self.items(len(s) * max(tab, 1), "str.expandtabs")
        elif name == "replace" and len(args) >= 2:
            self.replace(s, args[0], args[1], args[2] if len(args) > 2 else -1)
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
            self.items(len(s) * max(longest, 1), "str.translate")

    def replace(self, s: Any, old: Any, new: Any, count: Any) -> None:
        if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
            return
        n = len(s) + 1 if not old else s.count(old)
        if _is_int(count) and count >= 0:
            n = min(n, count)
        self.items(len(s) + n * max(len(new) - len(old), 0), "replace")

    def join(self, values: Any, sep: int) -> list[Any]:
        """``values`` as a list (bounded), after checking what joining them would build."""
        if not isinstance(values, list | tuple | str):
            values = list(_bounded(values, self.lim.sequence_items + 1))
        self.items(len(values), "join")
        total = self.text(values, "join")
        self.items(total + sep * max(len(values) - 1, 0), "join")
        return list(values)

    # -- filters --

    def filter(self, name: str, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        """Check a filter call; returns the value to filter (``join`` reads an iterable into a
        bounded list first, so that what is checked is what is joined)."""
        if name == "join":
            return self.join(value, len(str(_arg(args, kw, 0, "d", ""))))
        check = _FILTER_CHECKS.get(name)
        if check is not None:
            check(self, value, args, kw)
        if name in _TEXT_FILTERS:
            self.text((value,), f"the {name} filter")
        return value

    def output(self, value: Any) -> Any:
        size = text_size(value, self.lim.output_chars)
        if size > self.lim.output_chars:
            raise TemplateError(
                f"the chat template's output passed {self.lim.output_chars} characters"
            )
        return value

    def result(self, value: Any, what: str) -> Any:
        if _is_int(value):
            self.bits(value.bit_length(), what)
        elif isinstance(value, str | bytes | list | tuple):
            self.items(len(value), what)
        return value


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _bounded(values: Iterable[Any], n: int) -> Iterable[Any]:
    for i, v in enumerate(values):
        if i >= n:
            return
        yield v


def _arg(args: tuple[Any, ...], kw: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kw.get(name, default)


def _check_indent(c: _Checks, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    width = _arg(args, kw, 0, "width", 4)
    unit = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    c.width(unit, "indent")
    if isinstance(value, str):
        c.items(len(value) + (value.count("\n") + 1) * max(unit, 0), "indent")


def _check_wordwrap(c: _Checks, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    wrap = _arg(args, kw, 2, "wrapstring", None)
    if isinstance(value, str) and isinstance(wrap, str):
        c.items(len(value) * (1 + len(wrap)), "wordwrap")


def _check_sum(c: _Checks, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    start = _arg(args, kw, 1, "start", 0)
    if not isinstance(start, int | float):
        raise TemplateError("the chat template's sum filter only adds numbers")


def _check_tojson(c: _Checks, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    indent = kw.get("indent", args[1] if len(args) > 1 else None)
    size = c.text((value,), "tojson")
    if _is_int(indent):
        c.items(size * (1 + max(indent, 0)), "tojson with indent")
    elif isinstance(indent, str):
        c.items(size * (1 + len(indent)), "tojson with indent")


_FILTER_CHECKS: dict[str, Callable[[_Checks, Any, tuple[Any, ...], dict[str, Any]], None]] = {
    "center": lambda c, v, a, k: c.width(_arg(a, k, 0, "width", 80), "center"),
    "format": lambda c, v, a, k: (
        c.percent(v, a or tuple(k.values())) if isinstance(v, str) else None
    ),
    "replace": lambda c, v, a, k: c.replace(
        str(v) if isinstance(v, str) else v,
        _arg(a, k, 0, "old", ""),
        _arg(a, k, 1, "new", ""),
        _arg(a, k, 2, "count", -1),
    ),
    "indent": _check_indent,
    "wordwrap": _check_wordwrap,
    "batch": lambda c, v, a, k: c.width(_arg(a, k, 0, "linecount", 1), "batch"),
    "slice": lambda c, v, a, k: c.width(_arg(a, k, 0, "slices", 1), "slice"),
    "sum": _check_sum,
    "tojson": _check_tojson,
}
# filters that turn their value into text: the text is bounded before it is built
_TEXT_FILTERS = frozenset(
    {
        "center", "string", "pprint", "format", "replace", "indent", "wordwrap", "truncate",
        "upper", "lower", "title", "capitalize", "trim", "striptags", "urlize", "urlencode",
        "e", "escape", "forceescape", "wordcount", "xmlattr", "safe", "tojson",
    }
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


def _environment(limits: TemplateLimits) -> Any:
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import _PassArg

    checks = _Checks(limits)

    class CheckedConcat(CodeGenerator):
        """``a ~ b`` calls ``environment.concat_checked`` (Jinja joins the parts itself)."""

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.concat_checked((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "-", "%", "//", "/"})
        code_generator_class = CheckedConcat

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            checks.binop(operator, left, right)
            return checks.result(
                super().call_binop(context, operator, left, right), f"the operator {operator}"
            )

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            args = checks.method(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__
            is_map = value.__name__ == "format_map"

            def checked(*args: Any, **kwargs: Any) -> str:
                mapping = args[0] if is_map and args and isinstance(args[0], Mapping) else kwargs
                checks.format_string(fmt, () if is_map else args, mapping)
                return wrapped(*args, **kwargs)

            return checked

        def concat_checked(self, parts: tuple[Any, ...]) -> str:
            checks.text(parts, "the ~ operator")
            return "".join(map(str, parts))

    env = LimitedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], finalize=checks.output
    )

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused the messages: {message}")

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals.pop("lipsum", None)
    for name, func in list(env.filters.items()):
        env.filters[name] = _checked_filter(checks, name, func, _PassArg.from_obj(func) is not None)
    return env


def _checked_filter(
    checks: _Checks, name: str, func: Callable[..., Any], passes_arg: bool
) -> Callable[..., Any]:
    skip = 1 if passes_arg else 0

    @wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > skip:
            value = checks.filter(name, args[skip], args[skip + 1 :], kwargs)
            args = (*args[:skip], value, *args[skip + 1 :])
        return checks.result(func(*args, **kwargs), f"the {name} filter")

    return checked


# --------------------------------------------------------------------------------------------
# Rendering here (the isolated process calls this too)
# --------------------------------------------------------------------------------------------


class _Deadline:
    """A trace function that stops template code (frames compiled from the template) once the
    deadline has passed: the only way, in-process, to bound loops that produce no output."""

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


def render_here(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    variables: Mapping[str, Any] | None,
    limits: TemplateLimits,
    *,
    trace: bool = True,
) -> str:
    """Render in this process, in the limited sandbox. Raises TemplateError. ``trace``: stop
    template code at the time limit with a trace function (which slows rendering about
    threefold; the worker process uses a timer instead)."""
    from jinja2 import TemplateError as JinjaError

    env = _environment(limits)
    deadline = _Deadline(limits.seconds)
    previous = sys.gettrace()
    if trace:
        sys.settrace(deadline)
    parts: list[str] = []
    size = 0
    try:
        try:
            compiled = env.from_string(template)
        except JinjaError as e:
            raise TemplateError(f"the chat template does not parse: {e}") from e
        for piece in compiled.generate({**(variables or {}), "messages": list(messages)}):
            size += len(piece)
            if size > limits.output_chars:
                raise TemplateError(
                    f"the chat template's output passed {limits.output_chars} characters"
                )
            if time.monotonic() > deadline.end:
                raise TemplateError(f"the chat template ran for more than {limits.seconds:g} s")
            parts.append(piece)
    except TemplateError:
        raise
    except JinjaError as e:
        raise TemplateError(f"the chat template failed: {e}") from e
    except MemoryError as e:
        raise TemplateError(
            f"the chat template ran past its memory limit ({limits.memory_bytes >> 20} MiB)"
        ) from e
    except Exception as e:  # a template may raise anything Python can (TypeError, ...)
        raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e
    finally:
        if trace:
            sys.settrace(previous)
    return "".join(parts)
