"""Hostile servers behind ``bench --endpoint`` and ``certify --endpoint`` (issue 40, items
2-4): every row is one mode of ``hostile_server.MODES`` and ends in exactly one
``specdec: error`` line that names the server, the request and what was wrong, exit status
2, no traceback, no hang (the guard fails a case that runs for GUARD_SECONDS), and no escape
character on the terminal.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpoint_harness import running_app
from hostile_server import ESC_PASS, MODES, all_modes_app, hostile_app
from specdec.cli import main

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

GUARD_SECONDS = 60  # a hang guard only: every row takes a few seconds at most


class CaseHung(BaseException):
    """Raised by the alarm; not an Exception, so the CLI cannot swallow it."""


@pytest.fixture(autouse=True)
def _bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def hung(signum: int, frame: object) -> None:
        raise CaseHung(f"the case ran for more than {GUARD_SECONDS} s (a hang)")

    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(GUARD_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def one_clear_line(err: str, out: str, *needles: str) -> str:
    """stderr is exactly one ``specdec: error`` line holding every needle; nothing printed
    holds an escape character or a traceback."""
    assert "\x1b" not in err + out, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("specdec: error")]
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def bench(url: str, tmp: Path, *extra: str) -> list[str]:
    prompts = tmp / "p.txt"
    prompts.write_text("hello\n")
    return [
        "bench", "--endpoint", url, "--prompts", str(prompts), "--concurrency", "1",
        "--max-new-tokens", "2", "--retries", "0", "--timeout", "5",
        "--out", str(tmp / "b.jsonl"), "--no-progress", *extra,
    ]  # fmt: skip


def certify(url: str, tmp: Path, *extra: str) -> list[str]:
    prompts = tmp / "p.txt"
    prompts.write_text("hello\n")
    return [
        "certify", "--endpoint", url, "--prompts", str(prompts), "--greedy-prompts", "1",
        "--sampled-prompts", "0", "--max-new-tokens", "2", "--retries", "0",
        "--timeout", "5", "--out", str(tmp / "c"), *extra,
    ]  # fmt: skip


PER_TOKEN = ["--sampled-prompts", "1", "--samples", "2", "--sample-tokens", "2"]
SLOW = ["--request-timeout", "0.5"]  # the slow modes: the whole of a request within 0.5 s
COMPLETIONS = "/v1/completions (spec-on, logprobs probe)"
CHAT_PROBE = "/v1/chat/completions (spec-on, switch probe)"
WRONG = "answered a reply of the wrong shape: "

# (mode, command, extra flags, what the one line must say besides the URL)
ROWS: list[tuple[str, str, list[str], list[str]]] = [
    # item 2: replies of the wrong shape
    (
        "top logprob a string",
        "certify",
        [],
        [COMPLETIONS, WRONG + "choices[0].logprobs.top_logprobs[0][' a'] is a string ('-0.1')"],
    ),
    ("logprobs a list", "certify", [], [COMPLETIONS, "choices[0].logprobs is a list of 2"]),
    (
        "logprob row a list",
        "certify",
        [],
        [COMPLETIONS, "choices[0].logprobs.top_logprobs[0] is a list of 2, not an object"],
    ),
    (
        "chat logprob item an int",
        "certify",
        ["--endpoint-api", "chat"],
        ["(spec-on, logprobs probe)", "choices[0].logprobs.content[0] is a number (1)"],
    ),
    (
        "chat logprob null",
        "certify",
        ["--endpoint-api", "chat"],
        ["choices[0].logprobs.content[0].top_logprobs[0].logprob is null, not a number"],
    ),
    ("logprob NaN", "certify", [], [COMPLETIONS, "is a number (nan), not a log-probability"]),
    ("logprob above 0", "certify", [], [COMPLETIONS, "is a number (5.0), not a log-probab"]),
    ("choice a string", "bench", [], [CHAT_PROBE, WRONG + "choices[0] is a string ('x')"]),
    ("text a number", "bench", [], [CHAT_PROBE, "choices[0].delta.content is a number (5)"]),
    (
        "text a number",
        "certify",
        [],
        ["/v1/completions (spec-on, switch probe)", "choices[0].text is a number (5), not a"],
    ),
    ("chunk a list", "bench", [], [CHAT_PROBE, "a streamed chunk is a list of 1, not an obj"]),
    ("nested 100000 deep", "certify", [], [COMPLETIONS, "JSON nested 100000 levels deep"]),
    ("chunk nested 100000 deep", "bench", [], [CHAT_PROBE, "streamed something that is not"]),
    ("bytes not UTF-8", "certify", [], [COMPLETIONS, "bytes that are not UTF-8"]),
    ("counter negative", "bench", [], [CHAT_PROBE, "timings.draft_n is a number (-3), not a"]),
    ("usage a string", "bench", [], [CHAT_PROBE, "usage.completion_tokens is a string ('3')"]),
    ("models data an object", "bench", [], ["/v1/models (spec-on) did not answer", "data is"]),
    ("model id a number", "bench", [], ["data[0].id is a number (5), not a string"]),
    (
        "token list of words",
        "certify",
        PER_TOKEN,
        ["/tokenize (spec-off) answered a token list", "tokens[0] is a string ('a')"],
    ),
    # item 3: replies that never end, or are too large
    ("data forever, fast", "bench", [], [CHAT_PROBE, "streamed more than", "bound of this"]),
    ("data forever, slow", "bench", SLOW, [CHAT_PROBE, "did not finish its reply within 0.5 s"]),
    ("comments forever", "bench", [], [CHAT_PROBE, "streamed more than"]),
    ("comments forever, slow", "bench", SLOW, [CHAT_PROBE, "did not finish its reply within"]),
    ("one line forever", "bench", [], [CHAT_PROBE, "streamed more than"]),
    ("a byte a tick", "bench", SLOW, [CHAT_PROBE, "did not finish its reply within 0.5 s"]),
    ("a byte a tick", "certify", SLOW, ["(spec-on, switch probe) did not finish"]),
    ("a huge body", "bench", [], [CHAT_PROBE, "streamed more than"]),
    # item 4: server text on the terminal
    ("ANSI in a 401", "bench", [], ["HTTP 401: \\x1b[2K\\r\\x1b[1;32mendpoint certificate"]),
    ("ANSI in a 400 mid-stream", "certify", [], ["failed mid-stream: \\x1b[2K\\r"]),
    ("ANSI in a model name", "bench", [], ["serves 2 models ('\\x1b[31mevil\\x1b[0m', 'm')"]),
    ("200,000 models", "bench", [], ["serves 200,000 models ('model-000000',", "199,990 more"]),
]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """Every mode behind one server (mode -> its base URL)."""
    app, paths = all_modes_app()
    with running_app(app) as base:
        yield {mode: base + path for mode, path in paths.items()}


@pytest.mark.parametrize(
    ("mode", "command", "extra", "needles"),
    ROWS,
    ids=[f"{r[1]}: {r[0]}" for r in ROWS],
)
def test_a_hostile_server_is_one_clear_line(
    mode: str,
    command: str,
    extra: list[str],
    needles: list[str],
    servers: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = servers[mode]
    argv = (bench if command == "bench" else certify)(url, tmp_path, *extra)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, err
    line = one_clear_line(err, out, url, *needles)
    assert len(line) < 1000  # a bounded quote: the model list was a 3 MB line


def test_every_mode_has_a_row() -> None:
    assert {r[0] for r in ROWS} == set(MODES)


def test_the_faithful_fake_passes_both_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rows above fail because of their mode, not because of the fake: without one,
    bench measures and certify PASSes (with logprobs, both APIs)."""
    with running_app(hostile_app(None)) as url:
        rc = main(bench(url, tmp_path))
        assert rc == 0, capsys.readouterr().err
        capsys.readouterr()
        for api in ("completions", "chat"):
            (tmp_path / api).mkdir()
            rc = main(certify(url, tmp_path / api, "--endpoint-api", api))
            out, err = capsys.readouterr()
            assert rc == 0, err
            assert out.startswith("endpoint certificate: PASS"), out


def test_a_request_is_bounded_by_its_tokens_without_a_flag(tmp_path: Path) -> None:
    """The whole of one request is bounded by --timeout plus 1 s per requested token
    (0.3 + 1 x 1 here): a reply trickled a byte per tick, never more than 0.05 s apart, so
    that the read timeout never fires, ends in one error (it ran past 150 s before)."""
    import asyncio
    import random

    from specdec.endpoint.client import EndpointClient, EndpointConfig, Request
    from specdec.endpoint.errors import EndpointError

    async def go(url: str) -> str:
        cfg = EndpointConfig(url, model="m", timeout_s=0.3, retries=2)
        async with EndpointClient(cfg, rng=random.Random(0)) as c:
            with pytest.raises(EndpointError) as e:
                await c.generate(Request("hi", 1, stream=False, label="the test"))
        return str(e.value)

    with running_app(hostile_app("a byte a tick")) as url:
        msg = asyncio.run(go(url))
    assert "(the test) did not finish its reply within 1.3 s" in msg
    assert "attempt" not in msg  # not retried: a trickling server would trickle again


def test_the_time_budget_holds_whatever_the_server_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-minutes is a deadline on every request of the run together: against a server
    that trickles, with a per-request bound far above the budget, the run stops at the
    budget (0.02 min: the requests get 0.6 s) with one line saying so."""
    with running_app(hostile_app("a byte a tick")) as url:
        argv = certify(url, tmp_path, "--max-minutes", "0.02", "--request-timeout", "50")
        rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    one_clear_line(err, out, "the time budget of 0.02 min (--max-minutes) ran out in the setup")


def test_the_reply_bound_is_derived_from_what_was_asked() -> None:
    from specdec.endpoint.client import Request
    from specdec.endpoint.wire import BASE_BYTES, PER_LOGPROB_BYTES, PER_TOKEN_BYTES

    assert Request("x", 10).reply_limit() == BASE_BYTES + 10 * (PER_TOKEN_BYTES + PER_LOGPROB_BYTES)
    with_top = Request("x", 10, logprobs=5).reply_limit()
    assert with_top == BASE_BYTES + 10 * (PER_TOKEN_BYTES + 6 * PER_LOGPROB_BYTES)
    scoring = Request((1, 2, 3), 1, extra={"prompt_logprobs": 20}).reply_limit()
    assert scoring == BASE_BYTES + 4 * (PER_TOKEN_BYTES + 21 * PER_LOGPROB_BYTES)


def test_an_escaped_fake_pass_line_is_what_reaches_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's 401: the terminal showed a red-green "certificate PASS" line. Now the
    escape sequences are printed as text and the command's own line says FAIL-free error."""
    with running_app(hostile_app("ANSI in a 401")) as url:
        rc = main(certify(url, tmp_path))
    _, err = capsys.readouterr()
    assert rc == 2 and ESC_PASS not in err and "\\x1b[1;32m" in err
    assert os.linesep not in err.rstrip("\n")


def test_a_model_name_with_escape_sequences_is_written_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one model a server lists is its own name for it: the certificate's markdown
    quoted it raw, so `cat certificate.md` ran its escape sequences (the bench report's
    header: test_untrusted_files)."""
    with running_app(hostile_app(None, model_id="\x1b[31mm")) as url:
        rc = main(certify(url, tmp_path))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "\x1b" not in out + err
    text = (tmp_path / "c" / "certificate.md").read_text()
    assert "\x1b" not in text and "`\\x1b[31mm`" in text
