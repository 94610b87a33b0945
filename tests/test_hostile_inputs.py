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

MOCK = ["--target", "mock:target", "--target-backend", "mock", "--draft-backend", "mock"]
GEN = ["generate", *MOCK, "--draft", "mock:close", "--max-new-tokens", "4"]

CASES: list[tuple[str, list[str], int, str]] = [
    ("negative K", [*GEN, "-k", "-1", "hi"], 2, "specdec: error: -k must be >= 0"),
    ("negative temperature", [*GEN, "--temperature", "-1", "hi"], 2, "specdec: error: temperature"),
    ("top-p zero", [*GEN, "--top-p", "0", "hi"], 2, "specdec: error: top_p must be in (0, 1]"),
    ("top-p above one", [*GEN, "--top-p", "1.5", "hi"], 2, "specdec: error: top_p must be"),
    ("negative top-k", [*GEN, "--top-k", "-2", "hi"], 2, "specdec: error: top_k must be"),
    ("empty prompt", [*GEN, "   "], 2, "specdec: error: the prompt is empty"),
    ("zero new tokens", [*GEN[:-2], "--max-new-tokens", "0", "hi"], 2, "specdec: error: --max"),
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
        "unknown n-gram size",
        ["generate", *MOCK, "--draft", "ngram:x", "hi"],
        2,
        "specdec: error: bad n-gram",
    ),
]


@pytest.mark.parametrize(("name", "argv", "code", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(
    name: str, argv: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("specdec: error")]
    assert len(lines) == 1, err
    assert lines[0].startswith(words), err


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
