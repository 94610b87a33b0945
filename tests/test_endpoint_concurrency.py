"""``bench --endpoint --concurrency N`` sends N requests at once, says how many it had on the
wire (measured at the client), and refuses what the process cannot hold (issue 42, item 2).

The server holds every request at a barrier until as many are in flight as the group has
clients (at most 20 s): a client whose pool holds fewer connections than its clients (the
HTTP client's default pool held 100) never gets there, and its in-flight figure shows it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpoint_harness import running_app
from hostile_server import ServerState, hostile_app
from specdec.cli import main

pytest.importorskip("starlette")
GUARD_SECONDS = 120  # a hang guard only


class CaseHung(BaseException):
    pass


@pytest.fixture(autouse=True)
def _guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def hung(signum: int, frame: object) -> None:
        raise CaseHung(f"the case ran for more than {GUARD_SECONDS} s (a hang)")

    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(GUARD_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


CLIENTS = 150  # above the HTTP client's default pool of 100


def test_150_clients_are_150_requests_on_the_wire(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ServerState()
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    out = tmp_path / "b.jsonl"
    with running_app(hostile_app(None, barrier=CLIENTS, state=state)) as url:
        argv = [
            "bench", "--endpoint", url, "--prompts", str(prompts), "--concurrency", str(CLIENTS),
            "--max-new-tokens", "2", "--retries", "0", "--out", str(out), "--no-progress",
        ]  # fmt: skip
        rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 0, err
    assert state.max_in_flight == CLIENTS  # what the server saw (100 with the default pool)
    groups = [
        r for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "endpoint_group"
    ]
    assert len(groups) == 2 and all(g["peak_in_flight"] == CLIENTS for g in groups)
    assert all(0 < g["mean_in_flight"] <= CLIENTS for g in groups)
    report = (tmp_path / "b-report" / "report.md").read_text()
    assert f"| {CLIENTS} | {CLIENTS} / " in report  # clients asked for, peak achieved
    assert "requests were on the wire at once" not in report  # no level fell short


def test_a_level_that_fell_short_is_reported_as_such() -> None:
    """The opposite verdict: a group whose client had fewer requests on the wire than it
    had clients is named in the report, with the achieved figure."""
    from specdec.bench.endpoint.report import LevelSummary, SideSummary, short_of_concurrency

    side = SideSummary(150, 1.0, 1.0, 1.0, 1.0, 1.0, None, peak_in_flight=100, mean_in_flight=90)
    full = SideSummary(150, 1.0, 1.0, 1.0, 1.0, 1.0, None, peak_in_flight=150, mean_in_flight=140)
    lines = short_of_concurrency([LevelSummary("greedy", 150, side, full, 1.0, 1.0, 150)])
    assert any("At 150 clients (spec-on) at most 100 requests" in ln for ln in lines)
    assert short_of_concurrency([LevelSummary("greedy", 150, full, full, 1.0, 1.0, 150)]) == []


def test_in_flight_is_counted_from_the_first_byte_out_to_the_close() -> None:
    """The counter's arithmetic on a frozen clock: two requests overlapping for 1 s of 2."""
    import asyncio

    from specdec.endpoint.inflight import CLOSED, SENT, InFlight

    now = [0.0]
    counter = InFlight(clock=lambda: now[0])
    a, b = counter.trace(), counter.trace()

    async def go() -> None:
        await a("connection.connect_tcp.started", {})  # not on the wire yet
        assert counter.now_in_flight == 0
        await a(SENT, {})
        now[0] = 1.0
        await b(SENT, {})
        now[0] = 2.0
        await a(CLOSED[0], {})
        await a(CLOSED[1], {})  # a second close of the same request counts once
        now[0] = 2.0
        await b(CLOSED[1], {})

    counter.open_window()
    asyncio.run(go())
    w = counter.window()
    assert (w.peak, w.mean, counter.now_in_flight) == (2, 1.5, 0)


def test_more_clients_than_open_files_is_refused_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """3,000 clients need 6,000 connections (both sides' pools) and as many open files; with
    a hard limit of 1,024 the run failed part-way inside the HTTP client. Now: one line."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    rc = main(["bench", "--endpoint", "http://127.0.0.1:9", "--concurrency", "3000"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("specdec: error")]
    assert len(lines) == 1 and "--concurrency 3000 needs 6,000 connections" in lines[0], err
    assert "at most 1,024 files (ulimit -n)" in lines[0]


def test_the_soft_limit_is_raised_within_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from specdec.endpoint.capacity import RESERVED_FDS, ensure_open_files

    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 8192))
    monkeypatch.setattr(resource, "setrlimit", lambda which, lim: asked.append(lim))
    ensure_open_files(3000, "x")
    assert asked == [(3000 + RESERVED_FDS, 8192)]
