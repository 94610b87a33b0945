"""`specdec certify` end to end on mock models: files, verdict, exit codes, resume, errors.
Sample sizes are cut with --scale / --seeds so each run takes seconds (low power: these tests
check the plumbing; the statistics are tested in test_certify_levels/real and test_stats)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdec.certify.common import torch_threads
from specdec.cli import main


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Mock-sized tensors: one thread (a second one only adds synchronisation)."""
    with torch_threads(1):
        yield


MOCKS = [
    "--draft", "mock:close:8", "--target", "mock:target:8",
    "--draft-backend", "mock", "--target-backend", "mock",
]  # fmt: skip
L3 = ["--levels", "3", "--quick", "--seeds", "4", "--n-prompts", "2", *MOCKS]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_level3_run_writes_a_certificate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Exit 0, the verdict on stdout, strict JSON with thresholds / sizes / seeds, markdown
    that says what was and was not shown."""
    out = tmp_path / "cert"
    assert main(["certify", *L3, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert stdout.startswith("VERDICT: PASS")
    assert "detects per-token TV >=" in stdout and "quick run" in stdout
    assert "threshold 0.02" in stdout  # the plain-decoding rule, fixed in advance, printed
    doc = json.loads((out / "certificate.json").read_text(), parse_constant=_no_nan)
    assert doc["alpha"] == 0.01 and doc["seed"] == 0 and doc["levels_requested"] == ["3"]
    assert doc["plan"]["level3"]["seeds"] == 4
    assert doc["verdict"]["status"] == "pass"
    l3 = doc["levels"]["3"]
    assert l3["probe"]["max_abs"] == 0.0 and len(l3["greedy"]) == 1  # the quick plan: 1 prompt
    md = (out / "certificate.md").read_text()
    assert "## What was shown" in md and "## What was NOT shown" in md
    assert "Level 1 (the accept/reject walk on synthetic distributions) was not run" in md
    assert (out / "progress.jsonl").exists()


def _no_nan(name: str) -> float:
    raise AssertionError(f"certificate.json must be strict JSON, found {name}")


def test_levels_1_and_2_run_scaled_down(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Levels 1-2 need no model: both pass at scale 0.1 and Level 3 is reported as not run."""
    out = tmp_path / "c12"
    rc = main(["certify", "--levels", "1,2", "--quick", "--scale", "0.1", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "certificate.json").read_text())
    assert doc["levels"]["1"]["summary"]["status"] == "pass"
    assert doc["levels"]["2"]["summary"]["status"] == "pass"
    assert doc["levels"]["3"] is None and doc["draft"] is None
    assert "L1 pass" in capsys.readouterr().out


def test_resume_reuses_completed_units(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A second run with --resume computes nothing new (same log, same numbers); resuming
    with other options is refused with a one-line error (exit 2)."""
    out = tmp_path / "r"
    assert main(["certify", *L3, "--out", str(out)]) == 0
    first = json.loads((out / "certificate.json").read_text())
    n_lines = len(_lines(out / "progress.jsonl"))
    # cut the log as an interrupted run would (a partial last line), then resume
    lines = _lines(out / "progress.jsonl")
    (out / "progress.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])
    assert main(["certify", *L3, "--out", str(out), "--resume"]) == 0
    second = json.loads((out / "certificate.json").read_text())
    assert second["levels"]["3"]["pertoken"] == first["levels"]["3"]["pertoken"]
    assert len(_lines(out / "progress.jsonl")) == n_lines + 1  # only the cut unit redone
    capsys.readouterr()
    assert main(["certify", *L3, "--seed", "1", "--out", str(out), "--resume"]) == 2
    assert "different configuration" in capsys.readouterr().err


def test_injected_fault_fails_the_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Self-test: with drafts always accepted the verdict is FAIL and the exit code 1."""
    rc = main(["certify", *L3, "--inject-fault", "always-accept", "--out", str(tmp_path)])
    assert rc == 1
    out = capsys.readouterr().out
    assert out.startswith("VERDICT: SELF-TEST with injected fault 'always-accept': FAIL")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--alpha", "2"], "--alpha"),
        (["--levels", "4"], "--levels"),
        (["--seeds", "0"], "--seeds"),
        (["--temperature", "0"], "--temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--prompts", "/no/such/file.txt"], "not found"),
    ],
)
def test_user_errors_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    """Bad options end with one 'specdec: error:' line naming the problem, exit code 2."""
    rc = main(["certify", *L3, *argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err
    assert len(err.strip().splitlines()) <= 4  # progress lines + one error line
    assert err.strip().splitlines()[-1].startswith("specdec: error:")


def test_prompt_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A JSONL prompt file in Spec-Bench format is accepted. (With its one prompt, two
    sequences are scored against plain decoding: one gives no interval to bound its TV.)"""
    f = tmp_path / "p.jsonl"
    f.write_text('{"question_id": 1, "category": "qa", "turns": ["hello there"]}\n')
    argv = ["certify", *L3, "--prompts", str(f), "--n-prompts", "1", "--plain-seeds", "2"]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "certificate.json").read_text())
    assert doc["prompts"].startswith("1 from")


def test_a_bad_prompt_file_fails_before_the_first_level(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The prompts are read before level 1 runs (and before any model loads), so a missing
    or empty file costs nothing: one error line, exit 2, no level started."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    for bad, message in ((tmp_path / "missing.jsonl", "missing.jsonl"), (empty, "no prompts")):
        argv = ["certify", "--levels", "1,3", "--quick", "--seeds", "4", *MOCKS]
        rc = main([*argv, "--prompts", str(bad), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert rc == 2 and message in err, err
        assert "level 1" not in err and "loading models" not in err, err
        assert err.strip().splitlines()[-1].startswith("specdec: error:")


def test_ngram_drafter_and_probe_level(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Level 3 also runs with the n-gram drafter (one-hot q); --levels probe runs only the
    batch-invariance probe (exactly 0 on mocks)."""
    argv = ["certify", *L3, "--draft", "ngram", "--out", str(tmp_path / "ng")]
    assert main(argv) == 0
    assert "L3 pass" in capsys.readouterr().out
    argv = ["certify", "--levels", "probe", *MOCKS, "--out", str(tmp_path / "pr")]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "pr" / "certificate.json").read_text())
    assert doc["levels"]["probe"]["max_abs"] == 0.0
    assert doc["levels"]["draft_probe"]["max_abs"] == 0.0
    assert doc["target_runtime"]["class"] == "MockLM"


# V = 32 mocks with an unrelated draft (EOS ends fewer sequences early than at V = 8)
QUICK_L3 = [
    "--levels", "3", "--quick",
    "--draft", "mock:far:32", "--target", "mock:target:32",
    "--draft-backend", "mock", "--target-backend", "mock",
]  # fmt: skip


@pytest.mark.parametrize(
    "fault",
    [
        "wrong-rows",
        "stale-rollback",
        "wrong-q",
        "residual-is-p-after-first-round",
        "position-after-truncate",
        "residual-is-p",
    ],
)
def test_every_fault_fixture_fails_at_quick_size(
    tmp_path: Path, capsys: pytest.CaptureFixture, fault: str
) -> None:
    """Each faulty backend / walk makes `certify --quick` (Level 3 at its real quick size)
    print FAIL and exit 1."""
    rc = main(["certify", *QUICK_L3, "--inject-fault", fault, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"injected fault {fault!r}: FAIL" in out


def test_noisy_but_correct_backend_does_not_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The control: bf16-like shape-dependent logit noise passes the shape-matched test and
    the certificate does not FAIL (exit 0) at the quick size."""
    rc = main(["certify", *QUICK_L3, "--inject-fault", "noisy-numerics", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads((tmp_path / "certificate.json").read_text())
    assert doc["levels"]["3"]["pertoken"]["decoder_rejected"] is False


def test_cli_fault_list_matches_the_package() -> None:
    """The CLI's --inject-fault choices (kept literal to avoid importing torch at start-up)
    are exactly specdec.certify.faults.ALL_FAULTS."""
    from specdec.certify.faults import ALL_FAULTS
    from specdec.cli.certify import FAULT_CHOICES

    assert tuple(FAULT_CHOICES) == tuple(ALL_FAULTS)


def test_cli_threshold_defaults_are_the_packages() -> None:
    """The CLI's --alpha and --tie-gap defaults (literal, for the same reason) are the
    thresholds of specdec.stats.thresholds."""
    from specdec.cli import build_parser
    from specdec.stats.thresholds import ALPHA, TIE_GAP_NATS

    args = build_parser(["certify"]).parse_args(["certify"])
    assert args.alpha == ALPHA and args.tie_gap == TIE_GAP_NATS


def test_an_exact_certificate_names_the_kv_cache_its_target_ran_with() -> None:
    from types import SimpleNamespace

    from specdec.certify.report import Certificate
    from specdec.certify.runner import runtime_info

    llama_like = SimpleNamespace(path="t.gguf", exact=True, type_k="q8_0", type_v="f16")
    info = runtime_info(llama_like)
    assert info is not None and info["kv_cache"] == "q8_0/f16"
    said = Certificate(header={"target_runtime": info})._plain_means()
    assert "Q8_0/F16 keys/values" in said and "same exact numerics" in said
    # a mock has no KV cache types: nothing is claimed about them
    assert "kv_cache" not in (runtime_info(SimpleNamespace(exact=True)) or {})
    default = Certificate(header={"target_runtime": {**info, "numerics": "default"}})
    assert "not expected" in default._plain_means()


def test_a_llama_cpp_certificate_names_the_build_that_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import specdec.llama_trust.lib_identity as lib_identity
    import specdec.models.llamacpp as backend
    from specdec.certify.report import Certificate
    from specdec.certify.runner import runtime_info

    for version, words in ((3, "exact build, patch version 3"), (None, "stock build")):
        ident = lib_identity.LibIdentity("/x/libggml-cpu.so", "ab" * 32, version)
        monkeypatch.setattr(backend, "loaded_library", lambda ident=ident: ident)
        info = runtime_info(SimpleNamespace(path="t.gguf", exact=True))
        assert info is not None and info["ggml_cpu"].startswith(words)
        assert "abababab" in info["ggml_cpu"]
        md = Certificate(header={"target_runtime": info}).to_markdown()
        assert f"- llama.cpp: {words}" in md

    def two_files() -> None:
        raise lib_identity.LibIdentityError("two different libggml-cpu files are mapped: a, b")

    monkeypatch.setattr(backend, "loaded_library", two_files)  # recorded, not a crash
    info = runtime_info(SimpleNamespace(exact=True))
    assert info is not None and info["ggml_cpu"].startswith("two different")
    monkeypatch.setattr(backend, "loaded_library", lambda: None)  # nothing mapped: nothing said
    assert "ggml_cpu" not in (runtime_info(SimpleNamespace(exact=True)) or {})
    assert "ggml_cpu" not in (runtime_info(SimpleNamespace(dtype="float32")) or {})


def test_run_certificate_without_the_prompts_its_levels_need_is_refused() -> None:
    """The prompts are read at the edge (the CLI, ``certify_models``); a caller of
    ``run_certificate`` that asks for level 3 or the probe without them gets one ConfigError
    before anything runs (the loader is never called)."""
    from specdec.certify.plan import make_plan
    from specdec.certify.runner import CertifyConfig, run_certificate
    from specdec.errors import ConfigError

    def loader() -> None:
        raise AssertionError("no model may load")

    for levels in (("3",), ("probe",)):
        cfg = CertifyConfig(
            levels=levels,
            plan=make_plan(quick=True, seed=0, alpha=0.01),
            quick=True,
            seed=0,
            alpha=0.01,
        )
        with pytest.raises(ConfigError, match="need prompts"):
            run_certificate(cfg, loader)  # type: ignore[arg-type]
