"""JSON of any origin (a server's reply, a results or resume file, a file a user names)
decoded with a bound on its nesting.

``json.loads`` recurses once per level of nesting: 100,000 opening brackets raise
RecursionError, and a document just under the interpreter's limit makes every later walk of
it (validation, ``json.dumps``) recurse as deep. No document specdec reads needs more than a
handful of levels, so a depth above ``MAX_DEPTH`` is refused before anything is decoded, by a
scan that does not recurse (strings removed by one regular expression, then the running
count of the brackets that are left). Sizes are bounded where the bytes are read (each
reader states its own limit); shapes are checked by each reader's schema.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

MAX_DEPTH = 64  # levels of [ and { (an OpenAI reply has at most 6, a results record 4)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonError(ValueError):
    """Text that is not JSON, or JSON nested deeper than the bound (``str``: one line)."""


def depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings do
    not count); linear time, no recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` for text nested at most ``max_depth`` deep; anything else is a
    JsonError whose message says what was wrong (invalid JSON and where, or too deep)."""
    levels = depth(text)
    if levels > max_depth:
        raise JsonError(f"JSON nested {levels} levels deep (more than {max_depth})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    except RecursionError as e:  # a bound above the interpreter's own (not the default)
        raise JsonError("JSON nested too deeply to decode") from e


def loads_or_none(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``loads``, or None for text that is not JSON or nested too deeply (records read back
    tolerantly: such a line is one unreadable record)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return loads(text, max_depth=max_depth)
    except JsonError:
        return None
