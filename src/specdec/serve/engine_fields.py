"""Other engines' names for a constrained output, taken as they mean it.

OpenAI's own field is ``response_format``. Clients written for the engines users deploy send
these instead (as extra body fields), and an engine that ignored them would answer
unconstrained text as if it were constrained:

- llama-server: ``grammar`` (GBNF), ``json_schema`` (a schema, top level);
- vLLM: ``structured_outputs: {json, regex, choice, grammar, json_object}``, and its older
  ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``;
- SGLang: ``regex``, ``ebnf`` (a GBNF-style grammar), ``json_schema`` (its JSON text).

Each becomes a ``Constraint`` naming the field it came from (``structured_outputs.json``), so
errors say which input was wrong. Settings that only pick another engine's backend are
ignored at their neutral value and refused otherwise (``guided_whitespace_pattern``,
``structured_outputs.structural_tag``): the output could not be what they ask for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from specdec.constraints.spec import Constraint, ConstraintError, grammar_constraint, json_schema
from specdec.serve.errors import FieldError

# keys of vLLM's structured_outputs that constrain (the rest: NEUTRAL)
_STRUCTURED = ("json", "regex", "choice", "grammar", "json_object")
# top-level fields that constrain (llama-server's, vLLM's older ones, SGLang's)
TOP_LEVEL = frozenset(
    {"grammar", "json_schema", "guided_grammar", "guided_json", "guided_regex", "guided_choice"}
    | {"regex", "ebnf"}
)
# settings of the engines' own back ends: ignored at these values, refused at any other
NEUTRAL: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "guided_decoding_backend": (),  # any value: it picks vLLM's engine, ours is llguidance
        "guided_whitespace_pattern": (None,),
        "structured_outputs.backend": (),
        "structured_outputs.disable_fallback": (None, False, True),
        "structured_outputs.disable_any_whitespace": (None, False),
        "structured_outputs.disable_additional_properties": (None, False),
        "structured_outputs.whitespace_pattern": (None,),
        "structured_outputs.structural_tag": (None,),
    }
)


def _text(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise FieldError(field, f"{field} is a non-empty string")
    return value


def _choice(field: str, value: Any) -> Constraint:
    """One of the given strings, exactly (as vLLM's ``guided_choice``)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise FieldError(field, f"{field} is a non-empty list of non-empty strings")
    # Lark strings are JSON strings
    alternatives = " | ".join(json.dumps(v, ensure_ascii=False) for v in dict.fromkeys(value))
    return Constraint("lark", f"start: {alternatives}\n", field)


def _schema(field: str, value: Any) -> Constraint:
    if not isinstance(value, dict | bool | str):
        raise FieldError(field, f"{field} is a JSON schema (an object, or its JSON text)")
    return json_schema(value, field)


def _neutral(field: str, value: Any) -> None:
    allowed = NEUTRAL[field]
    if allowed and value not in allowed:
        raise FieldError(field, f"{field} is not supported by specdec serve")


def _from(field: str, value: Any) -> Constraint | None:
    """The constraint one field asks for (None: a neutral setting)."""
    if field in ("grammar", "guided_grammar", "ebnf", "structured_outputs.grammar"):
        return grammar_constraint(_text(field, value), field)
    if field in ("regex", "guided_regex", "structured_outputs.regex"):
        return Constraint("regex", _text(field, value), field)
    if field in ("json_schema", "guided_json", "structured_outputs.json"):
        return _schema(field, value)
    if field in ("guided_choice", "structured_outputs.choice"):
        return _choice(field, value)
    if field == "structured_outputs.json_object":
        if value not in (None, False, True):
            raise FieldError(field, f"{field} is true or false")
        return Constraint("json_object", "", field) if value else None
    if field in NEUTRAL:
        _neutral(field, value)
        return None
    raise FieldError(field, f"{field} is not supported by specdec serve")


def engine_constraints(extra: Mapping[str, Any]) -> list[Constraint]:
    """The constraints a request's extra fields ask for in other engines' names (module
    docstring), in the order given; FieldError naming a field that is wrong."""
    fields: list[tuple[str, Any]] = []
    for name, value in extra.items():
        if name == "structured_outputs":
            if value is None:
                continue
            if not isinstance(value, dict):
                raise FieldError(name, f"{name} is an object ({', '.join(_STRUCTURED)})")
            fields += [(f"{name}.{k}", v) for k, v in value.items() if v is not None]
        elif (name in TOP_LEVEL or name in NEUTRAL) and value is not None:
            fields.append((name, value))
    out: list[Constraint] = []
    for field, value in fields:
        try:
            c = _from(field, value)
        except ConstraintError as e:
            raise FieldError(e.field, str(e)) from e
        if c is not None:
            out.append(c)
    return out
