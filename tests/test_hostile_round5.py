"""Hardening, round five (issue 62): one Pair used by two threads or two live streams, the
server's shutdown, a slow-header client, abandoned large predictions, outside text in reports
and on the terminal, truncated streams in ``bench --endpoint``, and the small cases.

Each test here failed on main 8a91816, before its fix (the commit that fixed it names it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_harness import mock_serve_pair, running_server
from specdec.api import Pair
from specdec.errors import PairBusyError
from specdec.serve.admission import GENERATION_PATHS, TOKENIZER_PATHS

PROMPT = "abc abc abc"
GUARD_SECONDS = 120  # a hang guard only


@pytest.fixture(autouse=True)
def _bounded_in_time() -> Iterator[None]:
    import signal

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"the case ran for more than {GUARD_SECONDS} s (a hang)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(GUARD_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def lone(pair_factory: object, n: int = 24) -> list[int]:
    """The tokens of the request alone on a fresh pair (the reference)."""
    assert callable(pair_factory)
    fresh: Pair = pair_factory()
    return fresh.generate(PROMPT, raw=True, max_new_tokens=n, k=3, stop_on_eos=False).tokens


# -- 1. one Pair, two threads / two live streams ------------------------------------------------


def test_a_second_thread_gets_a_clear_error_at_once_and_the_first_is_unharmed() -> None:
    """Two threads on one Pair crashed llama.cpp (GGML_ASSERT in set_rows) or gave a wrong
    output: the second now raises PairBusyError at once, the first ends as it would alone."""
    pair = mock_serve_pair(draft="close", delay=0.01)
    reading = threading.Event()
    got: dict[str, object] = {}

    def first() -> None:
        stream = pair.stream(PROMPT, raw=True, max_new_tokens=24, k=3, stop_on_eos=False)
        for _ in stream.deltas():
            reading.set()
            time.sleep(0.01)
        assert stream.completion is not None
        got["tokens"] = stream.completion.tokens

    a = threading.Thread(target=first)
    a.start()
    assert reading.wait(10)
    with pytest.raises(PairBusyError, match="one generation at a time"):
        pair.generate("another prompt", raw=True, max_new_tokens=24, k=3)
    assert a.is_alive() and "tokens" not in got  # at once: the first is still running
    with pytest.raises(PairBusyError):
        pair.target_costs()  # measuring runs the target too
    a.join(30)
    assert got["tokens"] == lone(lambda: mock_serve_pair(draft="close"))
    # the pair is free again once the first has ended
    again = pair.generate(PROMPT, raw=True, max_new_tokens=24, k=3, stop_on_eos=False)
    assert again.tokens == got["tokens"]


def test_two_live_streams_in_one_thread_the_second_is_refused() -> None:
    """Two live streams of one Pair: the first one's next round hit a bare AssertionError
    ("target cache out of sync"), or under python -O continued the other prompt."""
    pair = mock_serve_pair(draft="close")
    a = pair.stream(PROMPT, raw=True, max_new_tokens=24, k=3, stop_on_eos=False)
    pieces = a.deltas()
    next(pieces)
    with pytest.raises(PairBusyError):
        pair.stream("xyz xyz", raw=True, max_new_tokens=24, k=3)
    for _ in pieces:
        pass
    assert a.completion is not None
    assert a.completion.tokens == lone(lambda: mock_serve_pair(draft="close"))


def test_a_stream_frees_the_pair_when_it_ends_is_cancelled_or_let_go_of() -> None:
    pair = mock_serve_pair(draft="close")
    kw = {"raw": True, "max_new_tokens": 8, "k": 3}
    s = pair.stream(PROMPT, **kw)
    next(iter(s))
    s.cancel()
    assert s.generation.result is not None and s.generation.result.finish_reason == "cancelled"
    pair.generate(PROMPT, **kw)  # free after cancel()
    for _ in pair.stream(PROMPT, **kw):
        break  # the stream is let go of (collected): free again
    pair.generate(PROMPT, **kw)
    with pytest.raises(ValueError, match="context window"):
        pair.generate("abc " * 600, raw=True, max_new_tokens=4)  # refused: holds nothing
    pair.generate(PROMPT, **kw)


def test_the_rule_holds_under_python_minus_o() -> None:
    """Not an assert: ``python -O`` strips those, and stream A then continued B's prompt."""
    code = (
        "import sys; sys.path[:0] = ['tests']\n"
        "from serve_harness import mock_serve_pair\n"
        "from specdec.errors import PairBusyError\n"
        "pair = mock_serve_pair(draft='close')\n"
        "a = pair.stream('abc abc abc', raw=True, max_new_tokens=24, k=3, stop_on_eos=False)\n"
        "it = a.deltas(); next(it)\n"
        "try:\n"
        "    pair.stream('xyz xyz', raw=True, max_new_tokens=24, k=3)\n"
        "except PairBusyError:\n"
        "    print('refused')\n"
        "for _ in it: pass\n"
        "ref = mock_serve_pair(draft='close').generate('abc abc abc', raw=True, "
        "max_new_tokens=24, k=3, stop_on_eos=False)\n"
        "print('same' if ref.tokens == a.completion.tokens else 'DIFFERENT')\n"
    )
    done = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "same"]


def test_the_served_pair_refuses_a_library_call_while_it_streams() -> None:
    """Through the HTTP server: the process's own code calling the served Pair while a
    request streams gets PairBusyError, and the stream ends as its lone rerun does."""
    pair = mock_serve_pair(draft="close", delay=0.02)
    body = {"prompt": PROMPT, "max_tokens": 24, "stream": True, "temperature": 0}
    with running_server(pair, k=3) as base:
        lines: list[str] = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and not lines:
                    with pytest.raises(PairBusyError):
                        pair.generate(PROMPT, raw=True, max_new_tokens=4)
                if line:
                    lines.append(line)
        alone = httpx.post(base + "/v1/completions", json={**body, "stream": False}, timeout=30)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[5:]) for ln in lines if ln.startswith("data:") and "[DONE]" not in ln]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == alone.json()["choices"][0]["text"]


# -- 2. shutdown -----------------------------------------------------------------------------


def _sse_lines(base: str, body: dict, out: list[str], started: threading.Event) -> None:
    try:
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
            out.append(f"status {r.status_code}")
            for line in r.iter_lines():
                if line:
                    out.append(line)
                    started.set()
    except httpx.HTTPError as e:
        out.append(f"transport error {type(e).__name__}")
    started.set()


def _post_into(base: str, body: dict, out: list[object]) -> None:
    try:
        r = httpx.post(base + "/v1/completions", json=body, timeout=60)
        out.append(r)
    except httpx.HTTPError as e:
        out.append(e)


def test_shutdown_lets_the_running_stream_finish_and_answers_the_queued_with_503() -> None:
    """Ctrl-C / SIGTERM cut running streams 0.4 s later without [DONE] (sse-starlette's exit
    hook), gave queued streams an empty body and, after the timeout, queued requests a
    text/plain 500 with CancelledError tracebacks. Now: the running stream ends as it would
    have, [DONE] included; a queued stream gets an error event and [DONE]; a queued request
    a 503 JSON, both at once; the server has stopped soon after the running one ended."""
    from serve_harness import start_server

    pair = mock_serve_pair(draft="none", delay=0.02)
    timeout = 20.0
    base, stop = start_server(pair, k=0, shutdown_timeout=timeout, max_queue=4)
    running: list[str] = []
    queued: list[str] = []
    plain: list[object] = []
    go_a, go_b = threading.Event(), threading.Event()
    a = threading.Thread(
        target=_sse_lines,
        args=(base, {"prompt": PROMPT, "max_tokens": 60, "stream": True}, running, go_a),
    )
    a.start()
    assert go_a.wait(10)
    b = threading.Thread(
        target=_sse_lines,
        args=(base, {"prompt": PROMPT, "max_tokens": 5, "stream": True}, queued, go_b),
    )
    b.start()
    c = threading.Thread(target=_post_into, args=(base, {"prompt": PROMPT, "max_tokens": 5}, plain))
    c.start()
    _wait_for_queue(base, 2)  # both are queued behind the running one
    t0 = time.monotonic()
    stop()  # what Ctrl-C does: uvicorn's should_exit
    stopped_after = time.monotonic() - t0
    for t in (a, b, c):
        t.join(30)
    assert running[0] == "status 200" and running[-1] == "data: [DONE]", running[-3:]
    last = json.loads(running[-2][5:])
    assert last["choices"][0]["finish_reason"] == "length"  # it ran to its 60 tokens
    assert last["usage"]["completion_tokens"] == 60
    assert queued[-1] == "data: [DONE]", queued
    assert json.loads(queued[-2][5:])["error"]["code"] == "shutting_down"
    (r,) = plain
    assert isinstance(r, httpx.Response) and r.status_code == 503
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "shutting_down"
    # it stopped when the running stream ended, not by waiting out the shutdown timeout (a
    # bound from the configured timeout, not from how fast the 60 tokens are made)
    assert stopped_after < timeout


def test_past_the_shutdown_timeout_a_stream_ends_with_an_error_event_and_done() -> None:
    from serve_harness import start_server

    pair = mock_serve_pair(draft="none", delay=0.02)
    base, stop = start_server(pair, k=0, shutdown_timeout=1.0)
    lines: list[str] = []
    go = threading.Event()
    body = {"prompt": PROMPT, "max_tokens": 400, "stream": True}
    a = threading.Thread(target=_sse_lines, args=(base, body, lines, go))
    a.start()
    assert go.wait(10)
    stop()
    a.join(10)
    assert lines[-1] == "data: [DONE]", lines[-3:]
    # cut at the 1 s timeout: far fewer than its 400 tokens were streamed
    assert sum(1 for x in lines if x.startswith('data: {"') and '"error"' not in x) < 400
    assert json.loads(lines[-2][5:])["error"]["code"] == "shutting_down"
    assert pair.target.n_cached < 300  # cut long before its 400 tokens


def _wait_for_queue(base: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(base + "/health", timeout=5).json()["waiting"] < n:
        assert time.monotonic() < deadline, "the requests were not queued"
        time.sleep(0.02)


SERVE_SCRIPT = """
import sys
sys.path[:0] = ['tests']
from serve_harness import mock_serve_pair
from specdec.serve import ServeConfig, ServeSettings, create_app, server
pair = mock_serve_pair(draft='none', delay=0.02)
app = create_app(pair, ServeConfig(ServeSettings('mock', k=0), max_queue=4))
server.run(app, host='127.0.0.1', port=int(sys.argv[1]), shutdown_timeout=float(sys.argv[2]))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(base: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "did not start"
        time.sleep(0.2)


def test_sigterm_drains_and_exits_without_a_traceback() -> None:
    """The process: SIGTERM with a stream running and one queued; the running one ends with
    [DONE], the queued one gets its error event, no traceback, and the process is gone
    within a second or two of the running stream's end (it was 37-39 s)."""
    import signal

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    root = Path(__file__).parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(port), "30"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    try:
        _wait_healthy(base, proc)
        running: list[str] = []
        queued: list[str] = []
        go_a, go_b = threading.Event(), threading.Event()
        body = {"prompt": PROMPT, "max_tokens": 50, "stream": True}
        a = threading.Thread(target=_sse_lines, args=(base, body, running, go_a))
        a.start()
        assert go_a.wait(10)
        b = threading.Thread(
            target=_sse_lines, args=(base, {**body, "max_tokens": 3}, queued, go_b)
        )
        b.start()
        _wait_for_queue(base, 1)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        a.join(10)
        b.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert running[-1] == "data: [DONE]" and '"finish_reason":"length"' in running[-2].replace(
        " ", ""
    ), running[-3:]
    assert json.loads(queued[-2][5:])["error"]["code"] == "shutting_down"
    assert "Traceback" not in err and "CancelledError" not in err, err
    assert took < 10, took  # 50 tokens at 0.02 s, then the exit


# -- 3. a slow-header client -------------------------------------------------------------------


def test_clients_trickling_headers_are_cut_and_health_stays_quick() -> None:
    """1,100 clients trickling request headers held their connections forever and made
    /health time out. With a header deadline (0.5 s here) and a bound of 16 connections, 40
    such clients hold nothing long: each is closed, /health answers at once throughout."""
    import socket

    from specdec.serve.server import ConnectionLimits

    pair = mock_serve_pair(draft="none")
    limits = ConnectionLimits(header_timeout_s=0.5, max_connections=16)
    with running_server(pair, limits=limits) as base:
        port = int(base.rsplit(":", 1)[1])
        slow = []
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            slow.append(s)
        worst = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            assert httpx.get(base + "/health", timeout=5).status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
        closed = 0
        for s in slow:
            s.settimeout(3)
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, TimeoutError):
                closed += 1
            s.close()
    assert worst < 1.0, worst
    assert closed == 40  # every one was closed by the server (deadline or bound)


def test_a_flood_of_one_message_is_logged_a_few_times() -> None:
    import logging

    from specdec.serve.server import LOG_BURST, BoundedLog

    bound = BoundedLog()
    kept = []
    for _ in range(10_000):
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            import sys as _sys

            rec = logging.LogRecord("asyncio", 40, "x", 1, "accept failed", (), _sys.exc_info())
        if bound.filter(rec):
            kept.append(rec)
    assert len(kept) == LOG_BURST
    assert kept[0].exc_info is not None and all(r.exc_info is None for r in kept[1:])


# -- 4. abandoned large predictions ----------------------------------------------------------


class CountingTokenizer:
    """The mock tokenizer, counting the characters it was asked to encode."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.chars = 0

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self.chars += len(text)
        return self.inner.encode(text, add_special_tokens=add_special_tokens)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_prediction_that_cannot_fit_is_refused_before_the_tokenizer_sees_it() -> None:
    pair = mock_serve_pair(draft="close")
    counting = CountingTokenizer(pair.target.tokenizer)
    pair.target._tokenizer = counting  # type: ignore[attr-defined]
    big = "x" * ((4 << 20) // 2)
    body = {"prompt": PROMPT, "max_tokens": 4, "prediction": {"type": "content", "content": big}}
    with running_server(pair, max_body_bytes=8 << 20) as base:
        r = httpx.post(base + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prediction"
        assert counting.chars == 0
        long_prompt = httpx.post(
            base + "/v1/completions", json={"prompt": big, "max_tokens": 4}, timeout=30
        )
        assert long_prompt.status_code == 400 and long_prompt.json()["error"]["param"] == "prompt"
        assert counting.chars == 0
        # a list of prompts (one choice group each, issue 59): each one is bounded the same way
        listed = httpx.post(
            base + "/v1/completions", json={"prompt": [PROMPT, big], "max_tokens": 4}, timeout=30
        )
        assert listed.status_code == 400 and listed.json()["error"]["param"] == "prompt"
        assert counting.chars == 0
        ok = httpx.post(base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert ok.status_code == 200 and counting.chars > 0


def test_a_request_whose_client_left_is_neither_tokenized_nor_queued() -> None:
    """The tokenizer is held (as by a long tokenization); a client sends a prediction and
    hangs up; when the tokenizer is free, its request is skipped, not tokenized or queued."""
    pair = mock_serve_pair(draft="close")
    counting = CountingTokenizer(pair.target.tokenizer)
    pair.target._tokenizer = counting  # type: ignore[attr-defined]
    with running_server(pair) as base:
        state = _app_state(pair)
        state.tokenize_lock.acquire()
        try:
            body = {"prompt": PROMPT, "max_tokens": 4, "prediction": "abc " * 100}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    base + "/v1/completions",
                    json={**body, "prediction": {"type": "content", "content": "abc " * 100}},
                    timeout=httpx.Timeout(10, read=0.5),
                )
            # the server sees the hang-up (polled every 0.25 s) and gives the slot back
            _wait_until(lambda: _slots(state, GENERATION_PATHS).taken == 0)
        finally:
            state.tokenize_lock.release()
        assert counting.chars == 0
        m = httpx.get(base + "/metrics").text
        assert 'specdec_generations_total{finish_reason="cancelled"}' not in m or (
            'specdec_generations_total{finish_reason="cancelled"} 0' in m
        )
        ok = httpx.post(base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert ok.status_code == 200


def test_tokenize_is_bounded_skipped_when_its_client_left_and_admitted_by_slots() -> None:
    """/tokenize and /detokenize get the generation routes' admission: text that cannot fit
    the window is a 400 before the tokenizer sees it, a request whose client left while it
    waited for the tokenizer is not tokenized, and without a free slot of their own pool a
    request is a 429 (they were tokenized at once, one thread each, without bound)."""
    pair = mock_serve_pair(draft="close")
    counting = CountingTokenizer(pair.target.tokenizer)
    pair.target._tokenizer = counting  # type: ignore[attr-defined]
    big = "x" * ((4 << 20) // 2)
    with running_server(pair, max_body_bytes=8 << 20, max_queue=0) as base:
        r = httpx.post(base + "/tokenize", json={"prompt": big}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert "cannot fit the context window" in r.json()["error"]["message"]
        assert counting.chars == 0
        state = _app_state(pair)
        state.tokenize_lock.acquire()
        try:
            with pytest.raises(httpx.ReadTimeout):  # waits for the tokenizer, then hangs up
                httpx.post(
                    base + "/tokenize",
                    json={"prompt": "abc " * 100},
                    timeout=httpx.Timeout(10, read=0.5),
                )
            slots = _slots(state, TOKENIZER_PATHS)
            # the server sees the hang-up (polled every 0.25 s) and gives the slot back
            _wait_until(lambda: slots.taken == 0)
            # one slot (max_queue 0): a request waiting for the tokenizer holds it
            waiting: list[httpx.Response] = []
            t = threading.Thread(
                target=lambda: waiting.append(
                    httpx.post(base + "/tokenize", json={"prompt": "abc"}, timeout=30)
                )
            )
            t.start()
            _wait_until(lambda: slots.taken == 1)  # before it, the probe could take the slot
            refused = httpx.post(base + "/detokenize", json={"tokens": [3, 4]}, timeout=30)
            assert refused.status_code == 429 and "retry-after" in refused.headers
            assert refused.json()["error"]["code"] == "queue_full"
        finally:
            state.tokenize_lock.release()
        t.join(30)
        assert counting.chars == len("abc")  # the abandoned request was never tokenized
        assert waiting and waiting[0].status_code == 200 and waiting[0].json()["count"] > 0
        # generations keep their own pool: a completion is admitted meanwhile
        ok = httpx.post(base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert ok.status_code == 200


def test_with_no_free_slot_a_request_is_refused_before_its_body_is_read() -> None:
    """The queue is full: a client that announces a 4 MiB body gets its 429 before sending
    a byte of it (it was read, parsed and tokenized first)."""
    import socket

    pair = mock_serve_pair(draft="none", delay=0.02)
    with running_server(pair, k=0, max_queue=0) as base:
        go: list[str] = []
        started = threading.Event()
        body = {"prompt": PROMPT, "max_tokens": 200, "stream": True}
        a = threading.Thread(target=_sse_lines, args=(base, body, go, started))
        a.start()
        assert started.wait(10)
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4194304\r\n\r\n"
            )
            answer = ""
            while "queue_full" not in answer:  # the headers, then the body (the 5 s guard)
                got = s.recv(4096).decode()
                if not got:
                    break
                answer += got
        a.join(30)
    assert answer.startswith("HTTP/1.1 429"), answer
    assert "retry-after" in answer.lower() and "queue_full" in answer


def _app_state(pair: Pair) -> Any:
    """The state of the app serving ``pair`` (the harness keeps the app; found by the gc)."""
    import gc

    from specdec.serve.app import _State

    (state,) = [o for o in gc.get_objects() if isinstance(o, _State) and o.pair is pair]
    return state


# -- 5. outside text in Markdown files -------------------------------------------------------

INJECTED = "m` <img src=x onerror=alert(1)> [click](http://evil.example) ``x"


def _html(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).render(markdown)


def test_md_text_and_md_code_keep_any_text_as_text() -> None:
    """The helpers: whatever the text, a renderer shows its characters and makes no tag,
    link or image of them (rendered here by a CommonMark renderer with HTML on)."""
    from specdec.util.printable import md_code, md_text

    samples = [INJECTED, "`", "``", "` `", "*a* _b_ <b>c</b> &amp; \\ | # ~~d~~", "\x1b[31m\n"]
    for text in samples:
        for shown in (md_text(text), md_code(text)):
            html = _html(f"- x: {shown}")
            assert "<img" not in html and "<a " not in html and "<b>" not in html, (text, html)
            assert "\x1b" not in shown and "\n" not in shown


def test_a_server_model_id_stays_text_in_the_certificate_and_the_bench_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server's model id broke out of its backticks in certificate.md and bench's
    report.md (an <img onerror> and a link rendered)."""
    from endpoint_harness import running_app
    from hostile_server import hostile_app
    from specdec.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    with running_app(hostile_app(None, model_id=INJECTED)) as url:
        common = ["--prompts", str(prompts), "--max-new-tokens", "2", "--retries", "0"]
        certify = ["--greedy-prompts", "1", "--sampled-prompts", "0", "--out", str(tmp_path / "c")]
        rc_c = main(["certify", "--endpoint", url, *common, *certify])
        bench = ["--concurrency", "1", "--no-progress", "--out", str(tmp_path / "b.jsonl")]
        rc_b = main(["bench", "--endpoint", url, *common, *bench])
    err = capsys.readouterr().err
    assert rc_c == 0 and rc_b == 0, err
    reports = [tmp_path / "c" / "certificate.md", *tmp_path.rglob("report.md")]
    assert len(reports) == 2, reports
    for md in reports:
        html = _html(md.read_text())
        images = html.count("<img") - html.count('<img src="throughput.png"')  # the report's own
        assert images == 0 and 'href="http://evil' not in html, (md, html[:2000])
        assert "onerror=alert(1)" in html  # shown as the text it is


def test_divergence_texts_stay_text_in_the_certificate() -> None:
    from specdec.certify.endpoint.certificate import EndpointCertificate
    from specdec.certify.endpoint.greedy import GreedyCase
    from specdec.certify.endpoint.report import render_markdown

    case = GreedyCase(
        prompt=INJECTED,
        status="differs",
        on_text=INJECTED,
        off_text=INJECTED,
        char_index=3,
        context=INJECTED,
        on_next="<img src=x onerror=alert(1)>",
        off_next="[a](http://evil.example)",
        reason=INJECTED,
    )
    cert = EndpointCertificate(
        status="fail",
        sides="a <b>x</b>",
        model=INJECTED,
        api="completions",
        plan={"greedy_tokens": 2, "tie_gap": 0.1},
        greedy=[case],
        tests=[],
        drafted_on=None,
        accepted_on=None,
        notes=[INJECTED],
        pertoken_note=INJECTED,
    )
    html = _html(render_markdown(cert))
    assert "<img" not in html and "<a " not in html and "<b>" not in html, html


# -- 6. truncated streams in bench --endpoint ------------------------------------------------


def test_a_stream_without_done_is_a_bad_reply() -> None:
    """A stream cut short (no [DONE]) was counted as a complete reply."""
    import asyncio

    from specdec.endpoint.client import _sse_objects
    from specdec.endpoint.errors import BadReply

    async def lines(done: bool) -> list[Any]:
        async def gen() -> Any:
            yield 'data: {"choices": [{"text": "a", "index": 0}]}'
            if done:
                yield "data: [DONE]"

        return [o async for o in _sse_objects(gen(), "the server")]

    assert len(asyncio.run(lines(True))) == 1
    with pytest.raises(BadReply, match="without \\[DONE\\]"):
        asyncio.run(lines(False))


def test_pairs_of_different_lengths_are_left_out_of_the_paired_speedup() -> None:
    """A 4-token reply was paired with an 8-token one (exit 0): their time ratio is of two
    different amounts of work."""
    from specdec.bench.endpoint.report import summarise

    def req(side: str, slot: int, n: int, e2e: float) -> dict[str, Any]:
        return {
            "type": "endpoint_request",
            "mode": "greedy",
            "concurrency": 1,
            "repeat": 0,
            "group": slot,
            "side": side,
            "slot": slot,
            "e2e_s": e2e,
            "n_tokens": n,
        }

    def grp(side: str, g: int) -> dict[str, Any]:
        return {
            "type": "endpoint_group",
            "mode": "greedy",
            "concurrency": 1,
            "repeat": 0,
            "group": g,
            "side": side,
            "wall_s": 1.0,
            "n_tokens": 8,
        }

    records = [
        req("on", 0, 8, 1.0), grp("on", 0), req("off", 0, 8, 2.0), grp("off", 0),
        req("on", 1, 4, 0.5), grp("on", 1), req("off", 1, 8, 2.0), grp("off", 1),
    ]  # fmt: skip
    (level,) = summarise(records)
    assert level.n_pairs == 1 and level.n_unequal == 1
    assert level.e2e_speedup == pytest.approx(2.0)  # the equal pair only (was 2.83)


# -- 9. the small cases ----------------------------------------------------------------------

SERVE_MOCK = ["serve", "--target", "mock:target", "--target-backend", "mock", "--draft", "none"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([*SERVE_MOCK, "--shutdown-timeout", "nan"], "--shutdown-timeout must be a finite"),
        ([*SERVE_MOCK, "--shutdown-timeout", "-5"], "--shutdown-timeout must be a finite"),
        ([*SERVE_MOCK, "--shutdown-timeout", "inf"], "--shutdown-timeout must be a finite"),
        ([*SERVE_MOCK, "--header-timeout", "0"], "the header timeout must be"),
        ([*SERVE_MOCK, "--max-connections", "0"], "max connections must be"),
        (["bench", "--endpoint", "http://127.0.0.1:99999", "--dry-run"], "the port must be"),
        (["bench", "--endpoint", "http://[::1", "--dry-run"], "is not a valid URL"),
        (["bench", "--endpoint", "http://ho\x07st:80", "--dry-run"], "is not a URL"),
        (
            ["bench", "--endpoint", "http://127.0.0.1:9", "--max-rps", "1e-9", "--dry-run"],
            "the request rate must be finite and at least 0.01",
        ),
    ],
)
def test_small_cases_are_one_clear_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from specdec.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("specdec: error")]
    assert "Traceback" not in err and len(lines) == 1 and words in lines[0], err


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"prompt": b"hi"}, "the prompt is bytes"),
        ({"prompt": "hi", "prediction": b"hi"}, "the prediction is bytes"),
        ({"prompt": "hi", "max_new_tokens": float("nan")}, "max_new_tokens must be an integer"),
        ({"prompt": "hi", "max_new_tokens": 4.0}, "max_new_tokens must be an integer"),
        ({"prompt": "hi", "top_k": 2.5}, "top_k must be an integer"),
        ({"prompt": "hi", "seed": 2**64}, "seed must be in 0..2^63-1"),
        ({"prompt": [1.5, 2]}, "integer token ids"),
        ({"prompt": "hi", "temperature": "0.5"}, "temperature must be a number"),
        ({"prompt": "hi", "presence_penalty": "1"}, "presence_penalty must be a number"),
    ],
)
def test_python_api_type_holes_are_config_errors(kw: dict[str, Any], words: str) -> None:
    """A bytes prompt or prediction was used as token ids, max_new_tokens=nan gave an empty
    text with finish "length", float lengths, top_k=2.5 and seed=2**64 failed deep inside."""
    from specdec.errors import ConfigError

    pair = mock_serve_pair()
    with pytest.raises(ConfigError, match=words.replace("^", "\\^").replace(".", "\\.")):
        pair.generate(raw=True, **kw)


def test_a_bad_kernel_fault_is_a_config_error() -> None:
    from specdec.errors import ConfigError
    from specdec.llama_trust.kernel_probe import parse_fault

    with pytest.raises(ConfigError, match="SPECDEC_TEST_KERNEL_FAULT"):
        parse_fault("bogus")
    assert parse_fault("segv:CPU_REPACK") == ("segv", "CPU_REPACK")


def test_a_garbage_llama_library_is_one_line(tmp_path: Path) -> None:
    """LLAMA_CPP_LIB_PATH at a garbage library was a traceback (generate, doctor)."""
    import os

    pytest.importorskip("llama_cpp")
    (tmp_path / "libllama.so").write_bytes(b"\x7fELF not really" * 100)
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(tmp_path)}
    code = (
        "from specdec.models.llamacpp import _import_llama\n"
        "from specdec.errors import ModelLoadError\n"
        "try:\n    _import_llama()\nexcept ModelLoadError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "LLAMA_CPP_LIB_PATH" in done.stdout, done.stderr
    doctor = subprocess.run(
        [sys.executable, "-m", "specdec", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert doctor.returncode == 0 and "Traceback" not in doctor.stderr, doctor.stderr
    assert "its library would not load" in doctor.stdout


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_a_self_check_refusal_names_the_cached_verdict_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale exact-check verdict (cached by another build) blocked --exact with no hint to
    the cache: the refusal now names the file and says to delete it. The self-check's
    refusal is forced (the verdict is the one a stale file would give)."""
    from tiny_models import llama_cpp_or_skip, store_model_or_skip

    llama_cpp_or_skip()
    import specdec.models.exact as exact_mod
    import specdec.models.llamacpp as backend
    from specdec.llama_trust.exact_kernels import ExactVerdict
    from specdec.models.exact import NotExactError

    stale = ExactVerdict("all", ("CPU_REPACK/Q4_0",), (), cached=True, key="stalekey")

    def refuse(lm: object, name: str) -> None:
        raise NotExactError(f"{name}: not batch-invariant: row 3 of a 4-token pass differs")

    monkeypatch.setenv("SPECDEC_EXACT_CHECKS", str(tmp_path))
    asked: list[object] = []

    def cached(*a: object, **k: object) -> ExactVerdict:
        asked.append(a)
        return stale

    monkeypatch.setattr(backend, "exact_verdict", cached)
    monkeypatch.setattr(exact_mod, "self_check", refuse)
    with pytest.raises(NotExactError) as caught:
        backend.LlamaCppLM(store_model_or_skip(), n_ctx=128, n_threads=2, exact=True)
    if not asked:
        pytest.skip("this build has no optional kernel for exact numerics to check")
    assert str(tmp_path / "stalekey.json") in str(caught.value)
    assert "delete it" in str(caught.value) and "\n" not in str(caught.value)


def _slots(state: Any, paths: frozenset[str]) -> Any:
    """The admission slots of ``paths`` in the app whose state is ``state`` (found by the gc)."""
    import gc

    from specdec.serve.admission import Admission

    (admission,) = [
        o
        for o in gc.get_objects()
        if isinstance(o, Admission)
        and o.paths == paths
        and getattr(o.retry_after, "__self__", None) is state.engine
    ]
    return admission.slots


def _wait_until(done: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.02)
