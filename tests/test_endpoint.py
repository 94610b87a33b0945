"""`specdec bench --endpoint` and `specdec certify --endpoint` against `specdec serve` on mock
models (in-process, loopback), misbehaving proxies in front of it, and unit checks of the
client, the counters, the greedy comparison and the sampled tests."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from endpoint_harness import ProxyFaults, free_port, proxy_app, running_app, swap_first_two
from serve_harness import mock_serve_pair, running_server
from specdec.certify.common import first_difference
from specdec.certify.endpoint.greedy import compare_greedy
from specdec.certify.endpoint.plan import EndpointCertifyPlan
from specdec.certify.endpoint.sampled import STATISTICS, sampled_tests, statistics_of
from specdec.cli import main
from specdec.endpoint.client import (
    EndpointClient,
    EndpointConfig,
    RateLimiter,
    Reply,
    Request,
    normalise_url,
)
from specdec.endpoint.counters import counters_from_body, metrics_counters, parse_prometheus
from specdec.endpoint.errors import EndpointError

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """specdec serve with a draft that is sometimes rejected (rejection sampling at work)."""
    with running_server(mock_serve_pair(draft="close", vocab=64), k=4, max_queue=16) as base:
        yield base


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    """The same target without a drafter: a spec-off server."""
    with running_server(mock_serve_pair(draft="none", vocab=64), max_queue=16) as base:
        yield base


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("hello there\nabcabcabcabc\n", encoding="utf-8")
    return p


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- units ---------------------------------------------------------------------------------------


def test_counters_are_read_from_every_known_place() -> None:
    assert counters_from_body({"timings": {"draft_n": 8, "draft_n_accepted": 5}}).accepted == 5
    c = counters_from_body({"usage": {"drafted_tokens": 4, "accepted_tokens": 1}})
    assert c is not None and (c.drafted, c.source) == (4, "usage")
    vllm = {
        "metrics": {"speculative_decoding": {"num_draft_tokens": 6, "num_accepted_draft_tokens": 3}}
    }
    assert counters_from_body(vllm).acceptance_rate == 0.5  # type: ignore[union-attr]
    assert counters_from_body({"usage": {"completion_tokens": 3}}) is None
    text = (
        '# HELP x\nvllm:spec_decode_num_draft_tokens_total{model="a"} 10\n'
        'vllm:spec_decode_num_draft_tokens_total{model="b"} 5\n'
        'vllm:spec_decode_num_accepted_tokens_total{model="a"} 7\nplain 2\nbad line\n'
    )
    m = parse_prometheus(text)
    assert m["vllm:spec_decode_num_draft_tokens_total"] == 15 and m["plain"] == 2
    delta = metrics_counters({"vllm:spec_decode_num_draft_tokens_total": 5}, m)
    assert delta is not None and (delta.drafted, delta.accepted) == (10, 7)


def test_urls_are_normalised_and_checked() -> None:
    assert normalise_url("http://h:1/v1/") == "http://h:1"
    assert normalise_url(" https://h ") == "https://h"
    for bad in ("localhost:8000", "ftp://h", "http://"):
        with pytest.raises(EndpointError):
            normalise_url(bad)


def test_first_difference_statistics_and_the_swap_fault() -> None:
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2
    s = statistics_of("  The cat sat down")
    assert (s["piece 1"], s["piece 2"], s["piece 3"]) == ("The", "cat", "sat")
    assert statistics_of("x")["piece 2"] == "<none>"
    assert swap_first_two("<1><2><3>") == "<2><1><3>"
    assert swap_first_two(" The cat sat") == " cat The sat"


def _reply(text: str, tokens: list[str] | None, rows: list[dict[str, float]] | None) -> Reply:
    return Reply(
        text=text,
        finish_reason="length",
        e2e_s=1.0,
        ttft_s=None,
        n_tokens=None,
        tokens_source="none",
        n_chunks=0,
        counters=None,
        tokens=tuple(tokens) if tokens is not None else None,
        top_logprobs=tuple(rows) if rows is not None else None,
    )


def test_greedy_divergence_is_shown_and_classified() -> None:
    same = compare_greedy("p", _reply("a b", None, None), _reply("a b", None, None), 0.1)
    assert same.status == "identical"
    on = _reply("The cat", ["The", " cat"], [{"The": -0.1}, {" cat": -1.0, " dog": -1.05}])
    off = _reply("The dog", ["The", " dog"], [{"The": -0.1}, {" dog": -1.0, " cat": -1.04}])
    tie = compare_greedy("p", on, off, 0.1)
    assert tie.status == "near-tie" and tie.token_index == 1 and tie.char_index == 4
    assert tie.on_next == "cat" and tie.off_next == "dog" and tie.context == "The "
    assert tie.gap_on == pytest.approx(0.05) and tie.gap_off == pytest.approx(0.04)
    far = _reply("The dog", ["The", " dog"], [{"The": -0.1}, {" dog": -0.1, " cat": -3.0}])
    assert compare_greedy("p", on, far, 0.1).status == "differs"
    blind = compare_greedy("p", _reply("ab", None, None), _reply("ac", None, None), 0.1)
    assert blind.status == "differs" and "no logprobs" in blind.reason


def test_sampled_tests_reject_a_shifted_sample_and_state_their_power() -> None:
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta"])
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    plan = EndpointCertifyPlan(prompts=("x",), samples=200, power_trials=50)

    def draw(probs: np.ndarray, n: int) -> list[str]:
        return [f"{w} {w}" for w in rng.choice(words, size=n, p=probs)]

    same = sampled_tests([draw(p, 200)], [draw(p, 200)], plan, np.random.default_rng(1))
    assert [t.name for t in same] == list(STATISTICS)
    assert not any(t.rejected for t in same)
    word1 = same[0]
    assert 0 < word1.min_detectable_tv < 0.5
    assert word1.simulated_power >= 0.6  # the analytic figure, re-checked by simulation
    shifted = sampled_tests([draw(q, 200)], [draw(p, 200)], plan, np.random.default_rng(1))
    assert shifted[0].rejected


def test_rate_limiter_spaces_request_starts() -> None:
    """Five starts at 20 per second on a frozen clock wait 0, 50, 100, 150, 200 ms (the
    limiter's plan, read from the sleeps it asks for; no wall time involved)."""
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async def starts(rate: float | None) -> list[float]:
        waits.clear()
        limiter = RateLimiter(rate, clock=lambda: 100.0, sleep=record)
        await asyncio.gather(*(limiter.wait() for _ in range(5)))
        return sorted(waits)

    assert asyncio.run(starts(20.0)) == pytest.approx([0.05, 0.10, 0.15, 0.20])
    assert asyncio.run(starts(None)) == []  # no limit: nobody waits


# -- the client against specdec serve -------------------------------------------------------------


def test_client_streams_times_and_reads_counters(url: str) -> None:
    async def go() -> tuple[Reply, Reply, Reply]:
        cfg = EndpointConfig(url)
        async with EndpointClient(cfg, rng=random.Random(0)) as c:
            assert await c.resolve_model() == "mock"
            req = Request("hello", 12, temperature=0.0, seed=1)
            streamed = await c.generate(req)
            whole = await c.generate(Request("hello", 12, temperature=0.0, seed=1, stream=False))
        off_cfg = EndpointConfig(url, extra_body={"speculative": {"n_max": 0}})
        async with EndpointClient(off_cfg, rng=random.Random(0)) as c:
            await c.resolve_model()
            off = await c.generate(req)
        return streamed, whole, off

    streamed, whole, off = asyncio.run(go())
    assert streamed.text == whole.text == off.text  # greedy: the target's own output
    assert streamed.ttft_s is not None and 0 < streamed.ttft_s <= streamed.e2e_s
    assert streamed.n_tokens == 12 and streamed.tokens_source == "usage"
    assert streamed.decode_tps is not None and streamed.decode_tps > 0
    assert streamed.counters is not None and streamed.counters.drafted > 0
    assert off.counters is not None and off.counters.drafted == 0


def test_retries_with_backoff_after_503(url: str) -> None:
    app = proxy_app(url, ProxyFaults(fail_first=2))
    with running_app(app) as proxy:

        async def go() -> Reply:
            cfg = EndpointConfig(proxy, retries=2, backoff_s=0.01)
            async with EndpointClient(cfg, rng=random.Random(0)) as c:
                await c.resolve_model()
                return await c.generate(Request("hello", 4, stream=False))

        assert asyncio.run(go()).attempts == 3


# -- bench -----------------------------------------------------------------------------------------


def test_bench_one_server_per_request_switch_sweep_report_and_resume(
    url: str, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b.jsonl"
    argv = [
        "bench",
        "--endpoint",
        url,
        "--prompts",
        str(prompts),
        "--concurrency",
        "1,2",
        "--max-new-tokens",
        "8",
        "--modes",
        "greedy,sampled",
        "--out",
        str(out),
        "--no-progress",
    ]
    rc, stdout, err = run_cli(argv, capsys)
    assert rc == 0, err
    recs = records(out)
    reqs = [r for r in recs if r["type"] == "endpoint_request"]
    groups = [r for r in recs if r["type"] == "endpoint_group"]
    # 2 modes x (concurrency 1: 2 groups, concurrency 2: 1 group) x 2 sides
    assert len(groups) == 2 * 3 * 2 and len(reqs) == 2 * 2 * 2 * 2
    assert all(r["drafted"] == 0 for r in reqs if r["side"] == "off")
    assert sum(r["drafted"] for r in reqs if r["side"] == "on") > 0
    assert all(r["ttft_s"] is not None and r["n_tokens"] == 8 for r in reqs)
    # the same prompts and seeds on both sides
    key = lambda r: (r["mode"], r["concurrency"], r["group"], r["slot"])  # noqa: E731
    on = {key(r): (r["prompt_id"], r["seed"]) for r in reqs if r["side"] == "on"}
    off = {key(r): (r["prompt_id"], r["seed"]) for r in reqs if r["side"] == "off"}
    assert on == off
    report = (tmp_path / "b-report" / "report.md").read_text()
    # 2 clients, 2 requests on the wire at the peak (measured at the client), spec-on
    assert re.search(r"\| 2 \| 2 / [\d.]+ \| on \|", report) and "throughput on/off" in report
    assert (tmp_path / "b-report" / "throughput.png").stat().st_size > 0
    rc, stdout, err = run_cli([*argv, "--resume"], capsys)
    assert rc == 0, err
    assert "0 groups measured" in stdout and "12 already there" in stdout
    rc, stdout, _ = run_cli(["report", str(out), "--out", str(tmp_path / "r")], capsys)
    assert rc == 0 and (tmp_path / "r" / "report.md").exists()


def test_bench_two_servers(
    url: str, plain_url: str, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "two.jsonl"
    rc, _, err = run_cli(
        [
            "bench",
            "--endpoint",
            url,
            "--endpoint-off",
            plain_url,
            "--prompts",
            str(prompts),
            "--concurrency",
            "1",
            "--max-new-tokens",
            "6",
            "--out",
            str(out),
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 0, err
    header = records(out)[0]
    assert header["switch"] == "two-servers" and header["endpoint_off"] == plain_url


# -- errors: one line, exit 2 ----------------------------------------------------------------


def one_line_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_unreachable_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for cmd in ("bench", "certify"):
        rc, _, err = run_cli(
            [cmd, "--endpoint", dead, "--retries", "1", "--out", str(tmp_path / cmd)], capsys
        )
        assert rc == 2
        one_line_error(err, "cannot reach", "after 2 attempts")


def test_wrong_model_and_bad_url(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(["bench", "--endpoint", url, "--endpoint-model", "nope"], capsys)
    assert rc == 2
    one_line_error(err, "does not serve the model 'nope'", "'mock'")
    rc, _, err = run_cli(["certify", "--endpoint", "localhost:8000"], capsys)
    assert rc == 2
    one_line_error(err, "not an http:// or https:// URL")
    rc, _, err = run_cli(["bench", "--endpoint", url, "--k", "4"], capsys)
    assert rc == 2
    one_line_error(err, "--k", "--endpoint")


@pytest.mark.parametrize(
    ("faults", "needle"),
    [
        (ProxyFaults(strip_counters=True), "reports no speculative counters"),
        (ProxyFaults(drop_switch=True), "ignored speculative.n_max = 0"),
    ],
)
def test_a_per_request_switch_that_cannot_be_verified_needs_a_second_url(
    url: str, faults: ProxyFaults, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_app(proxy_app(url, faults)) as proxy:
        rc, _, err = run_cli(
            ["bench", "--endpoint", proxy, "--out", str(tmp_path / "x.jsonl")], capsys
        )
    assert rc == 2
    one_line_error(err, needle, "--endpoint-off")


# -- certify -----------------------------------------------------------------------------------

CERTIFY = ["--quick", "--samples", "100", "--sample-tokens", "2", "--max-new-tokens", "16"]


def test_certify_passes_against_specdec_serve(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cert"
    rc, stdout, err = run_cli(["certify", "--endpoint", url, *CERTIFY, "--out", str(out)], capsys)
    assert rc == 0, stdout + err
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["verdict"] == "PASS", cert
    assert all(c["status"] == "identical" for c in cert["greedy"])
    assert cert["drafted_on"] > cert["accepted_on"] > 0  # rejections happened
    assert not any(t["rejected"] for t in cert["sampled_tests"])
    assert "What this cannot show" in (out / "certificate.md").read_text()
    assert stdout.startswith("endpoint certificate: PASS")


def test_certify_fails_against_a_proxy_that_swaps_tokens(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = proxy_app(url, ProxyFaults(perturb_rate=0.5, seed=3))
    with running_app(app) as proxy:
        out = tmp_path / "cert"
        rc, stdout, err = run_cli(
            ["certify", "--endpoint", proxy, *CERTIFY, "--out", str(out)], capsys
        )
    assert app.state.counts["perturbed"] > 0
    assert rc == 1, stdout + err
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["verdict"] == "FAIL"
    assert any(t["rejected"] for t in cert["sampled_tests"])
    assert all(c["status"] == "identical" for c in cert["greedy"])  # greedy is untouched


def test_a_group_measured_again_after_a_crash_replaces_the_partial_one() -> None:
    from specdec.bench.endpoint.report import complete_requests

    def req(slot: int, e2e: float) -> dict[str, Any]:
        return {
            "type": "endpoint_request",
            "mode": "greedy",
            "concurrency": 2,
            "repeat": 0,
            "group": 0,
            "side": "on",
            "slot": slot,
            "e2e_s": e2e,
        }

    group = {
        "type": "endpoint_group",
        "mode": "greedy",
        "concurrency": 2,
        "repeat": 0,
        "group": 0,
        "side": "on",
    }
    # a crash after slot 0 of the first attempt; the resumed run measures both slots again
    recs = [req(0, 9.0), req(0, 1.0), req(1, 2.0), group, req(0, 5.0)]  # last: unfinished
    assert sorted(r["e2e_s"] for r in complete_requests(recs)) == [1.0, 2.0]


def test_the_power_check_shift_has_the_stated_tv_also_with_a_dominant_category() -> None:
    from specdec.stats.simulated import hardest_alternative

    for p in (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.8, 0.1, 0.06, 0.04])):
        alt = hardest_alternative(p, 0.15)
        assert alt is not None
        assert 0.5 * np.abs(alt - p).sum() == pytest.approx(0.15)
    assert hardest_alternative(np.array([0.5, 0.5]), 0.6) is None


def test_endpoint_off_alone_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("bench", "certify"):
        rc, _, err = run_cli([cmd, "--endpoint-off", "http://127.0.0.1:9"], capsys)
        assert rc == 2
        one_line_error(err, "--endpoint-off needs --endpoint")


def test_a_server_that_wants_a_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pair = mock_serve_pair(draft="identical", vocab=64)
    with running_server(pair, k=2, api_key="sekret") as base:
        rc, _, err = run_cli(["bench", "--endpoint", base, "--out", str(tmp_path / "a")], capsys)
        assert rc == 2
        one_line_error(err, "HTTP 401", "--api-key")
        out = tmp_path / "b.jsonl"
        argv = ["bench", "--endpoint", base, "--api-key", "sekret", "--prompts"]
        prompts = tmp_path / "p.txt"
        prompts.write_text("hi\n")
        rc, _, err = run_cli(
            [
                *argv,
                str(prompts),
                "--concurrency",
                "1",
                "--max-new-tokens",
                "4",
                "--out",
                str(out),
                "--no-progress",
            ],
            capsys,
        )
        assert rc == 0, err


def test_a_server_that_hangs_times_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def models(_: HttpRequest) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "slow"}]})

    async def hang(_: HttpRequest) -> JSONResponse:
        # past the client's 0.3 s; without the timeout the client would get this empty body
        # and fail with another message than the one checked below
        await asyncio.sleep(3)
        return JSONResponse({})

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", hang, methods=["POST"]),
        ]
    )
    with running_app(app) as base:
        rc, _, err = run_cli(
            [
                "bench",
                "--endpoint",
                base,
                "--timeout",
                "0.3",
                "--retries",
                "0",
                "--out",
                str(tmp_path / "t.jsonl"),
            ],
            capsys,
        )
        assert rc == 2
    one_line_error(err, "sent nothing for 0.3 s (timeout)", "after 1 attempt")


def test_dry_run_prints_the_plan_without_sending_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    rc, out, _ = run_cli(["bench", "--endpoint", dead, "--quick", "--dry-run"], capsys)
    assert rc == 0
    assert "speculative.n_max = 0" in out and "prompts: 3; concurrency 1, 2" in out
