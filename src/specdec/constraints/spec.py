"""What a request constrains its output to, as the user gave it: a ``Constraint`` (pure data,
checked for shape here; the grammar engine reads it in ``constraints.engine``).

Kinds:
- ``json_schema``: a JSON Schema (its JSON text); the output is one JSON value it accepts;
- ``json_object``: any JSON object (OpenAI's ``response_format: {"type": "json_object"}``);
- ``regex``: the whole output matches the regular expression;
- ``lark``: a Lark grammar as the engine (llguidance) takes it, ``%json {...}`` included;
- ``gbnf``: a GBNF grammar (llama.cpp's format), converted to Lark by the engine's converter.

``field`` names where the constraint came from (``response_format``, ``--json-schema``,
``tools``), so that an error says which input was wrong. ``trigger`` (a token's text, e.g.
``<tool_call>``) makes the constraint lazy: the output is free until the model emits that
token, and from that token on (inclusive) it follows the grammar (tool calls under
``tool_choice: auto``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from specdec.errors import ConfigError
from specdec.util.jsonbound import MAX_DEPTH, JsonError, loads

Kind = Literal["json_schema", "json_object", "regex", "lark", "gbnf"]
KINDS: tuple[Kind, ...] = ("json_schema", "json_object", "regex", "lark", "gbnf")

MAX_SOURCE_CHARS = 1 << 20  # a schema or a grammar: 1 MiB of text


class ConstraintError(ConfigError):
    """A constraint that cannot be used (invalid, unsupported, too costly); ``field`` names
    the input it came from."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


@dataclass(frozen=True)
class Constraint:
    """A checked constraint (see the module docstring)."""

    kind: Kind
    source: str = ""  # the schema's JSON text, the regex or the grammar ("" for json_object)
    field: str = "constraint"
    trigger: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(self.field, f"unknown constraint kind {self.kind!r}")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise ConstraintError(
                self.field, f"longer than {MAX_SOURCE_CHARS >> 20} MiB of text ({len(self.source)})"
            )
        if self.kind == "json_schema":
            schema_object(self.source, self.field)  # parses, or names the field
        elif self.kind != "json_object" and not self.source.strip():
            raise ConstraintError(self.field, f"the {self.kind} is empty")
        if self.trigger is not None and not self.trigger:
            raise ConstraintError(self.field, "an empty trigger")


def schema_object(source: str, field: str) -> dict[str, Any] | bool:
    """A JSON schema's text as the object (or boolean schema) it holds; ConstraintError naming
    ``field`` for text that is not JSON, nests deeper than ``MAX_DEPTH``, or is neither."""
    try:
        schema = loads(source, max_depth=MAX_DEPTH)
    except JsonError as e:
        raise ConstraintError(field, f"the schema is {e}") from e
    if not isinstance(schema, dict | bool):
        raise ConstraintError(field, f"a schema is a JSON object, got {type(schema).__name__}")
    return schema


def json_schema(schema: Any, field: str = "json_schema") -> Constraint:
    """The constraint of a schema given as an object (a dict) or as its JSON text."""
    if isinstance(schema, str):
        return Constraint("json_schema", schema, field)
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ConstraintError(field, f"the schema is not JSON ({e})") from e
    return Constraint("json_schema", text, field)


def grammar_constraint(text: str, field: str = "grammar") -> Constraint:
    """A grammar's text as a constraint: GBNF when it defines rules with ``::=`` (llama.cpp's
    format), Lark otherwise."""
    kind: Kind = "gbnf" if "::=" in text else "lark"
    return Constraint(kind, text, field)
