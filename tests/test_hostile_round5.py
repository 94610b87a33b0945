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

import httpx
import pytest

from serve_harness import mock_serve_pair, running_server
from specdec.api import Pair
from specdec.errors import PairBusyError

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
    t0 = time.monotonic()
    with pytest.raises(PairBusyError, match="one generation at a time"):
        pair.generate("another prompt", raw=True, max_new_tokens=24, k=3)
    assert time.monotonic() - t0 < 1.0  # at once, not after the first one
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
