"""``POST /v1/responses`` (issue 60, item 4): OpenAI's Responses API read as the chat request it
stands for, on the Hermes tool mock of ``test_tool_calls`` (characters plus ``<tool_call>``
markers, a ChatML-like template that renders tools, calls and their results).

Checked: the response object's shape and usage; ``instructions``, a multi-turn input list and
greedy output equal to /v1/chat/completions' for the same conversation (text and input tokens);
``max_output_tokens`` -> ``incomplete``; the streamed events' order, sequence numbers and
deltas adding up to the final text; ``text.format`` json_schema / json_object output that
parses; a function tool round trip (function_call, function_call_output, answer), streamed
too; log-probabilities; bad input -> a 400 naming the field; ``previous_response_id`` and the
other stored-state fields refused; admission, metrics and the API key as for generations. The
official ``openai`` client (when importable) parses every answer: ``responses.create``,
``create(stream=True)``, ``responses.stream`` and ``responses.parse``; every body and event
is also validated against its types.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from specdec.serve.admission import GENERATION_PATHS
from specdec.serve.responses import (
    EventWriter,
    ResponseFrame,
    chat_request,
    input_messages,
    responses_name,
)
from specdec.serve.schemas import ChatRequest, ResponsesRequest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

from serve_harness import mock_serve_pair, running_server
from test_tool_calls import TIME, WEATHER, tool_pair

try:  # the official client's types: every body and event is validated against them
    import openai
    from openai.types.responses import Response as OAResponse
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    EVENTS: TypeAdapter[Any] | None = TypeAdapter(ResponseStreamEvent)
except ImportError:  # pragma: no cover - openai is a dev dependency
    openai = None  # type: ignore[assignment]
    EVENTS = None

NO_SDK = "the official openai package is not installed (pip install openai)"
FN_WEATHER = {"type": "function", **WEATHER["function"]}  # the Responses API's tool shape
FN_TIME = {"type": "function", **TIME["function"]}
QUESTION = "weather in Paris?"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server(tool_pair(), k=4) as base:
        yield base


def respond(url: str, **body: Any) -> httpx.Response:
    body = {"input": QUESTION, "temperature": 0, "max_output_tokens": 40, **body}
    return httpx.post(url + "/v1/responses", json=body, timeout=120)


def chat(url: str, **body: Any) -> dict[str, Any]:
    body = {"temperature": 0, "max_tokens": 40, **body}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def checked(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` after validating it against the official client's Response type."""
    if openai is not None:
        OAResponse.model_validate(body)
    return body


def events(r: httpx.Response) -> list[dict[str, Any]]:
    """The events of a streamed answer, each checked: its ``event:`` line names its type, it
    validates against the official client's event types."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    kind = None
    for line in r.text.splitlines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            assert data["type"] == kind, (kind, data)
            if EVENTS is not None:
                EVENTS.validate_python(data)
            out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def text_of(body: dict[str, Any]) -> str:
    """The output_text of a response (what the SDK's ``output_text`` joins)."""
    return "".join(
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


# -- text ----------------------------------------------------------------------------------------


def test_plain_text_has_openai_s_shape(url: str) -> None:
    r = respond(url, input="hello", metadata={"k": "v"}, user="u1", store=True, seed=3)
    assert r.status_code == 200, r.text
    body = checked(r.json())
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["model"] == "mock" and isinstance(body["created_at"], int)
    assert body["status"] in ("completed", "incomplete")
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["id"].startswith("msg_") and item["status"] == body["status"]
    [part] = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == [] and part["text"]
    u = body["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and u["output_tokens"] > 0
    assert u["input_tokens_details"]["cached_tokens"] == 0
    assert u["output_tokens_details"]["reasoning_tokens"] == 0
    assert u["verification_rounds"] > 0  # specdec's statistics beside OpenAI's fields
    echo = {k: body[k] for k in ("temperature", "top_p", "tool_choice", "tools", "metadata")}
    assert echo == {
        "temperature": 0.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "metadata": {"k": "v"},
    }
    assert body["parallel_tool_calls"] is True and body["text"] == {"format": {"type": "text"}}
    assert body["user"] == "u1" and body["store"] is False  # nothing is stored


def test_greedy_output_equals_chat_for_the_same_conversation(url: str) -> None:
    """instructions + a multi-turn list (developer, user, assistant with output_text parts,
    user with input_text parts) is the chat conversation system, system, user, assistant,
    user: the same prompt tokens and the same greedy text."""
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": "hi"},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        },
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "weather "},
                {"type": "input_text", "text": "in Paris?"},
            ],
        },
    ]
    messages = [
        {"role": "system", "content": "You answer"},
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "weather in Paris?"},
    ]
    for k in (0, 4):
        spec = {"speculative": {"n_max": k}}
        body = checked(respond(url, instructions="You answer", input=items, **spec).json())
        want = chat(url, messages=messages, **spec)
        assert text_of(body) == want["choices"][0]["message"]["content"]
        assert body["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]
        assert body["usage"]["output_tokens"] == want["usage"]["completion_tokens"]
        assert body["instructions"] == "You answer"
    alone = respond(url, input=items).json()
    assert alone["usage"]["input_tokens"] < body["usage"]["input_tokens"]  # the system turn


def test_max_output_tokens_cut_is_incomplete(url: str) -> None:
    want = chat(url, messages=[{"role": "user", "content": "hello"}], max_tokens=3)
    assert want["choices"][0]["finish_reason"] == "length"  # the mock does not stop by then
    body = checked(respond(url, input="hello", max_output_tokens=3).json())
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["usage"]["output_tokens"] == 3
    assert body["max_output_tokens"] == 3
    assert text_of(body) == want["choices"][0]["message"]["content"]


@pytest.mark.parametrize("cut", [False, True])
def test_streamed_events_come_in_order_and_add_up(url: str, cut: bool) -> None:
    # cut: the mock writes on past 3 tokens; not cut: a JSON value ends it
    fmt = {"type": "json_schema", "name": "c", "schema": {"enum": ["red", "green", "blue"]}}
    body = {"max_output_tokens": 3} if cut else {"text": {"format": fmt}, "max_output_tokens": 60}
    whole = respond(url, input="hello", **body).json()
    got = events(respond(url, input="hello", **body, stream=True))
    kinds = [e["type"] for e in got]
    n_deltas = kinds.count("response.output_text.delta")
    assert n_deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * n_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if cut else "response.completed",
    ]
    created, final = got[0]["response"], got[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert final["id"] == created["id"] and final["status"] == (
        "incomplete" if cut else whole["status"]
    )
    text = "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta")
    done = got[-4]
    assert text == done["text"] == text_of(final) == text_of(whole)
    item_id = got[2]["item"]["id"]
    assert {e.get("item_id", item_id) for e in got[2:-1]} == {item_id}
    assert final["output"][0]["id"] == item_id == got[-2]["item"]["id"]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


# -- structured output ---------------------------------------------------------------------------


def test_json_schema_format_output_parses(url: str) -> None:
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}
    for stream in (False, True):
        r = respond(url, text={"format": fmt}, max_output_tokens=200, stream=stream)
        body = events(r)[-1]["response"] if stream else checked(r.json())
        value = json.loads(text_of(body))
        assert value["color"] in ("red", "blue") and isinstance(value["ok"], bool)
        assert body["status"] == "completed" and body["text"] == {"format": fmt}
    r = respond(
        url, text={"format": {"type": "json_object"}}, max_output_tokens=300, temperature=1, seed=2
    )
    assert isinstance(json.loads(text_of(checked(r.json()))), dict)


# -- function tools ------------------------------------------------------------------------------


def test_a_function_call_round_trip(url: str) -> None:
    first = checked(
        respond(
            url,
            tools=[FN_WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=200,
        ).json()
    )
    assert first["status"] == "completed"
    [call] = first["output"]
    assert call["type"] == "function_call" and call["status"] == "completed"
    assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
    args = json.loads(call["arguments"])
    assert args["city"] in ("Paris", "Oslo") and args["days"] in (1, 2, 3)
    assert first["tools"] == [{**FN_WEATHER, "strict": True}]
    # the call and its result sent back (as the SDK's output items, ids and status included)
    items = [
        {"role": "user", "content": QUESTION},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
    ]
    answer = checked(respond(url, input=items, tools=[FN_WEATHER], max_output_tokens=8).json())
    messages = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"},
    ]
    want = chat(url, messages=messages, tools=[WEATHER], max_tokens=8)
    assert answer["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]
    message = want["choices"][0]["message"]
    if message.get("tool_calls"):  # the mock called again: the same call
        got = [(c["name"], c["arguments"]) for c in answer["output"]]
        assert got == [
            (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
        ]
    else:
        assert text_of(answer) == message["content"]


def test_a_streamed_function_call(url: str) -> None:
    body = {"tools": [FN_WEATHER, FN_TIME], "parallel_tool_calls": False, "max_output_tokens": 200}
    named = {"type": "function", "name": "get_time"}
    whole = respond(url, **body, tool_choice=named).json()
    got = events(respond(url, **body, tool_choice=named, stream=True))
    kinds = [e["type"] for e in got]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done, final = got[2]["item"], got[5]["item"], got[-1]["response"]
    assert added["arguments"] == "" and added["status"] == "in_progress"
    assert got[3]["delta"] == got[4]["arguments"] == done["arguments"]
    assert done["name"] == "get_time" and final["output"] == [done]
    assert json.loads(done["arguments"]) == json.loads(whole["output"][0]["arguments"])
    assert final["tool_choice"] == named


@pytest.mark.parametrize("seed", range(3))
def test_auto_gives_text_or_calls_streamed_as_not(url: str, seed: int) -> None:
    body = {"tools": [FN_WEATHER], "temperature": 1.0, "seed": seed, "max_output_tokens": 60}
    whole = checked(respond(url, **body).json())
    final = events(respond(url, **body, stream=True))[-1]["response"]
    calls = [(i["name"], i["arguments"]) for i in whole["output"] if i["type"] == "function_call"]
    assert calls == [
        (i["name"], i["arguments"]) for i in final["output"] if i["type"] == "function_call"
    ]
    if not calls:
        assert text_of(final) == text_of(whole)


# -- log-probabilities ---------------------------------------------------------------------------


def test_logprobs_cover_the_text(url: str) -> None:
    body = {"include": ["message.output_text.logprobs"], "top_logprobs": 2, "max_output_tokens": 6}
    whole = checked(respond(url, **body).json())
    part = whole["output"][0]["content"][0]
    assert "".join(t["token"] for t in part["logprobs"]) == part["text"]
    assert all(len(t["top_logprobs"]) == 2 for t in part["logprobs"])
    got = events(respond(url, **body, stream=True))
    rows = [t for e in got if e["type"] == "response.output_text.delta" for t in e["logprobs"]]
    assert rows == part["logprobs"] == got[-1]["response"]["output"][0]["content"][0]["logprobs"]


# -- refusals ------------------------------------------------------------------------------------

IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"role": "user", "content": [IMAGE]}]}, "input[0].content[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"content": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]},
            "input",
        ),
        ({"input": ""}, "input"),
        ({"input": 5}, "input"),
        ({"input": None}, "input"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
        ({"tools": [FN_WEATHER, FN_WEATHER]}, "tools"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [FN_WEATHER], "tool_choice": {"type": "function", "name": "x"}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}},
            "text.format",
        ),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tools": [FN_WEATHER], "include": ["message.output_text.logprobs"]}, "include"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"conversation": {"id": "conv_1"}}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(url: str, body: dict[str, Any], param: str) -> None:
    r = respond(url, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]


def test_previous_response_id_is_refused_nothing_is_stored(url: str) -> None:
    r = respond(url, previous_response_id="resp_123")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "previous_response_id" and "stores no responses" in error["message"]
    assert respond(url, previous_response_id=None, max_output_tokens=2).status_code == 200


def test_a_missing_input_and_another_model(url: str) -> None:
    r = httpx.post(url + "/v1/responses", json={"model": "mock"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = respond(url, model="gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


# -- the server's rules --------------------------------------------------------------------------


def test_admission_auth_and_metrics_as_for_generations() -> None:
    assert "/v1/responses" in GENERATION_PATHS  # a slot before its body is read
    with running_server(mock_serve_pair(), api_key="k3y", max_body_bytes=4096) as base:
        body = {"input": "hello", "max_output_tokens": 2}
        assert httpx.post(base + "/v1/responses", json=body).status_code == 401
        auth = {"Authorization": "Bearer k3y"}
        r = httpx.post(base + "/v1/responses", json=body, headers=auth, timeout=30)
        assert r.status_code == 200, r.text
        big = {**body, "input": "x" * 5000}
        assert httpx.post(base + "/v1/responses", json=big, headers=auth).status_code == 413
        metrics = httpx.get(base + "/metrics", headers=auth).text
        assert 'endpoint="/v1/responses",status="200"' in metrics
        assert 'endpoint="/v1/responses",status="401"' in metrics


def test_text_longer_than_the_window_is_a_400_before_tokenizing() -> None:
    with running_server(mock_serve_pair(n_ctx=64)) as base:
        r = httpx.post(base + "/v1/responses", json={"input": "ab" * 20_000}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text


# -- the official client ---------------------------------------------------------------------------


@pytest.fixture
def client(url: str) -> Any:
    if openai is None:
        pytest.skip(NO_SDK)
    return openai.OpenAI(base_url=url + "/v1", api_key="none")


def test_the_openai_client_reads_text_and_streams(client: Any) -> None:
    whole = client.responses.create(
        model="mock", input="hello", instructions="be brief", max_output_tokens=20, temperature=0
    )
    assert whole.output_text and whole.usage.output_tokens == 20
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    deltas, kinds = [], []
    for event in client.responses.create(
        model="mock",
        input="hello",
        instructions="be brief",
        max_output_tokens=20,
        temperature=0,
        stream=True,
    ):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    assert "".join(deltas) == whole.output_text and kinds[-1] == "response.incomplete"
    with client.responses.stream(
        model="mock", input="hello", max_output_tokens=8, temperature=0
    ) as s:
        streamed = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        # cut at max_output_tokens: no response.completed, the last event is the incomplete one
    assert (
        streamed
        == client.responses.create(
            model="mock", input="hello", max_output_tokens=8, temperature=0
        ).output_text
    )


def test_the_openai_client_round_trip_with_a_tool(client: Any) -> None:
    tool = {**FN_WEATHER, "strict": True}
    first = client.responses.create(
        model="mock",
        input=QUESTION,
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    items = [
        {"role": "user", "content": QUESTION},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    final = client.responses.create(
        model="mock",
        input=items,
        tools=[tool],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert final.output_text and final.output[0].type == "message"
    with client.responses.stream(
        model="mock",
        input=QUESTION,
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    ) as stream:
        done = stream.get_final_response()
    assert done.output[0].arguments == call.arguments
    assert done.output[0].parsed_arguments == json.loads(call.arguments)  # strict: parsed


def test_the_openai_client_parses_structured_output(client: Any) -> None:
    from typing import Literal

    from pydantic import BaseModel

    class Verdict(BaseModel):
        color: Literal["red", "blue"]
        ok: bool

    out = client.responses.parse(
        model="mock", input="a verdict", text_format=Verdict, temperature=0, max_output_tokens=200
    )
    assert isinstance(out.output_parsed, Verdict)
    with client.responses.stream(
        model="mock", input="a verdict", text_format=Verdict, temperature=0, max_output_tokens=200
    ) as stream:
        assert stream.get_final_response().output_parsed == out.output_parsed


# -- the translation, without a server -------------------------------------------------------------


def test_an_assistant_message_and_its_calls_are_one_chat_message() -> None:
    calls = [
        {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        for i in (1, 2)
    ]
    messages = input_messages(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "let me look"},
            *calls,
            {"type": "function_call_output", "call_id": "c1", "output": "a"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "b"}],
            },
        ]
    )
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "let me look"
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert [m["content"] for m in messages[2:]] == ["a", "b"]
    ChatRequest.model_validate({"messages": messages})  # what chat takes


def test_chat_field_names_are_the_responses_api_s() -> None:
    assert responses_name("messages[3].content") == "input"
    assert responses_name("response_format") == "text.format"
    assert responses_name("max_tokens") == "max_output_tokens"
    assert responses_name("tools[2].function.name") == "tools[2].name"
    assert responses_name("temperature") == "temperature"


def test_whitespace_before_a_call_is_not_streamed() -> None:
    req = ResponsesRequest(input="q", tools=[FN_WEATHER])
    chat_req = chat_request(req)
    writer = EventWriter(ResponseFrame.of(req, chat_req, "mock", n_prompt=1))
    assert writer.delta("ok \n") != [] and writer.text == "ok" and writer.held == " \n"
    assert writer.delta("\n") == [] and writer.held == " \n\n"
    assert writer.delta(" more") and writer.text == "ok \n\n more" and writer.held == ""


@pytest.mark.parametrize("code", ["invalid_request", "server_error", "shutting_down"])
def test_a_failed_stream_ends_with_an_error_and_response_failed(code: str) -> None:
    req = ResponsesRequest(input="q")
    writer = EventWriter(ResponseFrame.of(req, chat_request(req), "mock", n_prompt=1))
    writer.start()
    lines = writer.failed("it broke", code)
    got = [json.loads(e.split("data: ", 1)[1]) for e in lines]
    assert [e["type"] for e in got] == ["error", "response.failed"]
    assert got[0]["code"] == code and got[1]["response"]["status"] == "failed"
    assert [e["sequence_number"] for e in got] == [2, 3]
    if EVENTS is not None:
        for e in got:
            EVENTS.validate_python(e)
