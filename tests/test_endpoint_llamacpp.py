"""`specdec bench --endpoint` and `specdec certify --endpoint` against llama-cpp-python's own
OpenAI server (`python -m llama_cpp.server`) on loopback with the small test model: one
server with prompt-lookup speculation, one without; and a proxy that swaps tokens of the
spec-on server's sampled completions now and then, which the certificate must FAIL.

Sizes are small so that the file runs in a few minutes on 2 cores; the verdicts' power at
these sizes is stated in the certificates they write."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpoint_harness import (
    ProxyFaults,
    llama_cpp_server,
    llama_server_or_skip,
    proxy_app,
    running_app,
)
from specdec.cli import main
from tiny_models import store_model_or_skip

pytestmark = [pytest.mark.real_model, pytest.mark.llamacpp, pytest.mark.slow]

PROMPTS = (
    "List the numbers: one two three four, one two three four, one two three four,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
)
CERTIFY = [
    "--quick",
    "--samples",
    "60",
    "--sample-tokens",
    "4",
    "--max-new-tokens",
    "24",
    "--timeout",
    "60",
]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    """(spec-on URL with prompt lookup, spec-off URL)."""
    llama_server_or_skip()
    model = store_model_or_skip()
    with (
        llama_cpp_server(model, lookup=4) as on,
        llama_cpp_server(model, lookup=None) as off,
    ):
        yield on, off


@pytest.fixture()
def prompt_file(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in PROMPTS), encoding="utf-8")
    return p


def test_bench_reports_on_off_speed_and_a_concurrency_sweep(
    servers: tuple[str, str],
    prompt_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    on, off = servers
    out = tmp_path / "bench.jsonl"
    rc = main(
        [
            "bench",
            "--endpoint",
            on,
            "--endpoint-off",
            off,
            "--endpoint-api",
            "completions",
            "--prompts",
            str(prompt_file),
            "--concurrency",
            "1,2",
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
            "--timeout",
            "60",
            "--no-progress",
        ]
    )
    _, err = capsys.readouterr()
    assert rc == 0, err
    report = (tmp_path / "bench-report" / "report.md").read_text()
    for c in (1, 2):
        for side in ("on", "off"):  # c clients, c requests on the wire at the peak
            assert re.search(rf"\| {c} \| {c} / [\d.]+ \| {side} \|", report), report
    assert "x |" in report  # the on/off ratios
    reqs = [json.loads(x) for x in out.read_text().splitlines()]
    reqs = [r for r in reqs if r["type"] == "endpoint_request"]
    assert all(r["ttft_s"] and r["e2e_s"] >= r["ttft_s"] for r in reqs)
    assert all(r["tokens_source"] in ("usage", "chunks") and r["n_tokens"] > 0 for r in reqs)


def test_certify_passes_with_prompt_lookup_on(
    servers: tuple[str, str],
    prompt_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    on, off = servers
    out = tmp_path / "cert"
    rc = main(
        [
            "certify",
            "--endpoint",
            on,
            "--endpoint-off",
            off,
            "--prompts",
            str(prompt_file),
            *CERTIFY,
            "--out",
            str(out),
        ]
    )
    stdout, err = capsys.readouterr()
    cert = json.loads((out / "certificate.json").read_text())
    assert rc == 0, stdout + err + json.dumps(cert["greedy"])
    assert cert["verdict"].startswith("PASS")
    assert not any(t["rejected"] for t in cert["sampled_tests"])


def test_certify_fails_against_a_token_swapping_proxy(
    servers: tuple[str, str],
    prompt_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    on, off = servers
    app = proxy_app(on, ProxyFaults(perturb_rate=0.5, seed=1))
    with running_app(app) as broken:
        out = tmp_path / "cert"
        rc = main(
            [
                "certify",
                "--endpoint",
                broken,
                "--endpoint-off",
                off,
                "--prompts",
                str(prompt_file),
                *CERTIFY,
                "--out",
                str(out),
            ]
        )
    stdout, err = capsys.readouterr()
    assert app.state.counts["perturbed"] > 0
    assert rc == 1, stdout + err
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["verdict"] == "FAIL" and any(t["rejected"] for t in cert["sampled_tests"])
