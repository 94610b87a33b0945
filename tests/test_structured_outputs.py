"""Structured outputs through the interfaces (issue 60, item 2), on mock models whose tokens
are characters (``TextMock``: id 3 is "a", JSON's quote and space included), so that the
output is real JSON text: the Python API's ``json_schema``, ``grammar`` and ``regex``;
``response_format`` (json_object, json_schema) in chat and completions, streamed and not;
``--json-schema`` and ``--grammar``; greedy output with speculation equal to plain decoding's
under each of 10 schemas; bad schemas as one 400 (one line) naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdec.api import Pair
from specdec.cli import main
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, MockSpec, MockTokenizer

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

from serve_harness import running_server

VOCAB = 3 + len(MockTokenizer.PIECES)  # every piece: letters, digits, punctuation, " \n


class TextTokenizer(MockTokenizer):
    """The mock vocabulary read as text: id 3 + i is ``PIECES[i]`` (characters without a
    piece are dropped), a chat as ``role: content`` lines."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [3 + self.PIECES.index(ch) for ch in text if ch in self.PIECES]
        return [self.BOS] * add_special_tokens + ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.PIECES[i - 3] for i in ids if 3 <= i < 3 + len(self.PIECES))

    def apply_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.encode(text)


class TextMock(MockLM):
    def __init__(self, spec: MockSpec) -> None:
        super().__init__(spec)
        self._tokenizer = TextTokenizer(spec.vocab_size)


def text_pair(noise: float = 0.7) -> Pair:
    """A target and a draft close to it (some drafts rejected) over the text vocabulary."""
    target = TextMock(MockSpec(vocab_size=VOCAB, n_ctx=1024))
    draft = TextMock(MockSpec(vocab_size=VOCAB, n_ctx=1024, noise_seed=7, noise=noise))
    return Pair(target, draft)


# ten schemas whose instances are short (enums, booleans, bounded lengths and items), so
# that greedy output ends (EOS is allowed once the value is complete)
SCHEMAS: list[dict[str, Any]] = [
    {"type": "boolean"},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    {"type": "integer", "minimum": 0, "maximum": 99},
    {"type": "string", "pattern": "^[a-f]{3}$"},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "blue"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["color", "n"],
        "additionalProperties": False,
    },
    {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}}},
        "required": ["tags"],
        "additionalProperties": False,
    },
]


def valid(value: Any, schema: dict[str, Any]) -> bool:
    """Just enough of JSON Schema for ``SCHEMAS`` (the tests' own check of the output)."""
    if "anyOf" in schema:
        return any(valid(value, s) for s in schema["anyOf"])
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "integer":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and schema.get("minimum", value) <= value <= schema.get("maximum", value)
        )
    if kind == "string":
        import re

        return (
            isinstance(value, str)
            and schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1 << 30)
            and ("pattern" not in schema or re.search(schema["pattern"], value) is not None)
        )
    if kind == "array":
        return (
            isinstance(value, list)
            and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1 << 30)
            and all(valid(v, schema["items"]) for v in value)
        )
    if kind == "object":
        props = schema["properties"]
        return (
            isinstance(value, dict)
            and set(schema.get("required", [])) <= set(value) <= set(props)
            and all(valid(v, props[k]) for k, v in value.items())
        )
    raise AssertionError(f"the test's check does not know {schema}")


@pytest.fixture(scope="module")
def pair() -> Pair:
    return text_pair()


def test_greedy_output_under_ten_schemas_is_plain_decodings_and_valid(pair: Pair) -> None:
    """Speculation on (K = 1, 4, a prediction) gives plain decoding's tokens under each schema,
    and each greedy output is a complete instance (the draft is close, not identical: some
    drafts are rejected and the grammar rolls back)."""
    rejected = 0
    for i, schema in enumerate(SCHEMAS):
        prompt = f"give json {i}"
        plain = pair.generate(prompt, json_schema=schema, k=0, max_new_tokens=80)
        assert plain.result.finish_reason == "eos", (schema, plain.text)
        assert valid(json.loads(plain.text), schema), (schema, plain.text)
        for k in (1, 4):
            spec = pair.generate(prompt, json_schema=schema, k=k, max_new_tokens=80)
            assert spec.result.tokens == plain.result.tokens, (schema, k)
            rejected += spec.result.drafted_tokens - spec.result.accepted_tokens
        predicted = pair.generate(
            prompt, json_schema=schema, prediction=plain.text + "junk", max_new_tokens=80
        )
        assert predicted.result.tokens == plain.result.tokens, schema
    assert rejected > 0  # some drafts were rejected: the rollback was exercised


def test_a_pydantic_model_a_grammar_and_a_regex_through_the_api(pair: Pair) -> None:
    from pydantic import BaseModel

    class Verdict(BaseModel):
        ok: bool
        score: int

    out = pair.generate("rate it", json_schema=Verdict, k=3, max_new_tokens=60)
    assert out.result.finish_reason in ("eos", "length")
    if out.result.finish_reason == "eos":
        Verdict.model_validate_json(out.text)
    else:  # an integer may go on: the prefix is still one a Verdict starts with
        assert out.text.startswith("{")
    lark = pair.generate("x", grammar='start: ("ab" | "c")+ "!"\n', k=3, max_new_tokens=40)
    import re

    assert re.fullmatch(r"(ab|c)*(ab|c)!|(ab|c)*a?", lark.text), lark.text
    gbnf = pair.generate("x", grammar='root ::= "yes" | "no"\n', k=2, max_new_tokens=10)
    assert gbnf.text in ("yes", "no")
    rx = pair.generate("x", regex="[0-9]{4}", k=2, max_new_tokens=10)
    assert re.fullmatch(r"[0-9]{4}", rx.text), rx.text


def test_bad_constraints_through_the_api_are_one_error_naming_the_argument(pair: Pair) -> None:
    with pytest.raises(ConfigError, match=r"^json_schema: .*Invalid type"):
        pair.generate("x", json_schema={"type": "foo"}, max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"^grammar: "):
        pair.generate("x", grammar="start: (((", max_new_tokens=4)
    with pytest.raises(ConfigError, match="give one constraint"):
        pair.generate("x", json_schema={"type": "boolean"}, regex="a", max_new_tokens=4)


# -- the server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server(text_pair(), k=4) as base:
        yield base


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


@pytest.mark.parametrize("stream", [False, True])
def test_chat_and_completions_follow_the_response_format(url: str, stream: bool) -> None:
    schema = SCHEMAS[6]
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a color"}]}),
        ("/v1/completions", {"prompt": "a color"}),
    ):
        body = {**body, "temperature": 0, "max_tokens": 80, "stream": stream}
        r = post(url, path, {**body, "response_format": schema_format(schema)})
        assert r.status_code == 200, r.text
        if stream:
            text = ""
            for line in r.text.splitlines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"]
                    if choice:
                        text += choice[0].get("delta", {}).get("content") or choice[0].get(
                            "text", ""
                        )
        else:
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
        assert valid(json.loads(text), schema), text
        # n_max 0 (plain decoding) gives the same text
        r0 = post(
            url,
            path,
            {
                **body,
                "stream": False,
                "response_format": schema_format(schema),
                "speculative": {"n_max": 0},
            },
        )
        c0 = r0.json()["choices"][0]
        assert (c0["message"]["content"] if "message" in c0 else c0["text"]) == text


def test_json_object_gives_an_object_or_ends_at_max_tokens(url: str) -> None:
    r = post(
        url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "json"}],
            "response_format": {"type": "json_object"},
            "max_tokens": 60,
            "seed": 3,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["message"]["content"]
    assert text.startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a model that never closes the object ends at max_tokens, saying so
        assert choice["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("response_format", "said"),
    [
        (schema_format({"type": "foo"}), "Invalid type"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs json_schema.schema"),
        (schema_format({"type": "string", "pattern": "(((("}), ""),
        (schema_format({"properties": {"a": {"$ref": "#/nope"}}}), ""),
        (schema_format({"type": "string", "enum": [f"v{i}" for i in range(100_000)]}), ""),
        ({"type": "yaml"}, ""),
        (
            schema_format(
                {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
            ),
            "no finite JSON value",
        ),
    ],
)
def test_a_bad_response_format_is_a_400_naming_it(
    url: str, response_format: dict[str, Any], said: str
) -> None:
    r = post(
        url,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "response_format": response_format},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith("response_format"), error
    assert said in error["message"] and "\n" not in error["message"]


COLOR = {
    "type": "object",
    "properties": {"c": {"enum": ["red", "blue"]}},
    "required": ["c"],
    "additionalProperties": False,
}


def is_color(text: str) -> bool:
    return json.loads(text) in ({"c": "red"}, {"c": "blue"})


@pytest.mark.parametrize(
    ("fields", "ok"),
    [  # llama-server's names
        ({"grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
        ({"json_schema": COLOR}, is_color),
        # vLLM's
        ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda t: re.fullmatch("[0-9]{3}", t)),
        ({"structured_outputs": {"json": COLOR}}, is_color),
        ({"structured_outputs": {"grammar": 'start: "ab" | "c"'}}, lambda t: t in ("ab", "c")),
        ({"structured_outputs": {"json_object": True}}, lambda t: t.startswith("{")),  # or length
        ({"guided_choice": ['a "quoted" one', "b"]}, lambda t: t in ('a "quoted" one', "b")),
        ({"guided_regex": "x[a-c]{2}"}, lambda t: re.fullmatch("x[a-c]{2}", t)),
        ({"guided_json": json.dumps(COLOR), "guided_decoding_backend": "xgrammar"}, is_color),
        ({"guided_grammar": 'start: "q" "r"?'}, lambda t: t in ("q", "qr")),
        # SGLang's
        ({"regex": "[xyz]+!"}, lambda t: re.fullmatch("[xyz]+!", t)),
        ({"ebnf": 'root ::= "up" | "down"'}, lambda t: t in ("up", "down")),
    ],
)
def test_other_engines_constraint_fields_constrain_the_output(
    url: str, fields: dict[str, Any], ok: Any
) -> None:
    """A client written for llama-server, vLLM or SGLang names the constraint its engine's way;
    those fields were ignored, and the answer came back unconstrained."""
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "say"}]}),
        ("/v1/completions", {"prompt": "say"}),
    ):
        r = post(url, path, {**body, "max_tokens": 120, "seed": 5, **fields})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        if "json_object" not in str(fields):  # an object the mock may not close
            assert choice["finish_reason"] == "stop", (fields, text)
        assert ok(text), (fields, text)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_regex": "[0-9]", "grammar": 'root ::= "a"'}, "grammar"),
        ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": "yes"}, "guided_choice"),
        ({"structured_outputs": "json"}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": {"grammar": 'start: x\nx: "a" x'}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus"),
        ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
        ({"guided_json": 3}, "guided_json"),
        ({"json_schema": {"type": "foo"}}, "json_schema"),
        ({"regex": ""}, "regex"),
    ],
)
def test_other_engines_fields_that_cannot_be_followed_are_a_400_naming_them(
    url: str, fields: dict[str, Any], param: str
) -> None:
    r = post(url, "/v1/completions", {"prompt": "say", "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error


def test_a_model_without_token_bytes_is_a_400_naming_the_field() -> None:
    from serve_harness import mock_serve_pair

    class NoBytes(MockTokenizer):
        token_pieces = None  # type: ignore[assignment]

    pair = mock_serve_pair(draft="none")
    pair.target._tokenizer = NoBytes(64)  # type: ignore[attr-defined]
    with running_server(pair) as base:
        r = post(
            base,
            "/v1/completions",
            {"prompt": "x", "response_format": {"type": "json_object"}},
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


# -- the command line --------------------------------------------------------------------------

MOCK = ["--draft", "mock:close", "--draft-backend", "mock", "--target", "mock:target"]
MOCK += ["--target-backend", "mock"]


def test_generate_takes_a_grammar_and_a_schema_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: ("ab" | "c")+\n')
    rc = main(
        ["generate", "hello", *MOCK, "-k", "3", "-n", "10", "--json", "--grammar", str(grammar)]
    )
    out, _ = capsys.readouterr()
    assert rc == 0
    tokens = json.loads(out)["tokens"]
    text = "".join(MockTokenizer.PIECES[t - 3] for t in tokens if t >= 3)
    import re

    assert re.fullmatch(r"(ab|c)*a?", text), text
    bad = tmp_path / "s.json"
    bad.write_text('{"type": "foo"}')
    rc = main(["generate", "hello", *MOCK, "-n", "4", "--json-schema", str(bad)])
    _, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if "error" in line]
    assert rc == 2 and len(errors) == 1 and "error: --json-schema: " in errors[0], err
    bad.write_text("{nope")
    rc = main(["generate", "hello", *MOCK, "-n", "4", "--json-schema", str(bad)])
    _, err = capsys.readouterr()
    assert rc == 2 and "--json-schema" in err and "not valid JSON" in err, err


def test_n_choices_with_logprobs_follow_the_response_format(url: str) -> None:
    """Issue 59's n and logprobs beside issue 60's response_format: every choice follows the
    schema; processed log-probabilities are of the masked rows (the opening quote, the one
    token the enum allows first, has probability 1 and no legal alternative), raw ones of the
    model's rows (the same quote then has a probability below 1)."""
    schema = SCHEMAS[1]  # "red" | "green" | "blue"
    body = {
        "prompt": "a color",
        "temperature": 1.0,
        "seed": 11,
        "max_tokens": 40,
        "n": 3,
        "logprobs": 3,
        "response_format": schema_format(schema),
    }
    processed = post(url, "/v1/completions", {**body, "logprobs_mode": "processed_logprobs"})
    raw = post(url, "/v1/completions", {**body, "logprobs_mode": "raw_logprobs"})
    assert processed.status_code == 200 and raw.status_code == 200, processed.text + raw.text
    choices = processed.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for choice in choices:
        assert choice["finish_reason"] == "stop"
        assert valid(json.loads(choice["text"]), schema), choice["text"]
        lp = choice["logprobs"]
        assert "".join(lp["tokens"]) == choice["text"]
        assert lp["tokens"][0] == '"' and lp["token_logprobs"][0] == 0.0
        others = [v for t, v in lp["top_logprobs"][0].items() if t != '"']
        assert all(v <= -9999.0 for v in others), lp["top_logprobs"][0]
    # the same seeds, the same choices; raw log-probabilities are the model's own
    assert [c["text"] for c in raw.json()["choices"]] == [c["text"] for c in choices]
    for choice in raw.json()["choices"]:
        assert choice["logprobs"]["token_logprobs"][0] < 0.0


def test_streamed_chat_choices_each_follow_the_response_format(url: str) -> None:
    schema = SCHEMAS[6]
    r = post(
        url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "a color"}],
            "temperature": 1.0,
            "seed": 5,
            "max_tokens": 80,
            "n": 2,
            "stream": True,
            "response_format": schema_format(schema),
        },
    )
    assert r.status_code == 200, r.text
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + (
                    choice["delta"].get("content") or ""
                )
                if choice.get("finish_reason"):
                    reasons[choice["index"]] = choice["finish_reason"]
    assert sorted(texts) == [0, 1]
    for i, text in texts.items():
        if reasons[i] == "stop":
            assert valid(json.loads(text), schema), text
        else:  # cut at max_tokens, saying so
            assert reasons[i] == "length" and text.startswith("{")
