"""`specdec generate` end to end on mock models, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.core.vocab import check_same_vocabulary
from specdec.errors import VocabMismatchError
from specdec.models.mock import MockLM, MockSpec, MockTokenizer

MOCK = [
    "--draft",
    "mock:close",
    "--draft-backend",
    "mock",
    "--target",
    "mock:target",
    "--target-backend",
    "mock",
]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_generate_streams_text_and_a_stats_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(
        capsys, "generate", "hello", *MOCK, "-k", "3", "--max-new-tokens", "12", "--no-stop"
    )
    assert rc == 0
    assert out.count("<") == 12  # the mock tokenizer prints one <id> per token
    assert "tok/s" in err and "acceptance by position" in err


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(
        capsys,
        "generate",
        "hello",
        *MOCK,
        "-k",
        "2",
        "--max-new-tokens",
        "9",
        "--json",
        "--temperature",
        "0.8",
        "--seed",
        "3",
        "--no-stop",
    )
    assert rc == 0
    res = json.loads(out)
    assert res["n_tokens"] == 9 and len(res["acceptance_by_position"]) == 2
    assert set(res["time_split"]) == {"prefill", "draft", "verify", "sampling", "other"}


def test_compare_reports_speedup_and_identity(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(
        capsys,
        "generate",
        "hello",
        *MOCK,
        "-k",
        "4",
        "--max-new-tokens",
        "10",
        "--compare",
        "--no-stop",
    )
    assert rc == 0
    assert "speedup" in err and "outputs identical: yes" in err


def test_pair_compare_runs_both_and_can_tell_outputs_apart() -> None:
    """``Pair.compare``: a plain run and a speculative run of one request; ``identical`` is
    true for a lossless pair (greedy) and false when the runs' tokens differ (sampled with
    a draft that changes the random stream: the same distribution, other tokens)."""
    import specdec

    pair = specdec.load(
        "mock:target", "mock:close", target_backend="mock", draft_backend="mock", n_ctx=256
    )
    shown: list[str] = []
    c = pair.compare("hello", k=4, max_new_tokens=12, stop_on_eos=False, on_text=shown.append)
    assert c.identical and c.plain.tokens == c.speculative.tokens
    assert "".join(shown) == c.speculative.text
    assert c.plain.result.drafted_tokens == 0 and c.speculative.result.drafted_tokens > 0
    assert c.speedup > 0 and c.decode_speedup > 0
    differs = [
        pair.compare("hello", k=4, max_new_tokens=12, stop_on_eos=False, temperature=1.0, seed=s)
        for s in range(4)
    ]
    assert not all(d.identical for d in differs)
    assert pair.speculates(4) and not pair.speculates(0)
    assert pair.speculates(0, prediction=None) is False and pair.speculates(None, "x")


def test_comparison_report_says_why_greedy_outputs_differ() -> None:
    """The comparison's last line: identical greedy outputs say yes; differing ones say
    near-tie with fast numerics and name a bug with exact numerics; sampled ones that
    differ need no explanation (the same distribution, other draws)."""
    import dataclasses

    import specdec

    pair = specdec.load(
        "mock:target", "mock:close", target_backend="mock", draft_backend="mock", n_ctx=256
    )
    c = pair.compare("hello", k=4, max_new_tokens=12, stop_on_eos=False)
    assert c.greedy and c.report("K=4")[-1].endswith("outputs identical: yes")
    assert c.to_dict()["identical_output"] is True and c.to_dict()["text"] == c.speculative.text
    other = dataclasses.replace(c.plain.result, tokens=[*c.plain.tokens[:-1], -1])
    differ = dataclasses.replace(c, plain=specdec.api.Completion(c.plain.text, other))
    assert "near-tie" in differ.report("K=4")[-1]
    exact = dataclasses.replace(
        c.speculative.result, extra={**c.speculative.result.extra, "exact": True}
    )
    bug = dataclasses.replace(differ, speculative=specdec.api.Completion("", exact))
    assert "a bug" in bug.report("K=4")[-1]
    sampled = dataclasses.replace(differ, greedy=False)
    assert sampled.report("K=4")[-1].endswith("outputs identical: no")


def test_prompt_from_standard_input_is_read_with_a_bound(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from specdec.cli import inputs

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello")))
    rc, out, _ = run_cli(capsys, "generate", "-", *MOCK, "-k", "2", "-n", "4", "--no-stop")
    assert rc == 0 and out.count("<") == 4
    monkeypatch.setattr(inputs, "MAX_TEXT_FILE", 4)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello")))
    rc, _, err = run_cli(capsys, "generate", "-", *MOCK)
    assert rc == 2 and "the prompt on standard input is larger than" in err
    rc, _, err = run_cli(capsys, "generate", "-", "--prediction", "-", *MOCK)
    assert rc == 2 and "standard input ('-') can be read once" in err


def test_k_zero_is_plain_decoding(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(
        capsys, "generate", "hello", *MOCK, "-k", "0", "--max-new-tokens", "5", "--no-stop"
    )
    assert rc == 0 and "1.00 tokens/round" in err


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["-k", "-1"], "k must be >= 0"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
        (["--n-ctx", "8"], "context window"),
        (["--draft", "mock:close:200"], "vocabulary"),
        (["--draft", "mock:close:32"], "tokenizers differ"),
        (["--target", "mock:nonsense"], "unknown mock model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    rc, _, err = run_cli(capsys, "generate", "a prompt longer than eight tokens", *MOCK, *extra)
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("specdec: error:") and needle in lines[-1], err
    assert "Traceback" not in err


def test_empty_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "generate", "   ", *MOCK)
    assert rc == 2 and "empty" in err


def test_unknown_model_and_corrupt_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run_cli(capsys, "generate", "hi", "--target", "no-such-model", "--draft", "none")
    assert rc == 2 and "no-such-model" in err and "Traceback" not in err
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    rc, _, err = run_cli(
        capsys,
        "generate",
        "hi",
        "--target",
        str(bad),
        "--target-backend",
        "llamacpp",
        "--draft",
        "none",
    )
    assert rc == 2 and "broken.gguf" in err and "Traceback" not in err


class ShiftedTokenizer(MockTokenizer):
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [
            3 + (i + 1) % (self.vocab_size - 3) if i >= 3 else i
            for i in super().encode(text, add_special_tokens=add_special_tokens)
        ]


def test_tokenizer_mismatch_names_the_first_differing_token() -> None:
    a, b = MockLM(MockSpec()), MockLM(MockSpec())
    b._tokenizer = ShiftedTokenizer(16)
    with pytest.raises(VocabMismatchError, match="differ at token 0"):
        check_same_vocabulary(a, b)
    check_same_vocabulary(a, MockLM(MockSpec(seed=5)))  # same tokenizer: fine


def test_console_entry_point_exit_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "specdec", "generate", "x", "-k", "-3", *MOCK],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("specdec: error:")


def test_demo_shows_the_verdict_and_a_code_edit_with_its_prediction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`specdec demo` on a mock target: the verdict line (no profile here), the task, both
    stats lines, the speedup and the identity check (a mock is exact: the outputs match)."""
    rc, out, err = run_cli(capsys, "demo", "--target", "mock:target", "-n", "24")
    assert rc == 0 and out.strip()
    assert "no profile yet" in err and "task code_predict:rename_1" in err
    assert "[specdec plain]" in err and "[specdec with the prediction]" in err
    assert "prediction " in err and "outputs identical: yes" in err
    assert "llama-cpp-python's own loop: not measured" in err  # a mock is no llama.cpp model
    rc, _, err = run_cli(capsys, "demo", "--target", "mock:target", "--task", "nope")
    assert rc == 2 and "no task 'nope'" in err


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_demo_measures_llama_cpp_pythons_own_loop_on_the_same_request(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a llama.cpp target the demo also runs llama-cpp-python's own loop on the request
    and states the speculative speed against it (no timing asserted: only that it ran, on
    the same request, with plain decoding's output)."""
    from tiny_models import llama_cpp_or_skip, store_model_or_skip

    llama_cpp_or_skip()
    path = store_model_or_skip()
    rc, _, err = run_cli(capsys, "demo", "--target", str(path), "-n", "24", "--threads", "2")
    assert rc == 0
    line = next(x for x in err.splitlines() if "against llama-cpp-python's own loop" in x)
    assert "x with the prediction" in line and "specdec's plain loop" in line
    assert "its output is plain decoding's: " in line
