"""Predicted outputs in `specdec serve` (OpenAI's ``prediction``): the output is the same with
any prediction, OpenAI's usage counters report what was drafted from it, the restrictions
OpenAI documents are 400s naming the field, and the official client's ``prediction=`` works,
streaming and not. Mock models on loopback."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from serve_harness import ChatTokenizer, ServeMock, running_server
from specdec.api import Pair
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.mock import MockSpec

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

ALPHABET = "abcdefghijklmnopqrstuvwxyz ,.;:!?"


class TextTokenizer(ChatTokenizer):
    """One character per token id, every id included, so that text decodes and encodes back
    exactly (characters outside the alphabet become id 3)."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [ALPHABET.index(c) if c in ALPHABET else 3 for c in text]
        return ([self.BOS] if add_special_tokens else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(ALPHABET[i] for i in ids)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    vocab = len(ALPHABET)
    target = ServeMock(MockSpec(vocab_size=vocab, n_ctx=512, eos_token_id=vocab + 1, seed=4))
    target._tokenizer = TextTokenizer(vocab)
    # a server with a drafter of its own (one without decodes every request plainly,
    # tests/test_prediction_requests.py): predictions are drafted in front of it
    with running_server(Pair(target, SuffixDrafter()), k=4, max_queue=4) as base:
        yield base


def chat(url: str, **body: Any) -> dict[str, Any]:
    msgs = [{"role": "user", "content": "edit this"}]
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": msgs, "max_tokens": 40, "temperature": 0, **body},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def details(d: dict[str, Any]) -> tuple[int, int]:
    u = d["usage"]["completion_tokens_details"]
    return u["accepted_prediction_tokens"], u["rejected_prediction_tokens"]


def test_a_prediction_changes_the_speed_not_the_output(url: str) -> None:
    plain = chat(url)
    text = plain["choices"][0]["message"]["content"]
    assert len(text) == 40 and details(plain) == (0, 0)  # no prediction, nothing counted
    exact = chat(url, prediction={"type": "content", "content": text})
    assert exact["choices"][0]["message"]["content"] == text
    accepted, rejected = details(exact)
    rounds = exact["usage"]["verification_rounds"]
    assert (accepted, rejected) == (40 - rounds, 0) and rounds <= 3  # drafts of up to 64
    parts = [{"type": "text", "text": text[:15]}, {"type": "text", "text": text[15:]}]
    assert details(chat(url, prediction={"type": "content", "content": parts})) == (
        accepted,
        rejected,
    )
    edited = text[:10] + "xyz" + text[13:]
    wrong = chat(url, prediction={"type": "content", "content": edited})
    assert wrong["choices"][0]["message"]["content"] == text
    accepted2, rejected2 = details(wrong)
    assert accepted2 >= 10 and rejected2 >= 1


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_completion_tokens": 10}, "max_completion_tokens"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
)
def test_what_openai_refuses_with_a_prediction_is_a_400_naming_the_field(
    url: str, extra: dict[str, Any], param: str
) -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "prediction": {"type": "content", "content": "abc"},
        **extra,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize(
    "prediction",
    [{"type": "file", "content": "x"}, {"content": "x"}, "just a string", {"type": "content"}],
)
def test_a_malformed_prediction_is_a_400(url: str, prediction: Any) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "prediction": prediction}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and "prediction" in r.json()["error"]["param"], r.text


def test_the_openai_client_sends_predictions_and_reads_the_counts(url: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "edit this"}]
    first = client.chat.completions.create(
        model="mock", messages=messages, max_tokens=30, temperature=0
    )
    text = first.choices[0].message.content
    assert text and first.usage is not None
    assert first.usage.completion_tokens_details.accepted_prediction_tokens == 0
    again = client.chat.completions.create(
        model="mock",
        messages=messages,
        max_tokens=30,
        temperature=0,
        prediction={"type": "content", "content": text},
    )
    assert again.choices[0].message.content == text
    got = again.usage.completion_tokens_details  # type: ignore[union-attr]
    assert got.accepted_prediction_tokens > 20 and got.rejected_prediction_tokens == 0
    chunks = list(
        client.chat.completions.create(
            model="mock",
            messages=messages,
            max_tokens=30,
            temperature=0,
            prediction={"type": "content", "content": text},
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    last = chunks[-1].usage.completion_tokens_details  # type: ignore[union-attr]
    assert last.accepted_prediction_tokens == got.accepted_prediction_tokens
    completion = client.completions.create(
        model="mock",
        prompt="edit this",
        max_tokens=30,
        temperature=0,
        extra_body={"prediction": {"type": "content", "content": "abc"}},
    )
    assert completion.usage is not None
    counted = completion.usage.completion_tokens_details
    assert counted.accepted_prediction_tokens + counted.rejected_prediction_tokens >= 1
