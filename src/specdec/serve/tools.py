"""Tools (OpenAI function calling) through the model's own chat template.

The request's ``tools`` go to the template as its ``tools`` variable (as transformers and
llama-server's ``--jinja`` pass them), so the model sees them the way it was trained to. The
output is then read in the template's tool-call format. One format is parsed: Hermes-style
calls, which Qwen2.5's template (the default models') asks for::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that does not mention ``<tool_call>`` is refused with a 400 naming ``tools`` (its
calls could not be read back). The calls are constrained by a grammar (``specdec.constraints``,
so draft and target are masked alike and the output keeps plain decoding's distribution):
each call's name is one of the tools', its arguments follow the tool's ``parameters`` schema.
``tool_choice``: ``auto`` lets the model write text and makes the grammar start at the
``<tool_call>`` token (a lazy constraint: free text until it); ``required`` and a named function
make the output one or more calls from its first token (only the named function's);
``none`` renders no tools and constrains nothing. ``parallel_tool_calls: false`` allows one
call. With ``response_format`` json too, ``auto`` allows either calls or the JSON value.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from specdec.constraints.engine import JSON_WHITESPACE
from specdec.constraints.spec import Constraint, ConstraintError
from specdec.serve.errors import FieldError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: its id, the function's name and its arguments' JSON text."""

    id: str
    name: str
    arguments: str

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


def check_template(template: str | None) -> None:
    """A FieldError naming ``tools`` unless ``template`` writes Hermes-style tool calls."""
    if not template:
        raise FieldError("tools", "tools need the model's chat template; this model has none")
    if OPEN not in template:
        raise FieldError(
            "tools",
            "this model's chat template has no tool-call format specdec reads (supported: "
            "Hermes-style <tool_call> JSON, as Qwen2.5's); tools are refused for it",
        )


# keywords whose values are data, not schemas: a "$ref" inside them is not a reference
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def rebased(schema: Any, prefix: str) -> Any:
    """``schema`` with its local references (``#``, ``#/$defs/x``) pointing into it where it
    now sits, at the JSON pointer ``prefix`` of a larger schema: a tool's parameters as
    pydantic writes them (``$defs`` beside ``properties``) inside the call's schema."""
    if isinstance(schema, list):
        return [rebased(s, prefix) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = "#" + prefix + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in ("properties", "patternProperties", "$defs", "definitions"):
            # maps from names to schemas: a property called "enum" is still a schema
            out[key] = (
                {k: rebased(v, prefix) for k, v in value.items()}
                if isinstance(value, dict)
                else value
            )
        else:
            out[key] = rebased(value, prefix)
    return out


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one call to one of ``tools`` (OpenAI function definitions); each
    tool's ``parameters`` keep their local references (``rebased``)."""
    where = [
        "/properties/arguments" if len(tools) == 1 else f"/anyOf/{i}/properties/arguments"
        for i in range(len(tools))
    ]
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["name"]},
                "arguments": rebased(t.get("parameters") or {"type": "object"}, at),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t, at in zip(tools, where, strict=True)
    ]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE, "lenient": False}}


def tool_constraint(
    functions: list[dict[str, Any]],
    choice: str,
    parallel: bool,
    response_schema: dict[str, Any] | bool | None = None,
) -> Constraint | None:
    """The grammar of the calls ``choice`` allows (``auto``, ``required`` or a function's
    name; ``none`` gives None). ``response_schema``: the response format's schema, which
    ``auto`` allows instead of calls. A ConstraintError naming ``tools`` for a schema that
    is not JSON."""
    if choice == "none":
        return None
    named = [f for f in functions if choice in ("auto", "required") or f["name"] == choice]
    if not named:
        raise ConstraintError("tool_choice", f"tool_choice names {choice!r}, not one of the tools")
    try:
        call = json.dumps(call_schema(named), ensure_ascii=False, allow_nan=False)
        answer = None
        if response_schema is not None:
            answer = json.dumps(response_schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ConstraintError("tools", f"a tool's parameters are not JSON ({e})") from e
    calls = "call" + (' ("\\n" call)*' if parallel else "")
    lines = [
        f"calls: {calls}",
        f'call: "{OPEN}\\n" %json {call} "\\n{CLOSE}"',
    ]
    if choice == "auto" and answer is not None:
        lines += [f"answer: %json {answer}"]
        return Constraint("lark", "\n".join(["start: calls | answer", *lines]) + "\n", "tools")
    grammar = "\n".join(["start: calls", *lines]) + "\n"
    return Constraint("lark", grammar, "tools", OPEN if choice == "auto" else None)


def parse_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """(the content before the first call or None, the calls) of an output in the Hermes
    format; an output whose calls do not all parse (cut at max_tokens) is all content."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    calls: list[ToolCall] = []
    for m in _CALL.finditer(text, start):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return text, []
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            return text, []
        arguments = obj.get("arguments", {})
        calls.append(
            ToolCall(
                f"call_{secrets.token_hex(12)}",
                obj["name"],
                json.dumps(arguments, ensure_ascii=False),
            )
        )
    rest = _CALL.sub("", text[start:]).strip()
    if not calls or rest:
        return text, []
    content = text[:start].strip()
    return content or None, calls


class CallSplitter:
    """Streamed text split into content (sent as it comes, holding back what may be the
    start of ``<tool_call>``) and the calls after it (sent at the end, parsed)."""

    def __init__(self) -> None:
        self.sent = ""  # content already sent
        self.text = ""  # all text so far

    def feed(self, piece: str) -> str:
        """The content that can be sent now."""
        self.text += piece
        at = self.text.find(OPEN)
        if at >= 0:
            safe = at
        else:
            safe = len(self.text)
            for n in range(min(len(OPEN) - 1, len(self.text)), 0, -1):
                if OPEN.startswith(self.text[-n:]):
                    safe = len(self.text) - n
                    break
        out = self.text[len(self.sent) : max(safe, len(self.sent))]
        self.sent += out
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not sent yet, the calls) at the end of the output."""
        _, calls = parse_calls(self.text)
        end = self.text.find(OPEN) if calls else len(self.text)
        return self.text[len(self.sent) : end], calls


def message_for_template(m: Any) -> dict[str, Any]:
    """A chat message as the template reads it: an assistant's ``tool_calls`` with their
    arguments as objects (Qwen2.5's template writes them with ``tojson``), a tool result
    with its ``tool_call_id``; content None as ""."""
    role = "system" if m.role == "developer" else m.role
    out: dict[str, Any] = {"role": role, "content": m.text()}
    if m.tool_calls:
        calls = []
        for i, c in enumerate(m.tool_calls):
            try:
                arguments: Any = json.loads(c.function.arguments or "{}")
            except ValueError as e:
                raise FieldError(
                    "messages", f"tool_calls[{i}].function.arguments is not JSON ({e})"
                ) from e
            calls.append(
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": arguments},
                }
            )
        out["tool_calls"] = calls
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def request_constraint(req: Any, template: str | None) -> Constraint | None:
    """The output's constraint of a chat request (``schemas.ChatRequest``): the tools' (and
    the response format's, under ``auto``) when it has tools and ``tool_choice`` is not
    ``none``, else the response format's; FieldError / ConstraintError naming the field."""
    choice = req.choice()
    if not req.tools or choice == "none":
        return req.constraint()
    check_template(template)
    functions = [t.function.model_dump(exclude_none=True) for t in req.tools]
    answer: dict[str, Any] | bool | None = None
    shape = req.constraint()
    if shape is not None and choice == "auto":
        if shape.kind not in ("json_object", "json_schema"):
            raise FieldError(
                shape.field,
                f"{shape.field}: with tools under tool_choice auto the answer's constraint is a "
                "JSON one (response_format json_object or json_schema)",
            )
        answer = {"type": "object"} if shape.kind == "json_object" else json.loads(shape.source)
        if isinstance(answer, dict):
            answer = {**answer, "x-guidance": call_schema(functions)["x-guidance"]}
    return tool_constraint(functions, choice, req.parallel_tool_calls, answer)


def template_tools(req: Any) -> list[dict[str, Any]] | None:
    """The ``tools`` template variable of a chat request (None: no tools rendered)."""
    if not req.tools or req.choice() == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]
