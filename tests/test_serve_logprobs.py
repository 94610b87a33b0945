"""`specdec serve` answers what real clients ask, on mock models: log-probabilities (chat and
completions, streamed too, equal with speculation on and off), echo with the prompt's scores,
vLLM's prompt_logprobs and token ids, /tokenize and /detokenize, several prompts and choices
(each its own seed stream), logit bias and penalties, every end-of-generation token; bad
input is a 400 naming the field before anything reaches the models. The openai SDK reads it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from serve_harness import ServeMock, mock_serve_pair, running_server
from specdec.api import Pair
from specdec.models.mock import MockSpec

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
httpx = pytest.importorskip("httpx")

VOCAB = 64
OFF = {"speculative": {"n_max": 0}}


@pytest.fixture(scope="module")
def pair() -> Pair:
    return mock_serve_pair(draft="close", vocab=VOCAB)


@pytest.fixture(scope="module")
def url(pair: Pair) -> Iterator[str]:
    with running_server(pair, k=4, max_queue=4) as base:
        yield base


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def ok(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(url, path, body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def sse(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    return events


def log_softmax(row: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(row.double(), dim=-1)


# -- generated tokens --------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_completion_logprobs_are_equal_with_speculation_on_and_off(
    url: str, pair: Pair, temperature: float
) -> None:
    body = {"prompt": "abcab", "max_tokens": 24, "logprobs": 3, "temperature": temperature}
    body |= {"seed": 7}
    on = ok(url, "/v1/completions", body)
    off = ok(url, "/v1/completions", body | OFF)
    assert on["usage"]["drafted_tokens"] > 0 and off["usage"]["drafted_tokens"] == 0
    assert on["usage"]["accepted_tokens"] < on["usage"]["drafted_tokens"]  # some rejected
    lp_on, lp_off = on["choices"][0]["logprobs"], off["choices"][0]["logprobs"]
    if temperature == 0.0:  # the same tokens: bit for bit the same values
        assert lp_on == lp_off  # (the mock's rows do not depend on the pass size)
    assert len(lp_on["tokens"]) == 24 == len(lp_on["token_logprobs"])
    assert all(len(row) == 3 for row in lp_on["top_logprobs"])
    # the values are the target's raw log-softmax at each position
    target = pair.target
    assert isinstance(target, ServeMock)
    for lp in (lp_on, lp_off):  # sampled: other tokens, each scored at its own context
        ctx = target.tokenizer.encode("abcab")
        ids = [int(t.removeprefix("<").removesuffix(">")) for t in lp["tokens"]]
        for tok, value, top in zip(ids, lp["token_logprobs"], lp["top_logprobs"], strict=True):
            full = log_softmax(target.logits_for_context(ctx))
            assert math.isclose(value, float(full[tok]), abs_tol=1e-6)
            best = torch.topk(full, 3)
            assert list(top) == [f"<{i}>" for i in best.indices.tolist()]
            ctx.append(tok)
    assert lp_on["text_offset"][0] == 0 and lp_on["text_offset"][1] == len(lp_on["tokens"][0])


def test_streamed_logprobs_are_the_non_streamed_ones(url: str) -> None:
    body = {"prompt": "xyz", "max_tokens": 20, "logprobs": 2, "temperature": 0.0}
    whole = ok(url, "/v1/completions", body)["choices"][0]["logprobs"]
    events = sse(url, "/v1/completions", body)
    tokens: list[str] = []
    values: list[float] = []
    for e in events:
        for c in e["choices"]:
            lp = c.get("logprobs")
            if lp:
                tokens += lp["tokens"]
                values += lp["token_logprobs"]
    assert tokens == whole["tokens"] and values == whole["token_logprobs"]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
    chat |= {"logprobs": True, "top_logprobs": 4, "temperature": 0.0}
    whole_chat = ok(url, "/v1/chat/completions", chat)["choices"][0]["logprobs"]["content"]
    streamed = [
        item
        for e in sse(url, "/v1/chat/completions", chat)
        for c in e["choices"]
        for item in (c.get("logprobs") or {}).get("content") or []
    ]
    assert streamed == whole_chat and len(streamed) == 12
    assert all(len(item["top_logprobs"]) == 4 and item["bytes"] for item in streamed)


def test_processed_logprobs_are_of_the_distribution_sampled_from(url: str) -> None:
    body = {"prompt": "abc", "max_tokens": 10, "logprobs": 5, "temperature": 0.0}
    greedy = ok(url, "/v1/completions", body | {"logprobs_mode": "processed_logprobs"})
    lp = greedy["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [0.0] * 10  # greedy rows are one-hot
    assert all(sorted(row.values())[:-1] == [-9999.0] * 4 for row in lp["top_logprobs"])
    topk = body | {"temperature": 1.0, "top_k": 2, "seed": 3}
    sampled = ok(url, "/v1/completions", topk | {"logprobs_mode": "processed_logprobs"})
    for row in sampled["choices"][0]["logprobs"]["top_logprobs"]:
        kept = sorted(row.values())[-2:]
        assert math.isclose(sum(math.exp(v) for v in kept), 1.0, rel_tol=1e-5)
    raw = ok(url, "/v1/completions", topk)["choices"][0]["logprobs"]["top_logprobs"]
    assert all(min(r.values()) > -9999.0 for r in raw)  # raw rows keep every token


# -- the prompt --------------------------------------------------------------------------------


def test_echo_scores_the_prompt_with_max_tokens_0(url: str, pair: Pair) -> None:
    ids = [5, 9, 17, 3, 40, 41]
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    got = ok(url, "/v1/completions", body)
    choice = got["choices"][0]
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == len(ids) and choice["text"] == "".join(lp["tokens"])
    assert got["usage"]["completion_tokens"] == 0 and choice["finish_reason"] == "length"
    target = pair.target
    assert isinstance(target, ServeMock)
    for j in range(1, len(ids)):
        want = float(log_softmax(target.logits_for_context(ids[:j]))[ids[j]])
        assert math.isclose(lp["token_logprobs"][j], want, abs_tol=1e-6)
    # with one token generated (lm-eval's other form): the prompt's scores, then the token's
    one = ok(url, "/v1/completions", body | {"max_tokens": 1})["choices"][0]["logprobs"]
    assert one["token_logprobs"][: len(ids)] == lp["token_logprobs"]
    assert len(one["token_logprobs"]) == len(ids) + 1
    # speculation on or off: the same scores
    assert ok(url, "/v1/completions", body | OFF)["choices"][0]["logprobs"] == lp


def test_echo_streams_the_prompt_first(url: str) -> None:
    body = {"prompt": "abcd", "max_tokens": 3, "echo": True, "logprobs": 0, "temperature": 0}
    whole = ok(url, "/v1/completions", body)["choices"][0]
    events = sse(url, "/v1/completions", body)
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == whole["text"] and text.startswith("<0>")  # BOS, then the prompt
    values = [
        v
        for e in events
        for c in e["choices"]
        for v in (c.get("logprobs") or {}).get("token_logprobs", [])
    ]
    assert values == whole["logprobs"]["token_logprobs"] and values[0] is None


def test_vllm_prompt_logprobs_and_token_ids(url: str, pair: Pair) -> None:
    ids = [7, 8, 9, 10, 11]
    body = {"prompt": ids, "max_tokens": 2, "prompt_logprobs": 3, "temperature": 0.0}
    body |= {"logprobs": 1, "return_tokens_as_token_ids": True}
    choice = ok(url, "/v1/completions", body)["choices"][0]
    rows = choice["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    target = pair.target
    assert isinstance(target, ServeMock)
    for j in range(1, len(ids)):
        full = log_softmax(target.logits_for_context(ids[:j]))
        here = rows[j][str(ids[j])]
        assert math.isclose(here["logprob"], float(full[ids[j]]), abs_tol=1e-6)
        assert here["rank"] == 1 + int((full > full[ids[j]]).sum())
        ranked = sorted((v["rank"], int(k)) for k, v in rows[j].items())
        assert [r for r, _ in ranked][:3] == [1, 2, 3]
    assert all(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
    assert (
        "prompt_logprobs"
        not in ok(url, "/v1/completions", {"prompt": "a", "max_tokens": 1})["choices"][0]
    )


def test_tokenize_and_detokenize(url: str, pair: Pair) -> None:
    for body in ({"prompt": "abc"}, {"content": "abc", "add_special": True}):
        got = ok(url, "/tokenize", body)
        assert got["tokens"] == pair.target.tokenizer.encode("abc") and got["count"] == 4
    bare = ok(url, "/tokenize", {"prompt": "abc", "add_special_tokens": False})["tokens"]
    assert bare == pair.target.tokenizer.encode("abc", add_special_tokens=False)
    back = ok(url, "/detokenize", {"tokens": bare})
    assert back["prompt"] == pair.target.tokenizer.decode(bare) == back["content"]
    info = httpx.get(url + "/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == "<65>" and info["model_max_length"] == 512
    for path, body, param in [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "content": "b"}, "prompt"),
        ("/detokenize", {"tokens": [VOCAB]}, "tokens"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
    ]:
        r = post(url, path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# -- several prompts, several choices ----------------------------------------------------------


def test_prompts_as_lists_of_token_ids_give_one_choice_each(url: str) -> None:
    prompts = [[3, 4, 5], [6, 7], [8]]
    body = {"prompt": prompts, "max_tokens": 4, "temperature": 0.0}
    got = ok(url, "/v1/completions", body)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    for ids, choice in zip(prompts, got["choices"], strict=True):
        alone = ok(url, "/v1/completions", {**body, "prompt": ids})["choices"][0]["text"]
        assert choice["text"] == alone
    assert got["usage"]["prompt_tokens"] == 6 and got["usage"]["completion_tokens"] == 12


def test_n_choices_have_their_own_seed_streams(url: str) -> None:
    body = {"prompt": "abc", "max_tokens": 16, "temperature": 1.0, "seed": 11}
    three = ok(url, "/v1/completions", body | {"n": 3})["choices"]
    texts = [c["text"] for c in three]
    assert [c["index"] for c in three] == [0, 1, 2] and len(set(texts)) == 3
    assert texts[0] == ok(url, "/v1/completions", body)["choices"][0]["text"]  # choice 0: seed
    assert texts == [c["text"] for c in ok(url, "/v1/completions", body | {"n": 3})["choices"]]
    events = sse(
        url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 5,
            "n": 2,
            "seed": 1,
            "temperature": 1.0,
        },
    )
    finished = [c["index"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert sorted(finished) == [0, 1]


# -- processors and end of generation -----------------------------------------------------------


def test_logit_bias_and_penalties_reach_the_generation(url: str, pair: Pair) -> None:
    body = {"prompt": "abc", "max_tokens": 12, "temperature": 0.0}
    plain = ok(url, "/v1/completions", body)["choices"][0]["text"]
    first = int(plain.split(">")[0].removeprefix("<"))
    biased = ok(url, "/v1/completions", body | {"logit_bias": {str(first): -100}})
    assert not biased["choices"][0]["text"].startswith(f"<{first}>")
    pen = body | {"presence_penalty": 2.0, "frequency_penalty": 2.0, "repetition_penalty": 1.5}
    on = ok(url, "/v1/completions", pen)["choices"][0]["text"]
    assert on != plain
    assert on == ok(url, "/v1/completions", pen | OFF)["choices"][0]["text"]  # lossless
    direct = pair.generate(
        "abc",
        raw=True,
        max_new_tokens=12,
        presence_penalty=2.0,
        frequency_penalty=2.0,
        repetition_penalty=1.5,
        k=0,
    )
    assert direct.text == on


def test_every_end_of_generation_token_stops_the_server() -> None:
    plain = mock_serve_pair(draft="none", vocab=VOCAB)
    with running_server(plain) as base:
        body = {"prompt": [3, 4, 5], "max_tokens": 12, "temperature": 0.0}
        text = ok(base, "/v1/completions", body)["choices"][0]["text"]
    path = [int(t) for t in text.removeprefix("<").removesuffix(">").split("><")]
    stop_at = next(i for i in range(2, len(path)) if path[i] not in path[:i])
    spec = MockSpec(
        vocab_size=VOCAB, n_ctx=512, eos_token_id=VOCAB + 1, more_eos=(VOCAB + 2, path[stop_at])
    )
    draft = ServeMock(MockSpec(vocab_size=VOCAB, n_ctx=512, eos_token_id=VOCAB + 1))
    with running_server(Pair(ServeMock(spec), draft), k=4) as base:
        for extra in ({}, OFF):
            got = ok(base, "/v1/completions", body | extra)["choices"][0]
            assert got["finish_reason"] == "stop"
            assert got["text"] == "".join(f"<{t}>" for t in path[:stop_at])  # the EOG adds none


# -- bad input ----------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
BAD = [
    ("/v1/chat/completions", CHAT | {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", CHAT | {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", CHAT | {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", CHAT | {"echo": True}, "echo"),
    ("/v1/chat/completions", CHAT | {"logit_bias": {str(VOCAB): 5}}, "logit_bias"),
    ("/v1/chat/completions", CHAT | {"logit_bias": {"3": -101}}, "logit_bias"),
    ("/v1/chat/completions", CHAT | {"presence_penalty": 3}, "presence_penalty"),
    ("/v1/chat/completions", CHAT | {"frequency_penalty": float("nan")}, "frequency_penalty"),
    ("/v1/chat/completions", CHAT | {"n": 17}, "n"),
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {"99999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "a", "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field_before_the_models_run(
    url: str, pair: Pair, path: str, body: dict[str, Any], param: str
) -> None:
    target = pair.target
    assert isinstance(target, ServeMock)
    before = target.extend_calls
    headers = {"content-type": "application/json"}
    r = httpx.post(url + path, content=json.dumps(body), headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert target.extend_calls == before  # nothing reached the worker


# -- the openai SDK ---------------------------------------------------------------------------


def test_the_openai_sdk_reads_logprobs_and_several_choices(url: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    messages = [{"role": "user", "content": "hello"}]
    got = client.chat.completions.create(
        model="mock",
        messages=messages,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
        temperature=0,
        n=2,
    )
    assert [c.index for c in got.choices] == [0, 1]
    content = got.choices[0].logprobs.content
    assert len(content) == 8 and len(content[0].top_logprobs) == 2
    assert (
        content[0].logprob <= 0 and got.choices[0].message.content == got.choices[1].message.content
    )
    streamed = client.chat.completions.create(
        model="mock",
        messages=messages,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
        temperature=0,
        stream=True,
    )
    items = [
        i for chunk in streamed for c in chunk.choices if c.logprobs for i in c.logprobs.content
    ]
    assert [(i.token, i.logprob) for i in items] == [(i.token, i.logprob) for i in content]
    comp = client.completions.create(
        model="mock", prompt="abc", max_tokens=4, logprobs=2, echo=True, temperature=0, n=2
    )
    assert len(comp.choices) == 2 and comp.choices[0].logprobs.token_logprobs[0] is None


# -- specdec certify --endpoint against specdec serve -------------------------------------------


def test_certify_endpoint_runs_every_test_against_specdec_serve(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """One server, the per-request switch: greedy agreement with logprobs, the sampled
    tests and the per-token test (/tokenize, token ids, prompt_logprobs) all run."""
    from specdec.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nabcabcabcabc\nxyz\n", encoding="utf-8")
    args = ["--greedy-prompts", "2", "--max-new-tokens", "8", "--sampled-prompts", "2"]
    args += ["--samples", "20", "--sample-tokens", "4", "--timeout", "60"]
    with running_server(mock_serve_pair(draft="close", vocab=VOCAB), k=3) as base:
        rc = main(
            [
                "certify",
                "--endpoint",
                base,
                "--endpoint-api",
                "completions",
                "--prompts",
                str(prompts),
                *args,
                "--out",
                str(tmp_path / "c"),
            ]
        )
    out, err = capsys.readouterr()
    cert = json.loads((tmp_path / "c" / "certificate.json").read_text())
    assert rc == 0, out + err
    assert cert["verdict"] == "PASS"
    assert cert["pertoken_test"] is not None and cert["pertoken_note"] is None
    assert not any("logprobs" in n for n in cert["notes"]), cert["notes"]
    assert cert["drafted_on"] > 0
