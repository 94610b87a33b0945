"""`certify --endpoint` against token-id servers (the parts of vLLM's API it uses, over mock
models, in-process on loopback): the per-token test, both servers at once, --resume; and
unit checks of the per-token transform, the reply parsers and the timing warnings."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from endpoint_harness import TokenServerState, running_app, token_server_app
from specdec.certify.endpoint.pace import Pace
from specdec.certify.endpoint.pertoken import pit_of_completion
from specdec.cli import main
from specdec.endpoint.client import token_ids_of
from specdec.endpoint.schema import ShapeError, logprobs, prompt_logprobs

pytest.importorskip("starlette")

# 3 prompts x 30 requests per side x 5 tokens: 450 per-token values
CERTIFY = [
    "--greedy-prompts",
    "1",
    "--max-new-tokens",
    "6",
    "--sampled-prompts",
    "3",
    "--samples",
    "30",
    "--sample-tokens",
    "5",
    "--timeout",
    "30",
]


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("hello there\nabcabcabcabc\nxyz\n", encoding="utf-8")
    return p


def certify(
    on: str, off: str, out: Path, prompts: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str, dict[str, Any]]:
    argv = ["certify", "--endpoint", on, "--endpoint-off", off, "--prompts", str(prompts)]
    rc = main([*argv, *CERTIFY, "--out", str(out), *extra])
    stdout, err = capsys.readouterr()
    path = out / "certificate.json"
    cert = json.loads(path.read_text()) if path.exists() else {}
    return rc, stdout, err, cert


@pytest.fixture()
def servers() -> Iterator[tuple[str, str, TokenServerState]]:
    shared = TokenServerState()
    with (
        running_app(token_server_app(shared=shared, delay=0.002)) as on,
        running_app(token_server_app(shared=shared, delay=0.002)) as off,
    ):
        yield on, off, shared


def test_the_per_token_test_passes_a_faithful_server_and_both_servers_work_at_once(
    servers: tuple[str, str, TokenServerState],
    prompts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    on, off, shared = servers
    rc, stdout, err, cert = certify(on, off, tmp_path / "c", prompts, capsys)
    assert rc == 0, stdout + err
    pt = cert["pertoken_test"]
    assert pt is not None and not pt["rejected"]
    assert pt["n_tokens"] == 3 * 30 * 5 and pt["n_completions"] == 90
    assert all(0 < v < 0.5 for v in pt["min_detectable_tv"].values())
    assert "per-token not rejected" in stdout
    assert stdout.splitlines()[1].startswith("power: the sampled tests find a TV of")
    assert "the per-token test finds a per-token TV of" in stdout
    # two servers: both at work at once, each with one request at a time (no batching)
    assert shared.max_in_flight == 2
    t = cert["timing"]
    assert t["on"]["requests"] == t["off"]["requests"] == 90 and t["score"]["requests"] == 90
    assert set(t["phases_s"]) >= {"setup", "greedy", "sampled", "analysis"}
    md = (tmp_path / "c" / "certificate.md").read_text()
    assert "## Per-token test" in md and "## Time" in md and "## Power" in md


def test_a_prompt_files_predictions_go_with_each_of_its_generation_requests(
    servers: tuple[str, str, TokenServerState],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A prompt file with predictions (OpenAI's ``prediction``, e.g. ``code_predict``): every
    greedy and sampled request of a prompt carries its prediction, to both sides (a server
    without the feature ignores it, a lossless one is unchanged by it); the per-token scoring
    requests carry none."""
    on, off, shared = servers
    lines = [
        {"prompt": "hello there", "prediction": "there hello"},
        {"prompt": "abcabcabcabc"},
        {"prompt": "xyz", "prediction": "zyx"},
    ]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    rc, stdout, err, cert = certify(on, off, tmp_path / "c", path, capsys)
    assert rc == 0, stdout + err
    assert cert["plan"]["n_predictions"] == 2 and "predictions" not in cert["plan"]
    want = {x["prompt"]: x.get("prediction") for x in lines}
    # the plan's requests (the probes send prompts of their own, without predictions)
    generation = [b for b in shared.bodies if b[2] is None and b[0] in want]
    scoring = [b for b in shared.bodies if b[2] is not None]
    assert len(generation) >= 2 * (1 + 3 * 30) and scoring
    for prompt, prediction, _ in generation:
        expected = want[prompt]
        assert prediction == (
            None if expected is None else {"type": "content", "content": expected}
        ), prompt
    assert all(p is None for _, p, _ in scoring)
    md = (tmp_path / "c" / "certificate.md").read_text()
    assert "2 of 3 prompts carry a prediction" in md


def test_the_per_token_test_fails_a_server_that_samples_at_the_wrong_temperature(
    prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        running_app(token_server_app(sharpen=1.5)) as on,
        running_app(token_server_app()) as off,
    ):
        rc, stdout, err, cert = certify(on, off, tmp_path / "c", prompts, capsys)
    assert rc == 1, stdout + err
    assert cert["verdict"] == "FAIL"
    assert cert["pertoken_test"]["rejected"]
    assert cert["greedy"][0]["status"] == "identical"  # greedy cannot see a temperature


def test_resume_sends_only_the_missing_requests_and_gives_the_same_certificate(
    prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ExitStack() as stack:
        off = stack.enter_context(running_app(token_server_app()))
        crashing = token_server_app(fail_after=50)
        on_crash = stack.enter_context(running_app(crashing))
        rc, stdout, err, _ = certify(on_crash, off, tmp_path / "r", prompts, capsys)
        assert rc == 2 and "HTTP 400" in err, stdout + err
        progress = (tmp_path / "r" / "progress.jsonl").read_text().splitlines()
        assert 30 < len(progress) < 300
        healthy = token_server_app()
        on = stack.enter_context(running_app(healthy))
        # resuming against another URL is refused: the progress file belongs to one setup
        rc, _, err, _ = certify(on, off, tmp_path / "r", prompts, capsys, "--resume")
        assert rc == 2 and "different configuration" in err
        # the same URL again (the crashed server restarted): only the rest is sent
        crashing.state.counts.requests = -(10**6)
        rc, stdout, err, resumed = certify(
            on_crash, off, tmp_path / "r", prompts, capsys, "--resume"
        )
        assert rc == 0, stdout + err
        assert resumed["timing"]["reused_from_progress"] > 30
        rc, _, _, clean = certify(on, off, tmp_path / "clean", prompts, capsys)
    assert rc == 0
    for key in ("sampled_tests", "pertoken_test", "greedy"):
        a, b = resumed[key], clean[key]
        if key == "pertoken_test":
            a, b = (
                {k: a[k] for k in ("n_tokens", "pvalue")},
                {k: b[k] for k in ("n_tokens", "pvalue")},
            )
        if key == "sampled_tests":
            a = [(t["statistic"], t["pvalue"]) for t in a]
            b = [(t["statistic"], t["pvalue"]) for t in b]
        assert a == b, key


def test_pertoken_off_and_a_server_without_token_ids(
    servers: tuple[str, str, TokenServerState],
    prompts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    on, off, _ = servers
    rc, stdout, _, cert = certify(on, off, tmp_path / "a", prompts, capsys, "--pertoken", "off")
    assert rc == 0 and cert["pertoken_test"] is None and cert["pertoken_note"] == "turned off"
    assert "no per-token test (turned off)" in stdout
    rc, _, _, cert = certify(on, off, tmp_path / "b", prompts, capsys, "--temperature", "0.8")
    assert rc == 0 and cert["pertoken_test"] is None
    assert "temperature 1" in cert["pertoken_note"]


# -- units -------------------------------------------------------------------------------------


def test_pit_of_a_coarsened_row_by_hand() -> None:
    """Row: token 7 rank 1 (p 0.5), token 3 rank 2 (p 0.3), token 9 rank 5 (outside the top 2,
    p 0.05). Top 2 -> categories [7, 3, rest (0.2)]; U = F(x-) + v p(x)."""
    row = {7: (math.log(0.5), 1), 3: (math.log(0.3), 2), 9: (math.log(0.05), 5)}
    v = np.array([0.5, 0.5, 0.25])
    u = pit_of_completion([row, row, row], [7, 3, 9], v, top=2)
    np.testing.assert_allclose(u, [0.25, 0.5 + 0.15, 0.8 + 0.25 * 0.2])
    with pytest.raises(Exception, match="line up"):
        pit_of_completion([row], [7, 3], v, top=2)


def test_pit_of_the_coarsened_row_is_uniform_under_the_null() -> None:
    """Tokens drawn from a Zipf row: the PIT values of a top-5 + rest coarsening are U(0, 1)
    (Kolmogorov-Smirnov at 0.001; seeded)."""
    from scipy import stats as sps

    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, 41) ** 1.2
    p /= p.sum()
    lp = np.log(p)
    row = {t: (float(lp[t]), t + 1) for t in range(40)}
    toks = rng.choice(40, size=4000, p=p)
    u = pit_of_completion([row] * 4000, [int(t) for t in toks], rng.random(4000), top=5)
    assert sps.kstest(u, "uniform").pvalue > 0.001


def test_token_ids_and_prompt_logprobs_are_parsed() -> None:
    assert token_ids_of(["token_id:5", "token_id:12"]) == (5, 12)
    assert token_ids_of(["token_id:5", "hello"]) is None and token_ids_of(None) is None
    rows = prompt_logprobs(
        [None, {"5": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}], "prompt_logprobs"
    )
    assert rows == (None, {5: (-0.1, 1)})
    assert prompt_logprobs(None, "prompt_logprobs") is None
    with pytest.raises(ShapeError, match=r"prompt_logprobs\[0\]\['x'\] is not a token id"):
        prompt_logprobs([{"x": {"logprob": -1}}], "prompt_logprobs")
    with pytest.raises(ShapeError, match="prompt_logprobs is a string"):
        prompt_logprobs("nope", "prompt_logprobs")


def test_a_much_slower_side_is_named() -> None:
    said: list[str] = []
    pace = Pace(log=said.append)
    for _ in range(8):
        pace.request("off", 0.1, 1)
        pace.request("on", 2.0, 2)
    assert pace.slow_note and pace.slow_note.startswith("spec-on requests take 20x")
    assert said == [f"warning: {pace.slow_note}"]
    d = pace.to_dict()
    assert d["on"]["retries"] == 8 and d["off"]["requests"] == 8
    quiet = Pace()
    for _ in range(10):
        quiet.request("off", 0.1, 1)
        quiet.request("on", 0.3, 1)
    assert quiet.slow_note is None


def test_a_time_budget_lowers_the_sample_count_after_a_pilot(
    prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.1 s per request and 36 s in all: a pilot times the requests, and the sampled part
    shrinks from 100 to what fits (never below 30); the certificate says so."""
    with (
        running_app(token_server_app(delay=0.1)) as on,
        running_app(token_server_app(delay=0.1)) as off,
    ):
        extra = ("--samples", "100", "--max-minutes", "0.6", "--pertoken", "off")
        rc, stdout, err, cert = certify(on, off, tmp_path / "b", prompts, capsys, *extra)
    assert rc == 0, stdout + err
    n = cert["plan"]["samples"]
    assert 30 <= n < 100
    assert any(f"fits {n} of 100 sampled requests" in note for note in cert["notes"])
    assert cert["timing"]["on"]["requests"] == cert["timing"]["off"]["requests"] == 3 * n
    assert "pilot" in cert["timing"]["phases_s"]


def test_a_follow_up_row_classifies_a_divergence_at_a_drafted_token() -> None:
    """llama-server returns no row for tokens accepted from the draft: the spec-on gap then
    comes from a second request for that position's row (its absolute value counts)."""
    from specdec.certify.endpoint.greedy import compare_greedy
    from specdec.endpoint.client import Reply

    def reply(text: str, toks: list[str], rows: list[dict[str, float]]) -> Reply:
        return Reply(text, "length", 1.0, None, None, "none", 0, None, tuple(toks), tuple(rows))

    on = reply("ab", ["a", "b"], [{"a": -0.1}, {}])  # the drafted "b" has no row
    off = reply("ac", ["a", "c"], [{"a": -0.1}, {"c": -0.70, "b": -0.75}])
    blind = compare_greedy("p", on, off, 0.1)
    assert blind.status == "differs" and blind.gap_on is None
    tie = compare_greedy("p", on, off, 0.1, follow_up=({"c": -0.68, "b": -0.72}, None))
    assert tie.status == "near-tie" and tie.gap_on_source == "follow-up"
    assert tie.gap_on == pytest.approx(0.04) and tie.gap_off_source == "reported"
    far = compare_greedy("p", on, off, 0.1, follow_up=({"c": -0.1, "b": -2.0}, None))
    assert far.status == "differs"
    ids = logprobs({"content": [{"id": 5, "token": "a"}, {"id": 7, "token": "b"}]}, "lp")
    assert ids is not None and ids.ids == (5, 7)
    no_ids = logprobs({"content": [{"token": "a"}]}, "lp")
    assert no_ids is not None and no_ids.ids is None
