"""`specdec serve` on loopback over mock models: the OpenAI shapes, stop strings across token
and round boundaries, seeds, validation, API key, queue overflow, disconnects, metrics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from serve_harness import ServeMock, mock_serve_pair, running_server, start_server
from specdec.api import Pair
from specdec.models.mock import MockSpec

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
httpx = pytest.importorskip("httpx")

PROMPT = "hello"


@pytest.fixture(scope="module")
def pair() -> Pair:
    return mock_serve_pair(draft="identical", vocab=64)


@pytest.fixture(scope="module")
def url(pair: Pair) -> Iterator[str]:
    with running_server(pair, k=4, max_queue=4) as base:
        yield base


def post(url: str, path: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30, **kw)


def sse(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any] | str]:
    """The events of a streamed request, parsed (the closing "[DONE]" kept as a string)."""
    events: list[dict[str, Any] | str] = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def streamed_text(events: list[dict[str, Any] | str], chat: bool) -> str:
    out = ""
    for e in events:
        if isinstance(e, dict) and e["choices"]:
            choice = e["choices"][0]
            out += (choice["delta"].get("content") or "") if chat else choice["text"]
    return out


def complete(url: str, **body: Any) -> dict[str, Any]:
    r = post(url, "/v1/completions", {"prompt": PROMPT, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# -- shapes and statistics -----------------------------------------------------------------------


def test_completion_carries_text_usage_and_speculative_statistics(url: str) -> None:
    d = complete(url, max_tokens=20)
    assert d["object"] == "text_completion" and d["model"] == "mock"
    choice = d["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"].count("<") == 20
    u = d["usage"]
    assert u["completion_tokens"] == 20 and u["total_tokens"] == u["prompt_tokens"] + 20
    assert u["verification_rounds"] == 4  # 5 tokens a round: identical draft, K = 4
    assert u["drafted_tokens"] == u["accepted_tokens"] == 16
    assert u["mean_acceptance_length"] == (16 + 4) / 4
    assert u["accepted_length_histogram"] == [0, 0, 0, 0, 4]
    assert u["acceptance_by_position"] == [1.0, 1.0, 1.0, 1.0]
    assert u["completion_tokens_details"]["accepted_prediction_tokens"] == 0  # no prediction
    assert d["timings"]["draft_n"] == 16 and d["timings"]["draft_n_accepted"] == 16


def test_chat_uses_the_template_with_system_and_several_turns(url: str, pair: Pair) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    r = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "seed": 1})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["object"] == "chat.completion"
    assert d["choices"][0]["message"]["role"] == "assistant"
    template = pair.target.tokenizer.apply_chat(  # type: ignore[attr-defined]
        [
            {"role": m["role"], "content": "again" if i == 3 else m["content"]}
            for i, m in enumerate(messages)
        ]
    )
    assert d["usage"]["prompt_tokens"] == len(template)


def test_models_and_health(url: str) -> None:
    models = httpx.get(url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["mock"]
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_per_request_k_switches_speculation_and_greedy_output_is_the_same(url: str) -> None:
    spec = complete(url, max_tokens=15, speculative={"n_max": 4})
    plain = complete(url, max_tokens=15, speculative={"n_max": 0})
    flat = complete(url, max_tokens=15, **{"speculative.n_max": 2})
    assert plain["usage"]["drafted_tokens"] == 0 and plain["usage"]["verification_rounds"] == 15
    assert flat["usage"]["accepted_length_histogram"] == [0, 0, 5]  # 3 tokens a round
    assert spec["choices"][0]["text"] == plain["choices"][0]["text"] == flat["choices"][0]["text"]


# -- stop strings across token and round boundaries ---------------------------------------------


def token_texts(url: str) -> tuple[str, list[str]]:
    full = complete(url, max_tokens=30)["choices"][0]["text"]
    pieces = ["<" + p for p in full.split("<")[1:]]  # one "<id>" per token
    return full, pieces


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    "where",
    ["inside a round", "across rounds", "false alarm then real", "never"],
)
def test_stop_strings_streamed_and_not_are_exact(url: str, chat: bool, where: str) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base: dict[str, Any] = {"temperature": 0, "max_tokens": 30}
    base |= {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    r = post(url, path, base)
    full = r.json()["choices"][0]["message"]["content" if chat else "text"] if chat else None
    full = full if chat else r.json()["choices"][0]["text"]
    toks = ["<" + p for p in full.split("<")[1:]]
    start5 = sum(len(t) for t in toks[:4])  # the 5th token ends round 1 (5 tokens a round)
    if where == "inside a round":
        stop = full[start5 - 3 : start5 + 2]  # end of token 4, start of token 5
    elif where == "across rounds":
        stop = full[start5 + 1 : start5 + len(toks[4]) + 2]  # token 5 into token 6
    elif where == "false alarm then real":
        stop = [full[start5 : start5 + 2] + "Z", toks[7] + toks[8]]  # "<d" looks like a start
    else:
        stop = "<999>"
    stops = stop if isinstance(stop, list) else [stop]
    cut = min((i for i in (full.find(s) for s in stops) if i >= 0), default=len(full))
    expected = full[:cut]
    body = {**base, "stop": stop}
    d = post(url, path, body).json()
    text = d["choices"][0]["message"]["content"] if chat else d["choices"][0]["text"]
    assert text == expected
    reason = "length" if where == "never" else "stop"
    assert d["choices"][0]["finish_reason"] == reason
    events = sse(url, path, body)
    assert events[-1] == "[DONE]"
    shown = ""
    for e in events[:-1]:
        assert isinstance(e, dict)
        shown += streamed_text([e], chat)
        assert expected.startswith(shown)  # never a character that is cut later
    assert shown == expected
    finals = [e for e in events if isinstance(e, dict) and e["choices"]]
    assert finals[-1]["choices"][0]["finish_reason"] == reason
    if where != "never":  # generation ended at the round that completed the stop string
        assert finals[-1]["usage"]["verification_rounds"] < 6


# -- seeds ---------------------------------------------------------------------------------------


def test_same_seed_same_request_same_output_whatever_ran_between(url: str) -> None:
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0.9, "seed": 11}
    first = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    other = post(url, "/v1/completions", {**body, "prompt": PROMPT + "!", "seed": 3})
    assert other.status_code == 200
    again = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    streamed = streamed_text(sse(url, "/v1/completions", body), chat=False)
    assert first == again == streamed
    seeds = {
        post(url, "/v1/completions", {**body, "seed": s}).json()["choices"][0]["text"]
        for s in range(4)
    }
    assert len(seeds) > 1  # the seed matters


def test_a_fresh_server_gives_the_same_output(url: str) -> None:
    body = {"prompt": "abc abc", "max_tokens": 12, "temperature": 0.7, "seed": 5}
    warm = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    with running_server(mock_serve_pair(draft="identical", vocab=64), k=4) as fresh:
        cold = post(fresh, "/v1/completions", body).json()["choices"][0]["text"]
    assert warm == cold


# -- validation -----------------------------------------------------------------------------------

BAD = [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**63}, "seed"),
    ({"n": 17}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"speculative": {"n_max": -1}}, "speculative.n_max"),
    ({"speculative": {"bogus": 1}}, "speculative.bogus"),
    ({"speculative.n_max": -2}, "speculative.n_max"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt"),
    ({"prompt": ["a"] * 17}, "prompt"),
    ({"prompt": ["a", "b"], "n": 9}, "n"),
    ({"max_tokens": 0, "echo": False}, "max_tokens"),
    ({"logprobs": -1}, "logprobs"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"logit_bias": {"64": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 100.5}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"repeat_penalty": 1.3}, "repeat_penalty"),
    ({"logprobs_mode": "raw_logits"}, "logprobs_mode"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": "x" * 600}, "prompt"),  # longer than the 512-token window
    ({"logprobs": 21}, "logprobs"),
    ({"stream": "maybe"}, "stream"),
]


@pytest.mark.parametrize(("change", "param"), BAD)
def test_every_bad_field_is_a_400_naming_it(url: str, change: dict[str, Any], param: str) -> None:
    r = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, **change})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["message"]


def test_null_means_the_default(url: str) -> None:
    nulls = {"temperature": None, "top_p": None, "top_k": None, "n": None, "stream": None}
    nulls |= {"seed": None, "stop": None, "max_tokens": None, "speculative": None}
    r = post(url, "/v1/completions", {"prompt": PROMPT, **nulls, "max_tokens": 3})
    assert r.status_code == 200, r.text


def test_bad_chat_fields(url: str) -> None:
    for body, param in [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
    ]:
        r = post(url, "/v1/chat/completions", body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, body


def test_unknown_model_bad_json_big_body_and_unknown_route(url: str) -> None:
    r = post(url, "/v1/completions", {"prompt": PROMPT, "model": "gpt-4o"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    for raw in (b"{not json", b"[1, 2]"):
        for ctype in ("application/json", "text/plain"):
            r = httpx.post(
                url + "/v1/completions", content=raw, headers={"content-type": ctype}, timeout=10
            )
            assert r.status_code == 400 and "JSON" in r.json()["error"]["message"], r.text
    r = post(url, "/v1/completions", {"prompt": "x" * (5 * 1024 * 1024)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(url + "/v1/files/etc/passwd")
    assert r.status_code == 404 and "error" in r.json()


def test_a_chat_request_to_a_model_without_a_template_is_a_400() -> None:
    from specdec.models.mock import MockLM, MockSpec

    with running_server(Pair(MockLM(MockSpec(vocab_size=32)), None)) as base:
        r = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_api_key() -> None:
    with running_server(mock_serve_pair(), api_key="sesame") as base:
        body = {"prompt": PROMPT, "max_tokens": 2}
        assert post(base, "/v1/completions", body).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        r = post(base, "/v1/completions", body, headers=bad)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(base + "/v1/models").status_code == 401
        assert httpx.get(base + "/metrics").status_code == 401
        good = {"Authorization": "Bearer sesame"}
        assert post(base, "/v1/completions", body, headers=good).status_code == 200
        assert httpx.get(base + "/health").status_code == 200  # liveness stays open


# -- concurrency: queue, disconnects, metrics -----------------------------------------------------


def metric(base: str, name: str) -> float:
    """One sample of /metrics by its full name with labels (0 when absent)."""
    for line in httpx.get(base + "/metrics").text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    return 0.0


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_queue_overflow_is_429_with_retry_after_and_a_disconnect_frees_the_model() -> None:
    slow = mock_serve_pair(draft="none", delay=0.05)
    with running_server(slow, max_queue=1) as base:
        long = {"prompt": PROMPT, "max_tokens": 400, "stream": True}
        health = lambda: httpx.get(base + "/health").json()  # noqa: E731
        # A streams (running); we read one chunk, then hang up mid-stream
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", base + "/v1/completions", json=long) as a,
        ):
            lines = a.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            # B waits in the queue (one slot)
            done_b: list[httpx.Response] = []
            tb = threading.Thread(
                target=lambda: done_b.append(
                    post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
                )
            )
            tb.start()
            wait_for(lambda: health()["waiting"] == 1)
            # C finds the queue full
            c = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
            assert c.status_code == 429 and int(c.headers["Retry-After"]) >= 1
            assert c.json()["error"]["type"] == "rate_limit_error"
            extends = slow.target.extend_calls  # type: ignore[attr-defined]
        # A's connection is closed: its generation stops at the next round and B runs
        tb.join(20)
        assert done_b and done_b[0].status_code == 200
        wait_for(lambda: metric(base, 'specdec_generations_total{finish_reason="cancelled"}') == 1)
        ran = slow.target.extend_calls - extends  # type: ignore[attr-defined]
        assert ran < 40  # A did not run on to its 400 tokens
        assert health() == {"status": "ok", "running": 0, "waiting": 0}


def test_metrics_exposition(url: str) -> None:
    complete(url, max_tokens=10)
    text = httpx.get(url + "/metrics").text
    for name in (
        "specdec_requests_total",
        "specdec_prompt_tokens_total",
        "specdec_completion_tokens_total",
        "specdec_verification_rounds_total",
        "specdec_drafted_tokens_total",
        "specdec_accepted_tokens_total",
        "specdec_mean_acceptance_length",
        'specdec_acceptance_by_position{position="1"}',
        'specdec_time_seconds_total{part="verify"}',
        'specdec_time_seconds_total{part="queue"}',
        "specdec_queue_waiting",
    ):
        assert name in text, name
    assert "# TYPE specdec_requests_total counter" in text
    assert metric(url, 'specdec_requests_total{endpoint="/v1/completions",status="200"}') >= 1


# -- the official client --------------------------------------------------------------------------


def test_the_openai_client_completes_chats_and_streams(url: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    c = client.completions.create(model="mock", prompt=PROMPT, max_tokens=8, temperature=0)
    assert c.choices[0].text.count("<") == 8 and c.usage is not None
    assert c.usage.completion_tokens == 8
    chat = client.chat.completions.create(
        model="mock",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        max_tokens=6,
        seed=2,
        extra_body={"speculative": {"n_max": 3}},
    )
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    assert (chat.usage.model_extra or {})["verification_rounds"] >= 1  # type: ignore[union-attr]
    pieces = client.chat.completions.create(
        model="mock",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        max_tokens=6,
        seed=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"speculative": {"n_max": 3}},
    )
    chunks = list(pieces)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="mock", prompt=PROMPT, temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt=PROMPT)


def test_the_command_is_registered_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys\nfrom specdec.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'torch') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "serve" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "[]"


class Flaky(ServeMock):
    """Raises on its n-th forward pass (a backend failing mid-generation)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(MockSpec(vocab_size=64, n_ctx=512, eos_token_id=65))
        self.fail_at = fail_at

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        if self.extend_calls + 1 == self.fail_at:
            self.extend_calls += 1
            raise RuntimeError("backend failure")
        return super().extend(tokens, last_only=last_only)


def test_a_failing_generation_is_a_500_and_the_next_request_starts_clean() -> None:
    flaky = Flaky(fail_at=3)
    with running_server(Pair(flaky, None)) as base:
        body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
        r = post(base, "/v1/completions", body)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "backend failure" not in r.text  # no internals leak
        again = post(base, "/v1/completions", body)
        events = sse(base, "/v1/completions", body)
    reference = Pair(ServeMock(flaky.spec), None).generate(
        text_ids(flaky, PROMPT), max_new_tokens=6, stop_on_eos=False
    )
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == reference.text
    assert streamed_text(events, chat=False) == reference.text


def text_ids(model: ServeMock, text: str) -> list[int]:
    return model.tokenizer.encode(text, add_special_tokens=True)


def test_shutdown_with_a_stream_in_flight_cancels_it_and_waits_for_the_worker() -> None:
    slow = mock_serve_pair(draft="none", delay=0.05)
    base, stop = start_server(slow, shutdown_timeout=0.5)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        body = {"prompt": PROMPT, "max_tokens": 500, "stream": True}
        try:
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    started.set()
        except httpx.HTTPError:
            pass  # the server closed the connection: expected after the graceful wait

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(10)
    stop()  # graceful wait 0.5 s, then the stream is cancelled and the worker drained
    reader.join(10)  # a hang guard, not a speed check
    assert not reader.is_alive()
    # stop() returned only after the server thread ended: the generation cannot go on
    assert slow.target.n_cached < 200  # stopped, long before its 500 tokens


# -- the command line -----------------------------------------------------------------------------

MOCK_ARGS = ["--target", "mock:target", "--target-backend", "mock"]
MOCK_ARGS += ["--draft", "mock:close", "--draft-backend", "mock"]


@pytest.mark.parametrize(
    "bad",
    [
        ["--port", "70000"],
        ["-k", "-1"],
        ["--max-queue", "-1"],
        ["--max-tokens", "0"],
        ["--api-key", " "],
        ["--max-body-bytes", "10"],
    ],
)
def test_serve_flags_are_checked_before_loading(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from specdec.cli import main

    assert main(["serve", *MOCK_ARGS, *bad]) == 2
    assert capsys.readouterr().err.startswith("specdec: error: ")


def test_specdec_serve_starts_answers_and_stops_on_sigterm() -> None:
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "specdec", "serve", *MOCK_ARGS, "--port", str(port), "-k", "3"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "did not start"
                time.sleep(0.2)
        d = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0})
        assert d.status_code == 200 and d.json()["model"] == "mock:target"
        assert d.json()["usage"]["verification_rounds"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal (exit by SIGTERM, as it came)
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in err, err
    assert "serving 'mock:target'" in err


def test_serve_auto_loads_the_profile_choice_and_leaves_k_to_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import specdec.api
    import specdec.serve.server
    from specdec.cli import main
    from specdec.core.policy import FixedK

    class Choice:
        label, reason = "plain on mock", "nothing beats it"

        def policy(self) -> FixedK:
            return FixedK(0)

    seen: dict[str, Any] = {}

    def fake_load(*args: Any, **kw: Any) -> Pair:
        from specdec.configuration import Configuration
        from specdec.models.loader import ModelConfig

        seen["load"] = kw
        config = Configuration(ModelConfig("mock:target"), "none", choice=Choice(), how="auto")  # type: ignore[arg-type]
        return Pair(mock_serve_pair(draft="none").target, None, Choice(), config=config)  # type: ignore[arg-type]

    monkeypatch.setattr(specdec.api, "load", fake_load)
    monkeypatch.setattr(specdec.serve.server, "run", lambda app, **kw: seen.update(app=app, run=kw))
    assert main(["serve", "--auto", *MOCK_ARGS, "--port", "0"]) == 0
    assert seen["load"]["auto"] is True
    assert seen["app"].state.specdec.config.settings.k is None  # requests without n_max: auto
    assert "auto: plain on mock" in capsys.readouterr().err


@pytest.mark.parametrize(("k_args", "k"), [([], None), (["-k", "3"], 3)])
def test_serve_takes_minus_k_under_the_machine_default_as_generate_does(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    k_args: list[str],
    k: int | None,
) -> None:
    """-k is the server's K whoever chose the drafter (the machine default included); without
    it the pair decides (``Pair.default_k``), as for ``generate``."""
    import specdec.api
    import specdec.serve.server
    from specdec.cli import main
    from specdec.core.policy import FixedK

    class Choice:
        label, reason, speculative = "suffix on mock", "it pays", True

        def policy(self) -> FixedK:
            return FixedK(5)

    seen: dict[str, Any] = {}

    def fake_load(*args: Any, **kw: Any) -> Pair:
        from specdec.configuration import Configuration
        from specdec.models.loader import ModelConfig

        config = Configuration(ModelConfig("mock:target"), "suffix", choice=Choice(), how="default")  # type: ignore[arg-type]
        return Pair(mock_serve_pair().target, mock_serve_pair().draft, Choice(), config=config)  # type: ignore[arg-type]

    monkeypatch.setattr(specdec.api, "load", fake_load)
    monkeypatch.setattr(specdec.serve.server, "run", lambda app, **kw: seen.update(app=app, run=kw))
    assert main(["serve", *MOCK_ARGS, *k_args, "--port", "0"]) == 0
    assert seen["app"].state.specdec.config.settings.k == k
    err = capsys.readouterr().err
    assert ("v1 (default: suffix on mock," in err) is (k is None)
    assert ("K=3" in err) is (k == 3)


def test_a_non_streaming_client_that_leaves_cancels_its_generation() -> None:
    slow = mock_serve_pair(draft="none", delay=0.05)
    with running_server(slow) as base:
        body = {"prompt": PROMPT, "max_tokens": 400}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            httpx.post(base + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
        name = 'specdec_generations_total{finish_reason="cancelled"}'
        wait_for(lambda: metric(base, name) == 1)
        assert slow.target.n_cached < 100  # stopped long before its 400 tokens
        r = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 200  # the model is free again


def test_a_request_body_that_stalls_is_a_408_not_a_held_connection() -> None:
    """A client that sends its headers and then trickles (or stops sending) its body held the
    connection and its task forever: the body must arrive within ``max_seconds`` (30 s;
    0.2 s here). Pure ASGI: the receive channel gives one chunk with more to come, then waits
    forever; the 5 s guard fails the test on a hang."""
    import asyncio

    from specdec.serve.middleware import BodyLimit

    sent: list[dict] = []
    reached: list[bool] = []
    chunks = [{"type": "http.request", "body": b'{"pro', "more_body": True}]

    async def app(scope: dict, receive: object, send: object) -> None:
        reached.append(True)

    async def receive() -> dict:
        if chunks:
            return chunks.pop()
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    limit = BodyLimit(app, 1 << 20)
    limit.max_seconds = 0.2
    scope = {"type": "http", "method": "POST", "headers": [(b"content-length", b"100")]}
    asyncio.run(asyncio.wait_for(limit(scope, receive, send), 5))
    assert sent[0]["status"] == 408 and not reached
    assert b"did not arrive within 0.2 s" in sent[1]["body"]


def test_serve_loads_the_pair_on_the_thread_that_generates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llama.cpp with OpenMP keeps a thread team per calling thread: a pair whose first passes
    ran on the main thread decoded 15-40 % slower on the server's worker thread. So the
    serve command loads (and checks and measures) the pair on the engine's worker, and every
    generation runs there: the thread that loaded is the thread that generates."""
    import specdec.api
    import specdec.serve.server
    from specdec.cli import main

    threads: dict[str, int] = {}

    def fake_load(*args: Any, **kw: Any) -> Pair:
        from specdec.configuration import Configuration
        from specdec.models.loader import ModelConfig

        threads["load"] = threading.get_ident()
        config = Configuration(ModelConfig("mock:target"), "none", choice=None, how="default")  # type: ignore[arg-type]
        return Pair(mock_serve_pair(draft="none").target, None, None, config=config)  # type: ignore[arg-type]

    def fake_run(app: Any, **kw: Any) -> None:
        from fastapi.testclient import TestClient

        with TestClient(app) as client:
            state = app.state.specdec
            real = state.pair.target.extend

            def extend(tokens: Any, **k: Any) -> Any:
                threads["generate"] = threading.get_ident()
                return real(tokens, **k)

            state.pair.target.extend = extend
            r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
            assert r.status_code == 200, r.text

    monkeypatch.setattr(specdec.api, "load", fake_load)
    monkeypatch.setattr(specdec.serve.server, "run", fake_run)
    assert (
        main(["serve", "--target", "mock:target", "--target-backend", "mock", "--port", "0"]) == 0
    )
    assert threads["load"] != threading.get_ident()  # not the main thread
    assert threads["generate"] == threads["load"]
