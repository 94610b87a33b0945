"""Tools (issue 60, items 3 and 4) on a mock whose tokens are characters plus the Hermes
markers ``<tool_call>`` / ``</tool_call>`` as single tokens, with a Hermes-style chat template
written here: tools rendered through the template, the output constrained to calls of the
given functions (their parameters' schemas), parsed into OpenAI ``tool_calls`` (streamed as
deltas too); ``required`` and a named function enforced; ``none`` renders no tools; earlier
assistant calls and ``role: tool`` results rendered; bad tools a 400 naming the field; a
template without a tool-call format refused. The official openai client runs a round trip.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from specdec.api import Pair
from specdec.models.mock import MockLM, MockSpec, MockTokenizer
from specdec.serve.tools import CallSplitter, parse_calls, rebased

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

from serve_harness import running_server

N_TEXT = 3 + len(MockTokenizer.PIECES)
MARKERS = ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>")
VOCAB = N_TEXT + len(MARKERS)

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n"
    '{% endfor %}Call one as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>'
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    '{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n'
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}<|im_start|>assistant\n"
)


class ToolTokenizer(MockTokenizer):
    """Characters (``PIECES``) plus the four markers as single tokens; EOS is id 1."""

    chat_template = TEMPLATE

    def chat_variables(self) -> dict[str, Any]:
        return {"add_generation_prompt": True}

    def special_texts(self) -> frozenset[str]:
        return frozenset(MARKERS[2:])

    def token_pieces(self, n: int) -> tuple[list[bytes], frozenset[int]]:
        pieces, special = super().token_pieces(n)
        for i, marker in enumerate(MARKERS):
            if N_TEXT + i < n:
                pieces[N_TEXT + i] = marker.encode()
        return pieces, special

    def encode_piece(self, text: str, *, special: bool) -> list[int]:
        ids: list[int] = []
        at = 0
        while at < len(text):
            for i, marker in enumerate(MARKERS):
                if (special or i < 2) and text.startswith(marker, at):
                    ids.append(N_TEXT + i)
                    at += len(marker)
                    break
            else:
                if text[at] in self.PIECES:
                    ids.append(3 + self.PIECES.index(text[at]))
                at += 1
        return ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [self.BOS] * add_special_tokens + self.encode_piece(text, special=True)

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            if 3 <= i < N_TEXT:
                out.append(self.PIECES[i - 3])
            elif N_TEXT <= i < VOCAB:
                out.append(MARKERS[i - N_TEXT])
        return "".join(out)

    def apply_chat(self, messages: list[dict[str, Any]], **_: Any) -> list[int]:
        from specdec.templates import encode_chat

        return encode_chat(self, messages)


class ToolMock(MockLM):
    def __init__(self, spec: MockSpec, tokenizer: type[MockTokenizer] = ToolTokenizer) -> None:
        super().__init__(spec)
        self._tokenizer = tokenizer(spec.vocab_size)


def tool_pair(tokenizer: type[MockTokenizer] = ToolTokenizer) -> Pair:
    target = ToolMock(MockSpec(vocab_size=VOCAB, n_ctx=2048), tokenizer)
    draft = ToolMock(MockSpec(vocab_size=VOCAB, n_ctx=2048, noise_seed=5, noise=0.7), tokenizer)
    return Pair(target, draft)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"enum": [1, 2, 3]}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
USER = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server(tool_pair(), k=4) as base:
        yield base


def chat(url: str, **body: Any) -> httpx.Response:
    body = {"messages": USER, "temperature": 0, "max_tokens": 120, **body}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def streamed(r: httpx.Response) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, tool-call deltas, finish reason) of an SSE response."""
    content, calls, reason = "", [], None
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:])["choices"]:
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            calls += delta.get("tool_calls") or []
            reason = choice.get("finish_reason") or reason
    return content, calls, reason


@pytest.mark.parametrize("stream", [False, True])
def test_required_gives_valid_calls_streamed_and_not(url: str, stream: bool) -> None:
    # one call (the mock, choosing at random, would add calls up to max_tokens)
    r = chat(
        url, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, stream=stream
    )
    assert r.status_code == 200, r.text
    if stream:
        content, calls, reason = streamed(r)
        assert content == ""
    else:
        choice = r.json()["choices"][0]
        calls, reason = choice["message"]["tool_calls"], choice["finish_reason"]
        assert choice["message"]["content"] is None
    assert reason == "tool_calls" and calls
    for c in calls:
        args = json.loads(c["function"]["arguments"])
        if c["function"]["name"] == "get_weather":
            assert args["city"] in ("Paris", "Oslo") and args["days"] in (1, 2, 3)
        else:
            assert c["function"]["name"] == "get_time" and args["zone"] in ("UTC", "CET")
        assert c["id"].startswith("call_") and c["type"] == "function"


def test_the_same_calls_with_speculation_off(url: str) -> None:
    body = {"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}
    on = chat(url, **body).json()["choices"][0]["message"]["tool_calls"]
    off = chat(url, **body, speculative={"n_max": 0}).json()["choices"][0]["message"]
    strip = [(c["function"]["name"], c["function"]["arguments"]) for c in on]
    assert strip == [(c["function"]["name"], c["function"]["arguments"]) for c in off["tool_calls"]]


def test_a_named_function_and_one_call_only(url: str) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = chat(url, tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False)
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"]


@pytest.mark.parametrize("seed", range(4))
def test_auto_gives_text_or_valid_calls(url: str, seed: int) -> None:
    r = chat(url, tools=[WEATHER], temperature=1.0, seed=seed, max_tokens=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    if choice["finish_reason"] == "tool_calls":
        for c in message["tool_calls"]:
            assert json.loads(c["function"]["arguments"])["city"] in ("Paris", "Oslo")
    else:
        assert message.get("tool_calls") is None and isinstance(message["content"], str)


def test_none_renders_no_tools(url: str) -> None:
    with_none = chat(url, tools=[WEATHER], tool_choice="none", max_tokens=4).json()
    without = chat(url, max_tokens=4).json()
    assert with_none["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"]
    with_tools = chat(url, tools=[WEATHER], max_tokens=4).json()
    assert with_tools["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]


PARIS = {"city": "Paris"}


PLACE = {
    "type": "function",
    "function": {
        "name": "visit",
        "parameters": {  # as pydantic writes a nested model: $defs beside properties
            "$defs": {
                "City": {
                    "type": "object",
                    "properties": {"name": {"enum": ["Rome", "Bern"]}},
                    "required": ["name"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/City"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("tools", [[PLACE], [WEATHER, PLACE]])
def test_parameters_with_their_own_definitions_are_followed(
    url: str, tools: list[dict[str, Any]]
) -> None:
    """A tool's local references (``#/$defs/City``) point into its parameters wherever the
    call's schema puts them (they were refused: the pointer did not exist at the call's root)."""
    choice = {"type": "function", "function": {"name": "visit"}}
    r = chat(url, tools=tools, tool_choice=choice, parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"])["city"]["name"] in ("Rome", "Bern")


def test_rebased_moves_local_references_only() -> None:
    schema = {
        "$defs": {"enum": {"$ref": "#/$defs/x"}},
        "properties": {"$ref": {"$ref": "#"}, "enum": {"const": {"$ref": "#/data"}}},
        "items": [{"$ref": "other.json#/a"}],
    }
    assert rebased(schema, "/anyOf/1/properties/arguments") == {
        "$defs": {"enum": {"$ref": "#/anyOf/1/properties/arguments/$defs/x"}},
        "properties": {
            "$ref": {"$ref": "#/anyOf/1/properties/arguments"},
            "enum": {"const": {"$ref": "#/data"}},
        },
        "items": [{"$ref": "other.json#/a"}],
    }


def test_a_conversation_with_a_call_and_its_result(url: str) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = chat(url, messages=messages, tools=[WEATHER], max_tokens=8)
    assert r.status_code == 200, r.text
    tokenizer = ToolTokenizer(VOCAB)
    rendered = tokenizer.apply_chat(
        [
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {"role": "tool", "content": "sunny"},
        ]
    )
    assert r.json()["usage"]["prompt_tokens"] > len(rendered)  # the tools' block on top
    text = tokenizer.decode(rendered)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text


NEXT = {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}, "required": ["next"]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "nope"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}
                ]
            },
            "tools",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "guided_regex": "a+"}, "guided_regex"),  # auto's answer: JSON
        (  # arguments that can never be written: a node whose required "next" is a node
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "$defs": {"N": NEXT},
                                "type": "object",
                                "properties": {"n": {"$ref": "#/$defs/N"}},
                                "required": ["n"],
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{x"}}],
                    }
                ]
            },
            "messages",
        ),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(url: str, body: dict[str, Any], param: str) -> None:
    r = chat(url, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(param), error
    assert "\n" not in error["message"]


def test_a_template_without_a_tool_call_format_is_refused() -> None:
    class Plain(ToolTokenizer):
        chat_template = "{% for m in messages %}{{ m.content }}\n{% endfor %}"

    with running_server(tool_pair(Plain)) as base:
        r = chat(base, tools=[WEATHER])
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
        assert "<tool_call>" in r.json()["error"]["message"]
        assert chat(base, tools=[WEATHER], tool_choice="none").status_code == 200


def test_a_model_that_never_closes_a_call_ends_at_max_tokens(url: str) -> None:
    r = chat(url, tools=[WEATHER], tool_choice="required", max_tokens=5)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"].get("tool_calls") is None
    assert choice["message"]["content"].startswith("<tool_call>")


def test_the_openai_client_round_trip(url: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    first = client.chat.completions.create(
        model="mock",
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    messages = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    final = client.chat.completions.create(
        model="mock", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    with client.chat.completions.stream(
        model="mock",
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    ) as stream:
        done = stream.get_final_completion()
    streamed_call = done.choices[0].message.tool_calls[0]
    assert streamed_call.function.arguments == call.function.arguments


# -- the parser ----------------------------------------------------------------------------------


def test_parse_calls() -> None:
    one = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert parse_calls("hi") == ("hi", [])
    content, calls = parse_calls("Let me see.\n" + one + "\n" + one)
    assert content == "Let me see." and [(c.name, c.arguments) for c in calls] == [
        ("f", '{"a": 1}'),
        ("f", '{"a": 1}'),
    ]
    assert parse_calls(one[:-3]) == (one[:-3], [])  # cut: all content
    assert parse_calls(one + " trailing")[1] == []


def test_the_splitter_holds_back_a_possible_marker() -> None:
    s = CallSplitter()
    sent = s.feed("ok <tool") + s.feed("_ca")
    assert sent == "ok "
    sent += s.feed('ll>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert sent == "ok "
    rest, calls = s.finish()
    assert rest == "" and [c.name for c in calls] == ["f"]
    s = CallSplitter()
    assert s.feed("a <") == "a " and s.feed("b") == "<b" and s.finish() == ("", [])


@pytest.mark.parametrize("seed", range(3))
def test_auto_with_a_response_format_gives_calls_or_the_json(url: str, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["x", "y"]}}}
    r = chat(
        url,
        tools=[WEATHER],
        response_format=fmt,
        parallel_tool_calls=False,
        temperature=1.0,
        seed=seed,
        max_tokens=300,
    )
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        assert choice["message"]["tool_calls"]
    else:
        assert json.loads(choice["message"]["content"]) in ("x", "y"), choice


@pytest.mark.parametrize("stream", [False, True])
def test_each_of_n_choices_gets_its_own_calls(url: str, stream: bool) -> None:
    """Issue 59's n beside tools: each choice's text is read for its own calls (streamed
    per choice index), each ends with finish_reason tool_calls."""
    r = chat(
        url,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=3,
        n=2,
        stream=stream,
    )
    assert r.status_code == 200, r.text
    calls: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    reasons: dict[int, str] = {}
    if stream:
        for line in r.text.splitlines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    delta = choice.get("delta", {})
                    assert not delta.get("content")
                    calls[choice["index"]] += delta.get("tool_calls") or []
                    if choice.get("finish_reason"):
                        reasons[choice["index"]] = choice["finish_reason"]
    else:
        for choice in r.json()["choices"]:
            assert choice["message"]["content"] is None
            calls[choice["index"]] = choice["message"]["tool_calls"]
            reasons[choice["index"]] = choice["finish_reason"]
    assert reasons == {0: "tool_calls", 1: "tool_calls"}
    for got in calls.values():
        assert len(got) == 1
        name, args = got[0]["function"]["name"], json.loads(got[0]["function"]["arguments"])
        assert name in ("get_weather", "get_time") and isinstance(args, dict)


def test_logprobs_with_tools_are_a_400_naming_logprobs(url: str) -> None:
    r = chat(url, tools=[WEATHER], logprobs=True)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", r.text
    # without tools rendered (tool_choice none) the message is all content: logprobs work
    r = chat(url, tools=[WEATHER], tool_choice="none", logprobs=True, top_logprobs=2, max_tokens=4)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    tokens = choice["logprobs"]["content"]
    assert "".join(t["token"] for t in tokens) == choice["message"]["content"]
