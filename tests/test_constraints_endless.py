"""Grammars and schemas that can never end (``specdec.constraints.endless``): proved
non-terminating ones are refused with one line, and everything that can end, or that the
reader does not follow, is left to the engine. Schemas come hand-written and from pydantic
models (recursive ones with an empty case must pass; a model that needs itself must not). The
grammar engine itself has no such check: each refused case here passes its first mask."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from specdec.constraints import endless
from specdec.constraints.endless import lark_never_ends, schema_never_ends

NEVER = [
    'start: x\nx: "a" x\n',
    'start: "a" start\n',
    'start: x+\nx: "a" x\n',
    'start: x ~ 2\nx: "a" x | y\ny: x "b"\n',
    'start: (x | y) "c"\nx: "a" y\ny: "b" x\n',
    'start: x{1,3}\nx: "a" x\n',
    'start: x\n    | y\nx: "a" x\ny: x\n',
    "start: a & b\na: /[a-z]+/\nb: b",
    '%llguidance {}\n// a comment\nstart: item\n?item: "(" item ")"  # nested forever\n',
    'start: "<" %json {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}',
]

ENDS = [
    'start: x | "b"\nx: "a" x\n',
    'start: x*\nx: "a" x\n',
    'start: [x] "c"\nx: "a" x\n',
    'start: x ~ 0..3\nx: "a" x\n',
    'start: x{,3}\nx: "a" x\n',
    'start: x\n    | "b"\nx: "a" x\n',
    "start: x\nx: y\ny: COMMON\n%import common.WORD -> COMMON\n",
    'start: x\nx[max_tokens=5]: "a" x\n',
    "start: x\nx: ~x\n",
    'start: "a" undefined_elsewhere\n',
    'start: %json {"type": "object", "properties": {"a": {"$ref": "#"}}}',
    'start: TOK\nTOK: /[0-9]+/ | "x" TOK\n',
    'start: item+\nitem: "ab" | "c" | "d" "e"?\n',
]

UNREAD = [
    'start: perm::0x0\nperm::_: "X" %if is_ones([0:3])\n    | "a" perm::set_bit(0)\n',
    'start: foo\nfoo: %lark { start: foo\nfoo: "a" foo }\n',
    "start: (((",
    "",
    'start: "unterminated\n',
]


@pytest.mark.parametrize("grammar", NEVER)
def test_a_grammar_that_can_never_end_is_named(grammar: str) -> None:
    said = lark_never_ends(grammar)
    assert said is not None and "\n" not in said
    assert said.startswith("the grammar can never end: every expansion of 'start' needs")


@pytest.mark.parametrize("grammar", ENDS)
def test_a_grammar_that_can_end_passes(grammar: str) -> None:
    assert lark_never_ends(grammar) is None


@pytest.mark.parametrize("grammar", UNREAD)
def test_a_grammar_the_reader_does_not_follow_is_left_to_the_engine(grammar: str) -> None:
    assert lark_never_ends(grammar) is None


def test_a_long_chain_is_decided_either_way_and_names_at_most_five_rules() -> None:
    # defined in the order that made a plain sweep take one pass per rule
    chain = "".join(f'r{i}: r{i + 1} "a"\n' for i in range(3000))
    assert lark_never_ends("start: r0\n" + chain + 'r3000: "end"\n') is None
    said = lark_never_ends("start: r0\n" + chain + "r3000: r0\n")
    assert said is not None and said.endswith("and 2997 more)")


def test_past_the_work_bound_there_is_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endless, "MAX_WORK", 1)
    assert lark_never_ends(NEVER[0]) is None
    assert schema_never_ends({"type": "array", "items": {"$ref": "#"}, "minItems": 1}) is None


def obj(required: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": required, "required": list(required), **more}


SELF = {"$ref": "#"}
NODE = {"$ref": "#/$defs/Node"}
SCHEMAS_NEVER: list[Any] = [
    obj({"me": SELF}),
    {"type": "array", "items": SELF, "minItems": 1},
    {"type": "array", "prefixItems": [{"type": "integer"}, SELF], "minItems": 2},
    {"type": "array", "items": [SELF], "minItems": 1},  # draft-07 tuple form
    {"$defs": {"Node": obj({"next": NODE})}, **NODE},  # pydantic: class Node: next: "Node"
    {"$defs": {"A": obj({"b": {"$ref": "#/$defs/B"}}), "B": obj({"a": {"$ref": "#/$defs/A"}})}}
    | {"$ref": "#/$defs/A"},
    {"anyOf": [obj({"x": SELF}), {"type": "array", "items": SELF, "minItems": 3}]},
    {"allOf": [{"type": "object"}, obj({"x": SELF})]},
    {"type": "object", "required": ["x"], "additionalProperties": SELF},
    obj({"x": False}),
]
SCHEMAS_END: list[Any] = [
    obj({"me": {"anyOf": [SELF, {"type": "null"}]}}),
    {"type": "array", "items": SELF},  # [] ends it
    {**obj({"me": SELF}), "type": ["object", "null"]},
    {"properties": {"me": SELF}, "required": ["me"]},  # no type: a number will do
    {"$defs": {"Node": obj({"children": {"type": "array", "items": NODE}})}, **NODE},
    obj({"me": SELF}, enum=[{"me": None}]),
    {"type": "object", "required": ["x"], "patternProperties": {".*": SELF}},
    obj({"me": {"$ref": "https://example.com/other.json"}}),
    obj({"me": {"$ref": "#/$defs/missing"}}),
    {"type": "array", "items": SELF, "minItems": 0},
    True,
    {},
]


@pytest.mark.parametrize("schema", SCHEMAS_NEVER)
def test_a_schema_with_no_finite_value_is_named(schema: Any) -> None:
    said = schema_never_ends(schema)
    assert said is not None and said.startswith("the schema admits no finite JSON value")


@pytest.mark.parametrize("schema", SCHEMAS_END)
def test_a_schema_with_a_finite_value_passes(schema: Any) -> None:
    assert schema_never_ends(schema) is None


def test_a_pointer_with_escapes_is_followed() -> None:
    schema = {
        "$defs": {"a/b~c": obj({"x": {"$ref": "#/$defs/a~1b~0c"}})},
        "$ref": "#/$defs/a~1b~0c",
    }
    assert schema_never_ends(schema) is not None


class Tree(pydantic.BaseModel):
    value: int
    children: list[Tree]  # [] ends it


class Chain(pydantic.BaseModel):
    head: int
    tail: Chain | None  # null ends it


class Loop(pydantic.BaseModel):
    next: Loop  # no instance is finite


class There(pydantic.BaseModel):
    back: Back


class Back(pydantic.BaseModel):
    there: There


def test_pydantic_models_are_judged_by_whether_an_instance_can_be_finite() -> None:
    for model in (Tree, Chain, Back):
        model.model_rebuild()
    assert schema_never_ends(Tree.model_json_schema()) is None
    assert schema_never_ends(Chain.model_json_schema()) is None
    for model in (Loop, There):
        said = schema_never_ends(model.model_json_schema())
        assert said is not None and "#/$defs/" in said
