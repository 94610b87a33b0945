"""Hostile but fair input to the command line (issue 12): every case ends in one clear line
on stderr and the stated exit status, never a traceback. Table-driven, on mock models so it
runs in seconds; each case is (argv, expected exit, words the message starts with)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from specdec.cli import main

CASE_SECONDS = 120  # every case is bounded: a hang fails the case instead of stalling CI


class CaseHung(BaseException):
    """Raised by the alarm; not an OSError, so the CLI's error handling cannot swallow it."""


@pytest.fixture(autouse=True)
def _bounded_in_time() -> object:
    import signal

    def hung(signum: int, frame: object) -> None:
        raise CaseHung(f"the case ran for more than {CASE_SECONDS} s (a hang)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(CASE_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


MOCK = ["--target", "mock:target", "--target-backend", "mock", "--draft-backend", "mock"]
GEN = ["generate", *MOCK, "--draft", "mock:close", "--max-new-tokens", "4"]

CASES: list[tuple[str, list[str], int, str]] = [
    ("negative K", [*GEN, "-k", "-1", "hi"], 2, "specdec: error: k must be >= 0"),
    ("negative temperature", [*GEN, "--temperature", "-1", "hi"], 2, "specdec: error: temperature"),
    ("top-p zero", [*GEN, "--top-p", "0", "hi"], 2, "specdec: error: top_p must be in (0, 1]"),
    ("top-p above one", [*GEN, "--top-p", "1.5", "hi"], 2, "specdec: error: top_p must be"),
    ("negative top-k", [*GEN, "--top-k", "-2", "hi"], 2, "specdec: error: top_k must be"),
    ("empty prompt", [*GEN, "   "], 2, "specdec: error: the prompt is empty"),
    (
        "zero new tokens",
        [*GEN[:-2], "--max-new-tokens", "0", "hi"],
        2,
        "specdec: error: max_new_tokens must be >= 1",
    ),
    ("seed too large", [*GEN, "--seed", str(2**63), "hi"], 2, "specdec: error: --seed must"),
    ("negative seed", [*GEN, "--seed", "-1", "hi"], 2, "specdec: error: --seed must"),
    ("negative threads", [*GEN, "--threads", "-1", "hi"], 2, "specdec: error: --threads must"),
    ("tiny context", [*GEN, "--n-ctx", "1", "hi"], 2, "specdec: error: --n-ctx must"),
    (
        "prompt longer than the context",
        [*GEN, "--n-ctx", "8", "a long prompt of many bytes"],
        2,
        "specdec: error: the prompt has",
    ),
    (
        "bench seed too large",
        ["bench", "--config", "draft=mock:close,target=mock:target", "--seed", str(2**64)],
        2,
        "specdec: error: --seed must",
    ),
    ("argv bytes not UTF-8", [*GEN, "ab\udcffcd"], 2, "specdec: error: the prompt is not valid"),
    (
        "unknown model path",
        ["generate", "--target", "/no/such/model.gguf", "-k", "0", "hi"],
        2,
        "specdec: error: model '/no/such/model.gguf' is neither",
    ),
    (
        "vocabularies further apart than padding",
        ["generate", *MOCK, "--draft", "mock:close:200", "hi"],
        2,
        "specdec: error: draft vocabulary",
    ),
    (
        "unknown drafter option",
        ["generate", *MOCK, "--draft", "suffix:bogus=1", "hi"],
        2,
        "specdec: error: suffix option",
    ),
    (
        "models path on a file that is not a store model",
        ["models", "path", "/etc/hostname"],
        2,
        "specdec: error: '/etc/hostname' is not a store model",
    ),
    (
        "negative prompts per category",
        [
            "bench",
            "--config",
            "draft=mock:close,target=mock:target",
            "--prompts-per-category",
            "-1",
        ],
        2,
        "specdec: error: prompts_per_category (0 = all) must be >= 0",
    ),
    (
        "unknown n-gram size",
        ["generate", *MOCK, "--draft", "ngram:x", "hi"],
        2,
        "specdec: error: bad n-gram",
    ),
]


def assert_one_clear_line(err: str, words: str) -> None:
    """stderr holds no traceback and exactly one error line, which starts with ``words``."""
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("specdec: error")]
    assert len(lines) == 1, err
    assert lines[0].startswith(words), err


@pytest.mark.parametrize(("name", "argv", "code", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(
    name: str, argv: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    assert_one_clear_line(capsys.readouterr().err, words)


def test_stdin_bytes_not_utf8_name_their_position(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok \xff\xfe bad")))
    assert main([*GEN, "-"]) == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8 at byte 3" in err and "Traceback" not in err


def test_a_file_system_error_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    argv = ["models", "fetch", "smollm2-135m-instruct-q4_1", "--cache-dir", str(not_a_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error:") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_debug_keeps_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    argv = ["--debug", "models", "fetch", "smollm2-135m-instruct-q4_1", "--cache-dir"]
    assert main([*argv, str(not_a_dir)]) == 2
    assert "Traceback" in capsys.readouterr().err


# -- conventions (issue 13): llama.cpp / mlx-lm flag names, no prefix guessing, valid JSON --


def test_llama_cpp_style_flags_work(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "-m", "mock:target", "--target-backend", "mock", "--draft-backend"]
    argv += ["mock", "-md", "mock:close", "-n", "6", "--temp", "0.5", "--no-stop", "--json"]
    assert main([*argv, "-p", "hello"]) == 0
    a = json.loads(capsys.readouterr().out)
    long = ["generate", "--model", "mock:target", "--target-backend", "mock", "--draft-backend"]
    long += ["mock", "--draft-model", "mock:close", "--max-tokens", "6", "--temperature", "0.5"]
    assert main([*long, "--no-stop", "--json", "hello"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["tokens"] == b["tokens"] and a["n_tokens"] == 6


def test_prefixes_are_not_guessed_and_the_prompt_is_given_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):  # --max-new is not an option, nor a prefix of one
        main([*GEN, "--max-new", "3", "hi"])
    assert "unrecognized arguments" in capsys.readouterr().err
    assert main([*GEN, "-p", "a", "b"]) == 2
    assert "give the prompt once" in capsys.readouterr().err
    assert main([*GEN]) == 2


def test_json_is_valid_when_a_figure_is_undefined(capsys: pytest.CaptureFixture[str]) -> None:
    # K = 0: acceptance by position is empty and nothing is NaN-free by luck
    argv = ["generate", *MOCK, "-k", "0", "--max-new-tokens", "1", "--json", "hi"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    json.loads(out)
    # a far draft rejected at position 1: position 2 is never reached, its acceptance is
    # undefined (NaN inside) and must be null in the JSON
    argv = ["generate", *MOCK, "--draft", "mock:far", "-k", "4", "--max-new-tokens", "3"]
    assert main([*argv, "--no-stop", "--json", "hi"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out
    assert json.loads(out)["acceptance_by_position"] == [0.0, None]


@pytest.mark.parametrize("k", ["100000", str(10**12)])
def test_an_absurd_adaptive_k_is_capped_not_hung(
    k: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """-k far beyond the tokens wanted used to hang --adaptive (O(k^2) per round) or raise
    MemoryError; K is capped by the length and the context window."""
    from specdec.core.policy import capped_adaptive_k

    assert capped_adaptive_k(int(k), 4, 2048).k_max == 4
    assert main([*GEN, "--adaptive", "-k", k, "--json", "hi"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 4


def test_closed_standard_output_is_an_error_not_silence() -> None:
    """With file descriptor 1 closed every printed result would be lost while the exit said
    success; it is one line on stderr and exit 2."""
    import os
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "specdec", "models", "list"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == "specdec: error: standard output is closed"


def test_a_failed_load_leaves_no_file_that_blocks_the_next_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose model fails to load wrote only its session header; the next run used to be
    refused ("already holds results"). A header-only file holds nothing to lose."""
    out = str(tmp_path / "r.jsonl")
    bench = ["bench", "--k", "1", "--categories", "qa", "--out", out]
    assert main([*bench[:1], "--config", "draft=mock:close,target=/no/such.gguf", *bench[1:]]) == 2
    assert main([*bench[:1], "--config", "draft=mock:close,target=mock:target", *bench[1:]]) == 0
    assert "measurements written" in capsys.readouterr().out
    # a file with results is still protected
    assert main([*bench[:1], "--config", "draft=mock:close,target=mock:target", *bench[1:]]) == 2
    assert "already holds results" in capsys.readouterr().err


def test_report_on_records_missing_fields_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measurement records without the fields the report reads are counted as unreadable
    (they raised KeyError inside the report and left an empty report directory)."""
    out = tmp_path / "r.jsonl"
    argv = ["bench", "--config", "draft=mock:close,target=mock:target", "--k", "1"]
    assert main([*argv, "--categories", "qa", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    for r in recs:
        if r["type"] == "measurement":
            del r["tokens_per_second"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    capsys.readouterr()
    assert main(["report", str(bad), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"specdec: error: {bad} holds no measurements to report"]
    assert not (tmp_path / "rep").exists()


# -- cases that need files: (name, argv built from a scratch directory, exit, first words) --


def _truncated_gguf(d: Path) -> str:
    from tests.test_resource_limits import _write

    raw = _write(d / "whole.gguf").read_bytes()
    (d / "cut.gguf").write_bytes(raw[:-16])
    return str(d / "cut.gguf")


def _not_gguf(d: Path) -> str:
    (d / "notes.gguf").write_text("hello, not a model\n")
    return str(d / "notes.gguf")


def _a_directory(d: Path) -> str:
    (d / "dir.gguf").mkdir()
    return str(d / "dir.gguf")


def _a_file(d: Path) -> str:
    (d / "file").write_text("x")
    return str(d / "file")


BENCH_MOCK = ["bench", "--config", "draft=mock:close,target=mock:target", "--k", "1"]
FILE_CASES: list[tuple[str, object, int, str]] = [
    (
        "truncated GGUF",
        lambda d: ["generate", "--target", _truncated_gguf(d), "-k", "0", "hi"],
        2,
        "specdec: error: ",
    ),
    (
        "a text file named .gguf",
        lambda d: ["generate", "--target", _not_gguf(d), "-k", "0", "hi"],
        2,
        "specdec: error: ",
    ),
    (
        "a directory named .gguf on llama.cpp",
        lambda d: ["generate", "--target", _a_directory(d), "--target-backend", "llamacpp", "hi"],
        2,
        "specdec: error: the llama.cpp backend needs a GGUF file",
    ),
    (
        "bench --out inside a file",
        lambda d: [*BENCH_MOCK, "--categories", "qa", "--out", _a_file(d) + "/r.jsonl"],
        2,
        "specdec: error: ",
    ),
    (
        "report --out that is a file",
        lambda d: ["report", str(d / "none.jsonl"), "--out", _a_file(d)],
        2,
        "specdec: error: ",
    ),
    (
        "cache that cannot be created",
        lambda d: ["models", "fetch", "smollm2-135m-instruct-q4_1", "--cache-dir", "/proc/x/y"],
        2,
        "specdec: error: cannot create the model cache",
    ),
]


@pytest.mark.parametrize(
    ("name", "build", "code", "words"), FILE_CASES, ids=[c[0] for c in FILE_CASES]
)
def test_bad_files_are_one_clear_line(
    name: str,
    build: object,
    code: int,
    words: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = build(tmp_path)  # type: ignore[operator]
    assert main(argv) == code
    assert_one_clear_line(capsys.readouterr().err, words)


def test_closed_stdin_with_dash_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", None)
    assert main([*GEN, "-"]) == 2
    assert capsys.readouterr().err.strip() == (
        "specdec: error: the prompt is '-' but standard input is closed"
    )


# -- the same on the small real model (CI fetches it; skipped with a reason otherwise) --


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--n-ctx", "1000000000", "hi"], "specdec: error: --n-ctx 1000000000 is more than"),
        (["ab\udcffcd"], "specdec: error: the prompt is not valid"),
        (["-k", "-3", "hi"], "specdec: error: k must be >= 0"),
        (["--top-p", "0", "hi"], "specdec: error: top_p must be in (0, 1]"),
    ],
)
def test_small_real_model_bad_input(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.tiny_models import store_model_or_skip

    pytest.importorskip("llama_cpp")
    path = str(store_model_or_skip())
    argv = ["generate", "--target", path, "--target-backend", "llamacpp", "--draft", "ngram"]
    assert main([*argv, "-n", "2", *extra]) == 2
    assert_one_clear_line(capsys.readouterr().err, words)
