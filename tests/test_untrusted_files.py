"""Files and flags a user gives (issue 40 item 5, issue 42 item 5): a FIFO where a file is
expected is an error, not a hang; an API key that no HTTP header can carry is refused at
start; contradictory flags are one error; ``--resume`` without a run to resume is one error;
results and resume files are read with bounds and checked shapes; and text from them reaches
the terminal escaped."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.test_hostile_inputs import assert_one_clear_line

from specdec.cli import main

GUARD_SECONDS = 60  # a hang guard only


class CaseHung(BaseException):
    pass


@pytest.fixture(autouse=True)
def _guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def hung(signum: int, frame: object) -> None:
        raise CaseHung(f"the case ran for more than {GUARD_SECONDS} s (a hang)")

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(GUARD_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def fifo(d: Path, name: str = "fifo") -> str:
    os.mkfifo(d / name)
    return str(d / name)


MOCK = ["--target", "mock:target", "--target-backend", "mock", "--draft-backend", "mock"]
GEN = ["generate", *MOCK, "--draft", "mock:close", "--max-new-tokens", "2"]
SERVE = ["serve", "--target", "mock:target", "--target-backend", "mock", "--draft", "none"]
DEAD = "http://127.0.0.1:9"  # never contacted: every row fails before


def _resume_fifo(d: Path) -> list[str]:
    (d / "out").mkdir()
    fifo(d / "out", "progress.jsonl")
    return ["certify", "--levels", "1", "--quick", "--out", str(d / "out"), "--resume"]


# (name, argv built in a scratch directory, the first words of the one error line)
ROWS: list[tuple[str, Callable[[Path], list[str]], str]] = [
    # a FIFO where a file is expected: open() waited for a writer forever
    (
        "--api-key-file a FIFO (serve)",
        lambda d: [*SERVE, "--api-key-file", fifo(d)],
        "specdec: error: the API key file",
    ),
    (
        "--api-key-file a FIFO (bench --endpoint)",
        lambda d: ["bench", "--endpoint", DEAD, "--api-key-file", fifo(d)],
        "specdec: error: the API key file",
    ),
    ("--prompts a FIFO", lambda d: ["bench", "--endpoint", DEAD, "--prompts", fifo(d)], "spec"),
    ("--messages a FIFO", lambda d: [*GEN, "--messages", fifo(d)], "specdec: error: the mess"),
    ("--prediction a FIFO", lambda d: [*GEN, "--prediction", fifo(d), "hi"], "specdec: error:"),
    ("certify --resume from a FIFO", _resume_fifo, "specdec: error: the progress file"),
    (
        "certify --prompts a FIFO",
        lambda d: ["certify", "--endpoint", DEAD, "--prompts", fifo(d), "--out", str(d / "c")],
        "specdec: error: prompt file",
    ),
    # a key no HTTP header can carry
    ("serve --api-key clé", lambda d: [*SERVE, "--api-key", "clé"], "specdec: error: the API key"),
    (
        "bench --api-key-file holding clé",
        lambda d: ["bench", "--endpoint", DEAD, "--api-key-file", _key(d, "clé\n")],
        "specdec: error: the API key holds a character that is not ASCII (character 3 of 3)",
    ),
    (
        "certify --api-key with an emoji",
        lambda d: ["certify", "--endpoint", DEAD, "--api-key", "sk-\U0001f600", "--quick"],
        "specdec: error: the API key holds a character that is not ASCII",
    ),
    # contradictory flags
    (
        "generate --exact --no-exact",
        lambda d: [*GEN, "--exact", "--no-exact", "hi"],
        "specdec: error: --exact and --no-exact contradict each other",
    ),
    (
        "serve --no-exact --exact",
        lambda d: [*SERVE, "--no-exact", "--exact"],
        "specdec: error: --exact and --no-exact contradict each other",
    ),
    (
        "certify --exact --no-exact",
        lambda d: ["certify", "--levels", "1", "--exact", "--no-exact", "--out", str(d / "c")],
        "specdec: error: --exact and --no-exact contradict each other",
    ),
    # what the client cannot do, or a tolerance that is no tolerance
    (
        "certify --concurrency 10^6",
        lambda d: ["certify", "--endpoint", DEAD, "--concurrency", "1000000", "--quick"],
        "specdec: error: concurrency must be in 1..4,096, got 1000000",
    ),
    (
        "certify --tie-gap inf",
        lambda d: ["certify", "--endpoint", DEAD, "--tie-gap", "inf", "--quick"],
        "specdec: error: tie gap must be finite and >= 0, got inf",
    ),
    (
        "certify --tie-gap nan",
        lambda d: ["certify", "--endpoint", DEAD, "--tie-gap", "nan", "--quick"],
        "specdec: error: tie gap must be finite",
    ),
    # --resume with nothing to resume
    (
        "certify --resume, the directory missing",
        lambda d: ["certify", "--levels", "1", "--quick", "--resume", "--out", str(d / "nope")],
        f"specdec: error: cannot resume: the output directory {'{d}'}/nope does not exist",
    ),
    (
        "certify --resume, no progress file in it",
        lambda d: ["certify", "--levels", "1", "--quick", "--resume", "--out", str(d)],
        "specdec: error: cannot resume: ",
    ),
]


def _key(d: Path, text: str) -> str:
    (d / "key").write_text(text, encoding="utf-8")
    return str(d / "key")


@pytest.mark.parametrize(("name", "build", "words"), ROWS, ids=[r[0] for r in ROWS])
def test_rows(
    name: str,
    build: Callable[[Path], list[str]],
    words: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, err = run(build(tmp_path), capsys)
    assert rc == 2, err
    assert_one_clear_line(err, words.replace("{d}", str(tmp_path)))
    assert "clé" not in err and "\U0001f600" not in err  # the message never quotes a key


def test_a_non_ascii_key_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECDEC_API_KEY", "clé")
    rc, err = run([*SERVE], capsys)
    assert rc == 2
    assert_one_clear_line(err, "specdec: error: the API key holds a character that is not ASCII")


def test_an_ascii_key_still_works_both_ways() -> None:
    """The opposite verdict: a printable ASCII key passes the same check on both sides."""
    from specdec.endpoint.client import EndpointConfig
    from specdec.serve import ServeConfig, ServeSettings
    from specdec.util.credentials import read_api_key

    assert read_api_key("sk-Abc_123.~+/=", None) == "sk-Abc_123.~+/="
    assert EndpointConfig("http://h:1", api_key="sk-1").api_key == "sk-1"
    assert ServeConfig(ServeSettings(model_name="m"), api_key="sk-1").api_key == "sk-1"


def test_open_regular_refuses_what_is_not_a_file(tmp_path: Path) -> None:
    from specdec.errors import ConfigError
    from specdec.util.textfiles import read_text

    (tmp_path / "ok.txt").write_text("fine\n")
    assert read_text(tmp_path / "ok.txt", "the file") == "fine\n"
    os.symlink(tmp_path / "ok.txt", tmp_path / "link")
    assert read_text(tmp_path / "link", "the file") == "fine\n"  # a link to a file is a file
    for path, kind in (
        (fifo(tmp_path), "a FIFO (named pipe)"),
        ("/dev/zero", "a character device"),
        ("/dev/null", "a character device"),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"is not a regular file: it is {kind}")):
            read_text(path, "the file")
    with pytest.raises(ConfigError, match="it is a directory"):
        read_text(tmp_path, "the file")


# -- results and resume files: bounded, shape-checked ----------------------------------------


def test_a_progress_file_with_a_deep_line_and_a_bad_value(tmp_path: Path) -> None:
    """A progress line nested 100,000 deep raised RecursionError on --resume; it is a line
    to redo. A stored reply of the wrong shape is one line naming the unit."""
    from specdec.certify.endpoint.run import reply_from_json
    from specdec.certify.progress import ProgressLog
    from specdec.errors import ConfigError

    path = tmp_path / "progress.jsonl"
    log = ProgressLog(path, {"x": 1}, resume=False)
    log.put("good", {"text": "hi", "e2e_s": 1.0})
    with path.open("a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
        f.write(json.dumps({"key": "bad", "value": {"text": 5}}) + "\n")
    again = ProgressLog(path, {"x": 1}, resume=True)
    assert set(again.done) == {"good", "bad"}
    got = again.read("good", reply_from_json)
    assert got is not None and got.text == "hi"
    with pytest.raises(ConfigError, match="the stored unit 'bad' is not what this run wrote"):
        again.read("bad", reply_from_json)


def test_a_local_certificate_unit_of_the_wrong_shape_is_one_line(tmp_path: Path) -> None:
    from specdec.certify.progress import ProgressLog, revive
    from specdec.certify.synthetic import ExactCaseResult
    from specdec.errors import ConfigError

    log = ProgressLog(tmp_path / "p.jsonl", {"x": 1}, resume=False)
    good = {
        "name": "n", "kind": "k", "k": 2, "vocab": 4, "draft_tuples": 1, "outcomes": 3,
        "max_deviation": 0.0, "weighted_tv": 0.0, "passed": True,
    }  # fmt: skip
    log.put("ok", good)
    log.put("typed", {**good, "k": "two"})
    log.put("extra", {**good, "bogus": 1})
    assert log.read("ok", lambda v: revive(ExactCaseResult, v)) == ExactCaseResult(**good)
    for key, what in (("typed", "ExactCaseResult.k holds str"), ("extra", "no field 'bogus'")):
        with pytest.raises(ConfigError, match=what):
            log.read(key, lambda v: revive(ExactCaseResult, v))


def _endpoint_results(path: Path, **header: object) -> None:
    head = {
        "type": "endpoint_header", "schema": "specdec-endpoint-bench/1", "model": "m",
        "api": "chat", "switch": "two-servers", "endpoint_on": "http://a", "endpoint_off": "http://b",
        "plan": {"prompt_ids": ["p"], "concurrency": [1], "max_new_tokens": 2, "repeats": 1},
        "probe": {"notes": []}, **header,
    }  # fmt: skip
    key = {"mode": "greedy", "concurrency": 1, "repeat": 0, "group": 0}
    lines = [head]
    for side in ("on", "off"):
        lines.append(
            {"type": "endpoint_request", **key, "side": side, "slot": 0, "e2e_s": 1.0,
             "ttft_s": 0.1, "decode_tps": 5.0, "drafted": None, "accepted": None}
        )  # fmt: skip
        lines.append(
            {"type": "endpoint_group", **key, "side": side, "wall_s": 1.0, "n_tokens": 2,
             "metrics_drafted": None, "metrics_accepted": None}
        )  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_a_results_file_header_with_escape_sequences_is_written_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model name and the notes of a results file went into the report as they were."""
    path = tmp_path / "r.jsonl"
    _endpoint_results(path, model="\x1b[31mx", probe={"notes": ["\x1b]0;title\x07"]})
    rc, err = run(["report", str(path)], capsys)
    assert rc == 0, err
    md = (tmp_path / "r-report" / "report.md").read_text()
    assert "\x1b" not in md and "\\x1b[31mx" in md  # the model: in a code span
    # the note: outside text escaped for Markdown too (issue 62, item 5), so it shows as sent
    assert r"\\x1b\]0;title\\x07" in md


@pytest.mark.parametrize(
    ("field", "value"),
    [("slot", "x"), ("e2e_s", None), ("wall_s", "1"), ("concurrency", 0), ("n_tokens", [1])],
)
def test_endpoint_records_of_the_wrong_types_are_left_out(
    field: str, value: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specdec report`` on an endpoint results file whose records have the right keys and
    the wrong types failed with a traceback (ValueError, TypeError); such a record is left
    out, and with it gone the file holds no finished group: one line."""
    path = tmp_path / "r.jsonl"
    _endpoint_results(path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for rec in lines[1:]:
        if field in rec:
            rec[field] = value
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    rc, err = run(["report", str(path)], capsys)
    assert rc == 2
    assert_one_clear_line(err, f"specdec: error: {path} holds no finished spec-on/spec-off")


def test_quoted_lists_and_printable_text() -> None:
    from specdec.util.printable import printable, quoted_list

    assert printable("a\x1b[31mb\nc\td\u202ee") == "a\\x1b[31mb\\nc\\td\\u202ee"
    assert printable("café, 日本") == "café, 日本"  # printable text is left alone
    assert printable("x" * 10, 4) == "xxxx... (6 more characters)"
    assert quoted_list(f"m{i}" for i in range(12)) == (
        "'m0', 'm1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7', 'm8', 'm9', ... and 2 more"
    )
