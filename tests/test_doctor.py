"""`specdec doctor`: every section a bug report needs, as text and as JSON, and a kernel
verdict that turned something off shown as OFF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.doctor import format_report, gather
from specdec.llama_trust.kernel_check import KernelVerdict, Trial, _save

SECTIONS = (
    "machine", "cpu_flags", "packages", "llama_cpp", "kernel_checks", "exact_checks", "gpus",
    "store",
)  # fmt: skip


@pytest.fixture
def checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDEC_KERNEL_CHECKS", str(tmp_path / "checks"))
    (tmp_path / "checks").mkdir()
    return tmp_path / "checks"


def test_the_report_has_every_section_and_reads_only(checks: Path) -> None:
    r = gather()
    for name in (*SECTIONS, "profiles"):
        assert name in r, name
    assert r["cpu_flags"]["all"] and set(r["cpu_flags"]["simd"]) <= set(r["cpu_flags"]["all"])
    text = format_report(r)
    labels = ("machine", "cpu flags", "packages", "kernel checks", "exact checks", "gpus", "store")
    for label in labels:
        assert any(line.startswith(label) for line in text.splitlines()), label
    assert list(checks.iterdir()) == []  # nothing was checked or written


def test_a_verdict_that_turned_a_kernel_off_is_shown_off(checks: Path) -> None:
    v = KernelVerdict(
        ("AMX", "CPU_REPACK"),
        "avoid:AMX",
        (Trial("none", "ok", "", 1.0), Trial("all", "signal", "SIGSEGV", 0.4)),
        key="k" * 24,
        model="target.gguf",
        weights=("Q4_K", "Q6_K"),
        created="2026-12-02T00:00:00+00:00",
    )
    _save(checks, v)
    text = format_report(gather())
    line = next(ln for ln in text.splitlines() if "target.gguf" in ln)
    assert "AMX OFF" in line and "SIGSEGV" in line and "Q4_K/Q6_K" in line
    healthy = KernelVerdict(("CPU_REPACK",), "all", key="h" * 24, model="ok.gguf")
    _save(checks, healthy)
    line = next(ln for ln in format_report(gather()).splitlines() if "ok.gguf" in ln)
    assert "all kept" in line and "OFF" not in line


def test_the_command_prints_text_or_json(checks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    assert "doctor: paste this into a bug report" in capsys.readouterr().out
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(name in data for name in SECTIONS)


def test_check_of_a_model_that_is_not_there_is_one_line(
    checks: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["doctor", "--check", str(tmp_path / "absent.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error:") and len(err.strip().splitlines()) == 1
