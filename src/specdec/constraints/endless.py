"""Grammars and schemas that can never end: no finite output satisfies them, so a model under
them can only run to ``max_tokens``. The grammar engine (llguidance) has no emptiness check of
its own: ``start: x`` / ``x: "a" x`` passes its first mask (an ``a`` is allowed, forever), and
so does a schema whose required property is the schema itself. This module finds them before
generation, with a productivity fixpoint (a rule is productive when one of its expansions uses
only productive parts), in two pure functions:

- ``lark_never_ends(text)``: over the rules of a Lark grammar in llguidance's dialect (GBNF is
  converted to it first);
- ``schema_never_ends(schema)``: over a JSON schema's ``$ref`` targets, through what an
  instance must contain (required properties, ``minItems`` items, ``allOf``, ``anyOf``).

Both are sound, not complete: they say "never ends" only when it is proved, and anything they
do not model (regular-expression emptiness, negation, parametric rules, nested ``%lark``,
non-local ``$ref``, a schema without ``type``, which also admits numbers) counts as able to
end. A grammar they cannot read returns None too: the engine reports its syntax errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

MAX_WORK = 5_000_000  # fixpoint work (re-evaluations x body size) beyond which no verdict
MAX_NAMES = 5  # rule names an error lists


class Unreadable(ValueError):
    """A grammar this module's reader does not follow (the engine judges it)."""


def _fixpoint(
    bodies: dict[str, Any],
    deps: dict[str, set[str]],
    sizes: dict[str, int],
    good: Callable[[Any, Callable[[str], bool]], bool],
) -> dict[str, bool] | None:
    """The least fixpoint of ``good`` over named bodies: name -> can end. A body is
    re-evaluated only when one of ``deps`` (the names it uses) became able to end; None when
    that work could pass ``MAX_WORK`` (a huge grammar is left to the engine's own bounds)."""
    if sum((1 + len(deps[k])) * sizes[k] for k in bodies) > MAX_WORK:
        return None
    users: dict[str, list[str]] = {k: [] for k in bodies}
    for k, used in deps.items():
        for d in used:
            if d in users:
                users[d].append(k)
    ends = dict.fromkeys(bodies, False)

    def known(name: str) -> bool:
        return ends.get(name, True)  # a name defined elsewhere: the engine's to judge

    todo = list(bodies)
    while todo:
        k = todo.pop()
        if not ends[k] and good(bodies[k], known):
            ends[k] = True
            todo.extend(u for u in users[k] if not ends[u])
    return ends


def _stuck(ends: dict[str, bool]) -> str:
    stuck = [n for n, ok in ends.items() if not ok]
    more = f" and {len(stuck) - MAX_NAMES} more" if len(stuck) > MAX_NAMES else ""
    return ", ".join(stuck[:MAX_NAMES]) + more


# -- Lark, as llguidance lexes it -----------------------------------------------------------

# JSON string syntax (\x escapes too), then the case-insensitive flag
_STRING = r'"(?:\\(?:["\\/bfnrt]|u[a-fA-F0-9]{4}|x[a-fA-F0-9]{2})|[^"\\\x00-\x1F\x7F])*"i?'
_TOKEN_RES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx))
    for kind, rx in (
        ("skip", r"(?:#|//)[^\n]*|[ \t]+"),
        ("nl", r"(?:\r?\n)+[ \t]*"),
        ("kw", r"%[a-z]+"),
        ("string", _STRING),
        ("regexp", r"/(?:\\.|[^/\\])+/[imslux]*"),
        ("hex", r"0[xX][0-9a-fA-F]+"),
        ("number", r"[+-]?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"),
        ("special", r"<[^<>\s]+>"),
        ("ref", r"@[a-zA-Z0-9_\-]+"),
        ("rule", r"!?[_?]?[a-z][_a-z0-9\-]*"),
        ("token", r"_?[A-Z][_A-Z0-9\-]*"),
        ("op", r"[+*?]"),
        ("punct", r"->|::|\.\.|[:,.(){}\[\]~|&=_]"),
    )
)


@dataclass(frozen=True)
class _Lexeme:
    kind: str
    text: str
    value: Any = None  # the JSON after %json / %regex / %llguidance


def _lex(text: str) -> list[_Lexeme]:
    out: list[_Lexeme] = []
    pos, decoder = 0, json.JSONDecoder()
    while pos < len(text):
        kind, m = next(
            ((k, m) for k, rx in _TOKEN_RES if (m := rx.match(text, pos)) and m.end() > pos),
            ("", None),
        )
        if m is None:
            raise Unreadable(f"unexpected {text[pos]!r}")
        pos = m.end()
        if kind == "skip":
            continue
        word = m.group()
        if kind == "kw" and word in ("%json", "%regex", "%llguidance"):
            start = pos
            while start < len(text) and text[start] in " \t\r\n":
                start += 1
            try:
                value, pos = decoder.raw_decode(text, start)
            except ValueError as e:
                raise Unreadable(f"{word} is not followed by JSON") from e
            out.append(_Lexeme(kind, word, value))
            continue
        out.append(_Lexeme(kind, word))
    return out


# an expansion tree: ("alt", [seq...]), ("seq", [node...]), ("name", str), ("opt",),
# ("rep", node, low) for + and ~n.. and {n,m}, ("all", [seq...]) for & conjuncts, ("schema", obj),
# ("end",) for anything that can end (strings, regexps, tokens of the vocabulary, negation)
Node = tuple[Any, ...]
_STOP = frozenset({"nl", "|", "->", "}", ")", "]", "&"})


class _Reader:
    def __init__(self, lexemes: list[_Lexeme]) -> None:
        self.lx = lexemes
        self.pos = 0

    def peek(self, ahead: int = 0) -> _Lexeme | None:
        i = self.pos + ahead
        return self.lx[i] if i < len(self.lx) else None

    def key(self, ahead: int = 0) -> str:
        lx = self.peek(ahead)
        if lx is None:
            return "eof"
        return lx.text if lx.kind == "punct" else lx.kind

    def take(self, key: str) -> _Lexeme:
        lx = self.peek()
        if lx is None or self.key() != key:
            raise Unreadable(f"expected {key}")
        self.pos += 1
        return lx

    def grammar(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        while self.peek() is not None:
            if self.key() == "nl":
                self.pos += 1
                continue
            lx = self.peek()
            assert lx is not None
            if lx.kind in ("rule", "token"):
                name, body = self.definition()
                if name in rules:  # alternatives given twice: either may end
                    body = ("alt", [("seq", [rules[name]]), ("seq", [body])])
                rules[name] = body
            elif lx.kind == "kw" and lx.text == "%override":
                self.pos += 1
                name, body = self.definition()
                rules[name] = body
            else:  # %ignore, %import, %declare, %llguidance: nothing a rule needs
                while self.peek() is not None and self.key() != "nl":
                    self.pos += 1
        return rules

    def definition(self) -> tuple[str, Node]:
        head = self.peek()
        assert head is not None
        self.pos += 1
        name = head.text.lstrip("!?")
        if self.key() == "::":
            raise Unreadable("parametric rule")
        if self.key() == "{":
            raise Unreadable("template rule")
        if self.key() == ".":
            self.pos += 2  # a priority
        bounded = False
        if self.key() == "[":  # attributes (max_tokens, stop, ...): the engine ends it
            bounded = True
            while self.key() not in ("]", "eof"):
                self.pos += 1
            self.take("]")
        self.take(":")
        body = self.expansions()
        if self.key() not in ("nl", "eof"):
            raise Unreadable(f"unexpected {self.key()}")
        return name, (("end",) if bounded else body)

    def expansions(self) -> Node:
        alts = [self.alias()]
        while True:
            if self.key() == "|":
                self.pos += 1
            elif self.key() == "nl" and self.key(1) == "|":
                self.pos += 2
            else:
                break
            alts.append(self.alias())
        return ("alt", alts)

    def alias(self) -> Node:
        conjuncts = [self.expansion()]
        while self.key() == "&":
            self.pos += 1
            conjuncts.append(self.expansion())
        if self.key() == "->":
            self.pos += 1
            self.take("rule")
        return conjuncts[0] if len(conjuncts) == 1 else ("all", conjuncts)

    def expansion(self) -> Node:
        items: list[Node] = []
        while self.key() not in _STOP and self.key() != "eof":
            items.append(self.expr())
        return ("seq", items)

    def expr(self) -> Node:
        atom = self.atom()
        key = self.key()
        if key == "op":
            op = self.take("op").text
            return ("rep", atom, 1) if op == "+" else ("opt",)
        if key == "~" and self.key(1) == "number":
            self.pos += 1
            low = int(self.take("number").text)
            if self.key() == "..":
                self.pos += 1
                self.take("number")
            return ("rep", atom, low)
        if key == "{":
            self.pos += 1
            low = 0 if self.key() == "," else int(self.take("number").text)
            while self.key() not in ("}", "eof"):
                self.pos += 1
            self.take("}")
            return ("rep", atom, low)
        return atom

    def atom(self) -> Node:
        if self.key() == "~":  # negation: what it leaves is not analysed
            self.pos += 1
            self.atom()
            return ("end",)
        if self.key() == "(":
            self.pos += 1
            inner = self.expansions()
            self.take(")")
            return inner
        if self.key() == "[":
            self.pos += 1
            self.expansions()
            self.take("]")
            return ("opt",)
        lx = self.peek()
        if lx is None:
            raise Unreadable("a value expected")
        self.pos += 1
        if lx.kind == "string":
            if self.key() == "..":
                self.pos += 1
                self.take("string")
            return ("end",)
        if lx.kind in ("regexp", "special", "ref"):
            return ("end",)
        if lx.kind == "kw" and lx.text == "%json":
            return ("schema", lx.value)
        if lx.kind == "kw" and lx.text == "%regex":
            return ("end",)
        if lx.kind == "kw" and lx.text == "%lark":
            raise Unreadable("nested %lark")
        if lx.kind in ("rule", "token"):
            if self.key() == "::":
                raise Unreadable("parametric rule")
            if self.key() == "{" and self.key(1) not in (",", "number"):
                raise Unreadable("template use")
            return ("name", lx.text)
        raise Unreadable(f"unexpected {lx.text!r}")


def _productive(node: Node, known: Callable[[str], bool]) -> bool:
    kind = node[0]
    if kind == "alt":
        return any(_productive(n, known) for n in node[1])
    if kind in ("seq", "all"):
        return all(_productive(n, known) for n in node[1])
    if kind == "name":
        return known(node[1])
    if kind == "rep":
        return node[2] <= 0 or _productive(node[1], known)
    if kind == "schema":
        return schema_never_ends(node[1]) is None
    return True  # "end", "opt"


def _walk(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n[0] in ("alt", "seq", "all"):
            stack.extend(n[1])
        elif n[0] == "rep":
            stack.append(n[1])


def lark_never_ends(text: str, start: str = "start") -> str | None:
    """Why a Lark grammar (llguidance's dialect) has no finite output, or None when it has one
    or this reader does not follow it (module docstring)."""
    try:
        rules = _Reader(_lex(text)).grammar()
    except (Unreadable, ValueError, IndexError, RecursionError):
        return None
    if start not in rules:
        return None
    deps: dict[str, set[str]] = {}
    sizes: dict[str, int] = {}
    for name, body in rules.items():
        nodes = list(_walk(body))
        deps[name] = {n[1] for n in nodes if n[0] == "name"}
        sizes[name] = len(nodes) + sum(len(json.dumps(n[1])) for n in nodes if n[0] == "schema")
    try:
        ends = _fixpoint(rules, deps, sizes, _productive)
    except RecursionError:
        return None
    if ends is None or ends[start]:
        return None
    return (
        f"the grammar can never end: every expansion of {start!r} needs a rule that never "
        f"ends ({_stuck(ends)})"
    )


# -- JSON schema -------------------------------------------------------------------------------


def _pointer(root: Any, ref: str) -> Any:
    """The node a local ``$ref`` ("#", "#/$defs/x") names, or None (not local, or absent)."""
    if not ref.startswith("#"):
        return None
    node = root
    path = unquote(ref[1:])
    if not path:
        return node
    if not path.startswith("/"):
        return None  # an anchor
    for part in path[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _json_nodes(node: Any) -> Iterator[Any]:
    """Every value inside a JSON document, ``node`` included."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, dict):
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def _refs(node: Any) -> Iterator[str]:
    for n in _json_nodes(node):
        if isinstance(n, dict) and isinstance(n.get("$ref"), str):
            yield n["$ref"]


def _instance(node: Any, ok: Callable[[str], bool]) -> bool:
    """Whether ``node`` may have a finite instance, given ``ok`` for local references."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and not ok(ref):
        return False
    all_of = node.get("allOf")
    if isinstance(all_of, list) and not all(_instance(n, ok) for n in all_of):
        return False
    for key in ("anyOf", "oneOf"):
        some = node.get(key)
        if isinstance(some, list) and some and not any(_instance(n, ok) for n in some):
            return False
    if "enum" in node or "const" in node:
        return True
    kinds = node.get("type")
    if isinstance(kinds, str):
        kinds = [kinds]
    if not isinstance(kinds, list) or not kinds:
        return True  # no type: a number will do
    return any(_of_type(node, k, ok) for k in kinds)


def _of_type(node: dict[str, Any], kind: Any, ok: Callable[[str], bool]) -> bool:
    if kind == "object":
        props = node.get("properties")
        props = props if isinstance(props, dict) else {}
        required = node.get("required")
        for name in required if isinstance(required, list) else []:
            if isinstance(name, str) and name in props:
                if not _instance(props[name], ok):
                    return False
            elif isinstance(name, str) and not node.get("patternProperties"):
                extra = node.get("additionalProperties", True)
                if not _instance(extra, ok):
                    return False
        return True
    if kind == "array":
        low = node.get("minItems", 0)
        if not isinstance(low, int) or isinstance(low, bool) or low <= 0:
            return True
        prefix = node.get("prefixItems")
        items = node.get("items")
        rest = items
        if isinstance(items, list):  # drafts before 2020-12: items is the prefix
            prefix, rest = items, node.get("additionalItems", True)
        prefix = prefix if isinstance(prefix, list) else []
        if not all(_instance(p, ok) for p in prefix[:low]):
            return False
        return low <= len(prefix) or _instance(True if rest is None else rest, ok)
    return True


def schema_never_ends(schema: Any) -> str | None:
    """Why a JSON schema admits no finite JSON value through its local ``$ref`` cycles, or None
    (module docstring: only what is proved)."""
    nodes: dict[str, Any] = {}
    for ref in sorted(set(_refs(schema))):
        node = _pointer(schema, ref)
        if node is not None:
            nodes[ref] = node
    deps = {ref: set(_refs(node)) for ref, node in nodes.items()}
    sizes = {ref: sum(1 for _ in _json_nodes(node)) for ref, node in nodes.items()}
    try:
        ends = _fixpoint(nodes, deps, sizes, _instance)
        if ends is None:
            return None
        if _instance(schema, lambda ref: ends.get(ref, True)):
            return None
    except RecursionError:
        return None
    return (
        f"the schema admits no finite JSON value: its required properties or minItems "
        f"always lead back to {_stuck(ends) or 'the schema'}"
    )
