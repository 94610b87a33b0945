"""OpenAI's Responses API (``POST /v1/responses``) over the chat machinery.

A Responses request is read as the chat request it stands for (``chat_request``):
``instructions`` is a system message; ``input`` a user message, or its items as messages (a
``message`` item with text content a message of its role, ``developer`` included; a
``function_call`` item an assistant tool call, joined to the assistant message before it; a
``function_call_output`` item a ``role: "tool"`` message); function tools are chat tools,
``tool_choice`` and ``parallel_tool_calls`` the chat ones, ``text.format`` is
``response_format``, ``max_output_tokens`` is ``max_tokens``, and the include
``message.output_text.logprobs`` (or ``top_logprobs``) is chat's ``logprobs``. The route then
takes the chat route's own path (admission, size bounds, tokenizing in the tokenizer's turn,
the constraint, the engine's queue), so the output is the chat route's, token for token; only
the wire shape differs: ``response_body`` (one response object) and ``response_events`` (the
typed server-sent events). Errors name the Responses API's fields (``responses_names``:
``input``, ``text.format``, ``max_output_tokens``, ``tools[0].name``).

Nothing is stored: ``previous_response_id``, ``conversation``, a stored ``prompt``,
``background`` are refused with a 400 naming them, as are input items, content parts and tools
of other kinds (images, files, reasoning items, built-in tools such as web search).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from specdec.core.result import GenerationResult
from specdec.serve.engine import Failed, Finished, Job
from specdec.serve.errors import APIError, FieldError, validation_error
from specdec.serve.generation import ChoiceResult, Piece, openai_finish_reason, timings, usage
from specdec.serve.logprobs import WireToken, chat_shape
from specdec.serve.schemas import ChatRequest, ResponsesRequest
from specdec.serve.tools import CallSplitter, ToolCall, parse_calls, template_tools

LOGPROBS_INCLUDE = "message.output_text.logprobs"
TEXT_PARTS = frozenset({"input_text", "output_text"})
ROLES = frozenset({"user", "system", "developer", "assistant"})
# fields that ask for what specdec serve does not do, and their neutral values
REFUSED: Mapping[str, tuple[tuple[Any, ...], str]] = MappingProxyType(
    {
        "previous_response_id": (
            (None, ""),
            "specdec serve stores no responses: send the whole conversation as input",
        ),
        "conversation": (
            (None, ""),
            "specdec serve stores no conversations: send the whole conversation as input",
        ),
        "prompt": ((None,), "stored prompt templates are not supported by specdec serve"),
        "background": ((None, False), "background responses are not supported by specdec serve"),
        "truncation": (
            (None, "disabled"),
            "truncation 'auto' is not supported: an input longer than the window is a 400",
        ),
        "max_tool_calls": ((None,), "max_tool_calls is not supported (parallel_tool_calls is)"),
    }
)
# specdec's chat extensions a Responses request may carry too (checked by the chat rules)
EXTENSIONS = (
    "seed",
    "top_k",
    "stop",
    "speculative",
    "speculative.n_max",
    "prediction",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs_mode",
)
# a chat request's field -> the Responses API's (for the errors)
RENAMED = (
    ("messages", "input"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("logprobs", "include"),
)


# -- the request ---------------------------------------------------------------------------------


def chat_request(req: ResponsesRequest) -> ChatRequest:
    """The chat request ``req`` stands for; a FieldError naming the field that is wrong."""
    check_fields(req)
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += input_messages(req.input)
    want_logprobs = LOGPROBS_INCLUDE in (req.include or ()) or bool(req.top_logprobs)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": bool(req.stream),
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "response_format": response_format(req.text),
        "logprobs": want_logprobs,
        "top_logprobs": req.top_logprobs if want_logprobs else None,
    }
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    extra = req.model_extra or {}
    body.update({k: extra[k] for k in EXTENSIONS if k in extra})
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as e:
        raise validation_error(e.errors()) from e


def check_fields(req: ResponsesRequest) -> None:
    """A FieldError for a field that asks for what specdec serve does not do."""
    given = {"previous_response_id": req.previous_response_id, **(req.model_extra or {})}
    for name, (neutral, why) in REFUSED.items():
        if given.get(name) not in neutral:
            raise FieldError(name, f"{name}: {why}")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as chat messages: a text is one user message; items are read in order."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()  # the call ids of the function calls so far
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call_id = _string(item, "call_id", where)
            call = {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            calls.add(call_id)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the message before the call
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if call_id not in calls:
                raise FieldError(
                    f"{where}.call_id",
                    f"{where}: no function_call item before it has call_id {call_id!r}",
                )
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind is None:
            raise FieldError(where, f"{where}: an input item needs a type or a role")
        else:
            raise FieldError(
                f"{where}.type",
                f"{where}: input items of type {str(kind)[:40]!r} are not supported by specdec "
                "serve (message, function_call and function_call_output are)",
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise FieldError(
            f"{where}.role", f"{where}.role must be one of user, system, developer, assistant"
        )
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise FieldError(f"{where}.{key}", f"{where}.{key} is required (a string)")
    return value


def _text(content: Any, where: str) -> str:
    """A content's text: a string, or text parts (``input_text`` / ``output_text``) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(where, f"{where} must be a string or a list of text parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise FieldError(
                f"{where}[{j}].type",
                f"{where}[{j}]: content of type {str(kind)[:40]!r} is not supported by specdec "
                "serve (text only: input_text, output_text)",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise FieldError(f"{where}[{j}].text", f"{where}[{j}].text is required (a string)")
        out.append(text)
    return "".join(out)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (``{type, name, description, parameters, strict}``) as chat
    tools; any other kind of tool is a FieldError naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise FieldError(
                f"tools[{i}].type",
                f"tools[{i}]: tools of type {str(kind)[:40]!r} are not supported by specdec "
                "serve (function tools are)",
            )
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``none`` / ``auto`` / ``required`` / ``{type: function, name}`` as chat's tool_choice."""
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise FieldError(
                "tool_choice", "tool_choice must be none, auto, required or a function"
            )
        return choice
    if choice.get("type") != "function":
        raise FieldError(
            "tool_choice.type",
            f"tool_choice of type {str(choice.get('type'))[:40]!r} is not supported by specdec "
            "serve (none, auto, required or {type: function, name})",
        )
    name = choice.get("name")
    if not isinstance(name, str):
        raise FieldError("tool_choice.name", "tool_choice.name is required (a string)")
    return {"type": "function", "function": {"name": name}}


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None: free text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise FieldError("text.format", "text.format must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise FieldError(
            "text.format.type", "text.format.type must be text, json_object or json_schema"
        )
    if "schema" not in fmt:
        raise FieldError("text.format.schema", "a json_schema text format needs schema")
    schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def responses_name(param: str) -> str:
    """A chat request's field as the Responses API names it (``messages[2]`` -> ``input``)."""
    for old, new in RENAMED:
        if param == old or param.startswith((old + ".", old + "[")):
            return new if old == "messages" else new + param[len(old) :]
    if param.startswith(("tools[", "tool_choice.")):
        return param.replace(".function", "", 1)  # chat's tools[0].function.name: tools[0].name
    return param


@contextmanager
def responses_names() -> Iterator[None]:
    """Errors raised inside name the Responses API's fields, not the chat request's."""
    try:
        yield
    except APIError as e:
        if e.param is not None:
            new = responses_name(e.param)
            if e.message.startswith(e.param + ":"):
                e.message = new + e.message[len(e.param) :]
                e.args = (e.message,)
            e.param = new
        raise


# -- the response ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResponseFrame:
    """What a response says beside its output: its ids (fixed before the generation, so that
    streamed items and the final object name the same ones), what it echoes of its request,
    whether its output is read for tool calls, whether log-probabilities were asked for."""

    id: str
    created_at: int
    message_id: str
    echo: dict[str, Any]
    tools: bool
    logprobs: bool
    n_prompt: int

    @classmethod
    def of(
        cls, req: ResponsesRequest, chat: ChatRequest, model: str, n_prompt: int
    ) -> ResponseFrame:
        echo = {
            "model": model,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "parallel_tool_calls": chat.parallel_tool_calls,
            "previous_response_id": None,
            "temperature": chat.temperature,
            "top_p": chat.top_p,
            "top_logprobs": req.top_logprobs,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": [{"strict": True, **t} for t in req.tools or []],
            "truncation": "disabled",
            "user": req.user,
            "store": False,  # nothing is stored, whatever the request said
        }
        return cls(
            id=f"resp_{secrets.token_hex(16)}",
            created_at=int(time.time()),
            message_id=f"msg_{secrets.token_hex(16)}",
            echo=echo,
            tools=template_tools(chat) is not None,
            logprobs=chat.logprobs,
            n_prompt=n_prompt,
        )

    def envelope(
        self,
        status: str,
        output: list[dict[str, Any]],
        result: GenerationResult | None = None,
    ) -> dict[str, Any]:
        """The response object: in progress (no result yet), or finished with ``result``'s
        usage (OpenAI's fields, specdec's statistics beside them) and llama-server's
        ``timings``."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "output": output,
            **self.echo,
            "usage": None,
        }
        if result is not None:
            body["completed_at"] = int(time.time())
            body["usage"] = responses_usage(result, self.n_prompt)
            body["timings"] = timings(result)
        return body


def responses_usage(result: GenerationResult, n_prompt: int) -> dict[str, Any]:
    """OpenAI's Responses usage, with the speculative statistics of chat's beside it and the
    predicted-output counts in ``output_tokens_details``."""
    u = usage(result, n_prompt)
    details = u.pop("completion_tokens_details")
    n_in, n_out, total = u.pop("prompt_tokens"), u.pop("completion_tokens"), u.pop("total_tokens")
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0, **details},
        "total_tokens": total,
        **u,
    }


def message_item(
    item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None
) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    part["logprobs"] = logprobs or []
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def _status(choice: ChoiceResult, calls: Sequence[ToolCall]) -> str:
    """``incomplete`` when the output was cut at max_output_tokens (or the window)."""
    cut = openai_finish_reason(choice.completion.finish_reason) == "length"
    return "incomplete" if cut and not calls else "completed"


def _logprob_rows(tokens: Sequence[WireToken] | None) -> list[dict[str, Any]]:
    return [] if not tokens else list(chat_shape(tokens)["content"])


def response_body(reply: ResponseFrame, choice: ChoiceResult) -> dict[str, Any]:
    """The response object of a finished (non-streamed) request: a message with the text
    before any tool calls (none when the output is calls only), then a function call item
    per call."""
    content, calls = parse_calls(choice.text) if reply.tools else (choice.text, [])
    status = _status(choice, calls)
    output = []
    if content or not calls:
        rows = _logprob_rows(choice.logprobs) if reply.logprobs else None
        output.append(message_item(reply.message_id, content or "", status, rows))
    output += [call_item(c) for c in calls]
    return reply.envelope(status, output, choice.completion.result)


@dataclass
class EventWriter:
    """The Responses stream's events, each with its ``sequence_number``: text deltas as they
    come (with tools, whitespace at the end of the text is held back until more text comes, so
    that none dangles before a call), then the closing events of the message, each call's
    events, and ``response.completed`` (``response.incomplete`` when cut)."""

    reply: ResponseFrame
    seq: int = 0
    opened: bool = False  # the message item (output index 0) was announced
    text: str = ""  # the message's text sent so far
    held: str = ""  # whitespace held back (with tools)
    rows: list[dict[str, Any]] = field(default_factory=list)  # log-probabilities sent

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def start(self) -> list[str]:
        body = self.reply.envelope("in_progress", [])
        return [
            self.event("response.created", response=body),
            self.event("response.in_progress", response=body),
        ]

    def _part(self) -> dict[str, Any]:
        return {"item_id": self.reply.message_id, "output_index": 0, "content_index": 0}

    def _open(self) -> list[str]:
        self.opened = True
        item = message_item(self.reply.message_id, "", "in_progress", None)
        item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.event("response.output_item.added", output_index=0, item=item),
            self.event("response.content_part.added", part=part, **self._part()),
        ]

    def _send(self, text: str, tokens: Sequence[WireToken] | None) -> list[str]:
        out = [] if self.opened else self._open()
        rows = _logprob_rows(tokens)
        self.text += text
        self.rows += rows
        return [
            *out,
            self.event("response.output_text.delta", delta=text, logprobs=rows, **self._part()),
        ]

    def delta(self, text: str, tokens: Sequence[WireToken] | None = None) -> list[str]:
        """The events of newly generated text (none while it is all held back)."""
        if self.reply.tools:
            text = self.held + text
            kept = len(text.rstrip())
            text, self.held = text[:kept], text[kept:]
        if not text and not tokens:
            return []
        return self._send(text, tokens)

    def finish(self, choice: ChoiceResult, rest: str, calls: list[ToolCall]) -> list[str]:
        """The closing events: the message's (announced now if nothing was sent and there are
        no calls), each call's, then the response's."""
        status = _status(choice, calls)
        tail = self.held + rest
        self.held = ""
        if calls:  # no whitespace dangling before them
            tail = tail.rstrip()
        out = self._send(tail, None) if tail else []
        if not self.opened and not calls:
            out += self._open()
        output: list[dict[str, Any]] = []
        if self.opened:
            rows = self.rows if self.reply.logprobs else None
            item = message_item(self.reply.message_id, self.text, status, rows)
            part = item["content"][0]
            out += [
                self.event(
                    "response.output_text.done",
                    text=self.text,
                    logprobs=part["logprobs"],
                    **self._part(),
                ),
                self.event("response.content_part.done", part=part, **self._part()),
                self.event("response.output_item.done", output_index=0, item=item),
            ]
            output.append(item)
        for call in calls:
            index, item = len(output), call_item(call)
            ids = {"item_id": item["id"], "output_index": index}
            out += [
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                ),
                self.event("response.function_call_arguments.delta", delta=call.arguments, **ids),
                self.event(
                    "response.function_call_arguments.done",
                    arguments=call.arguments,
                    name=call.name,
                    **ids,
                ),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
            output.append(item)
        body = self.reply.envelope(status, output, choice.completion.result)
        return [*out, self.event(f"response.{status}", response=body)]

    def failed(self, message: str, code: str) -> list[str]:
        """An ``error`` event with ``code`` (chat's stream error codes), then
        ``response.failed`` (its error code one of the Responses API's)."""
        body = self.reply.envelope("failed", [])
        kind = "invalid_prompt" if code == "invalid_request" else "server_error"
        body["error"] = {"code": kind, "message": message}
        return [
            self.event("error", code=code, message=message, param=None),
            self.event("response.failed", response=body),
        ]


async def response_events(
    job: Job, reply: ResponseFrame, *, ping_s: float, shut_down: str
) -> AsyncIterator[str]:
    """The server-sent events of a streamed response (``EventWriter``) as the job's pieces
    come; with tools, the text from ``<tool_call>`` on is held back and sent as function call
    items when the output ends. A failure or a shutdown ends it with an ``error`` event and
    ``response.failed``. A client that goes away cancels the generation (``finally``)."""
    writer = EventWriter(reply)
    splitter = CallSplitter() if reply.tools else None
    try:
        for e in writer.start():
            yield e
        last: ChoiceResult | None = None
        while True:
            try:
                message = await asyncio.wait_for(job.next(), ping_s)
            except TimeoutError:
                yield ": ping\n\n"  # a comment: clients skip it, proxies see traffic
                continue
            if isinstance(message, Piece):
                text = message.text if splitter is None else splitter.feed(message.text)
                for e in writer.delta(text, message.logprobs):
                    yield e
            elif isinstance(message, ChoiceResult):
                last = message
            elif isinstance(message, Failed):
                err = message.error
                if isinstance(err, ValueError):
                    events = writer.failed(str(err), "invalid_request")
                else:
                    events = writer.failed("internal error during generation", "server_error")
                for e in events:
                    yield e
                return
            else:
                assert isinstance(message, Finished)
                if message.value is None or last is None:  # cancelled by a shutdown
                    for e in writer.failed(shut_down, "shutting_down"):
                        yield e
                    return
                rest, calls = ("", []) if splitter is None else splitter.finish()
                for e in writer.finish(last, rest, calls):
                    yield e
                return
    finally:
        job.cancel()
