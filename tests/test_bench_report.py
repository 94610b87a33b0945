"""Report generation: markdown and PNGs from a small results file; numbers from the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specdec.bench.configs import parse_config
from specdec.bench.plan import BenchPlan
from specdec.bench.report import _ttft_points, build, report_summary, write_report
from specdec.bench.results import read_results
from specdec.bench.runner import run_bench
from specdec.errors import ConfigError

PNGS = {
    "speedup_vs_k.png",
    "acceptance_by_position.png",
    "verify_scaling.png",
    "time_split.png",
    "acceptance_by_category.png",
    "predicted_vs_measured.png",
}


def m(prompt: str, k: int, tps: float, cat: str, mode: str = "greedy") -> dict[str, Any]:
    return {
        "type": "measurement",
        "config": "cfgA",
        "mode": mode,
        "prompt_id": prompt,
        "category": cat,
        "repeat": 0,
        "k": k,
        "tokens_per_second": tps,
        "mean_accepted_per_round": 1.5 if k else 0.0,
        "reached": [10, 6][:k],
        "accepted": [6, 3][:k],
        "time_split": {
            "prefill": 0.1,
            "draft": 0.2,
            "verify": 0.6,
            "sampling": 0.05,
            "other": 0.05,
        },
        "tokens": [1, 2, 3],
    }


def test_report_from_a_hand_made_file(tmp_path: Path) -> None:
    recs: list[dict[str, Any]] = [
        {"type": "header", "session": 1, "machine": {"cpu": "TestCPU 9000"}, "plan": {}},
        {
            "type": "profile",
            "config": "cfgA",
            "c": 0.25,
            "verify_ratio": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.75],
            "target_step_s": 0.04,
            "draft_step_s": 0.01,
            "context_tokens": 100,
        },
    ]
    for p, cat, base, sp in (
        ("p1", "qa", 10.0, 1.25),
        ("p2", "rag", 20.0, 1.5),
        ("p3", "qa", 8.0, 1.0),
    ):
        recs += [m(p, 0, base, cat), m(p, 2, base * sp, cat)]
    src = tmp_path / "hand.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    md_path = write_report(src)
    assert md_path == tmp_path / "hand-report" / "report.md"
    assert {p.name for p in md_path.parent.glob("*.png")} == PNGS
    assert all((md_path.parent / p).stat().st_size > 1000 for p in PNGS)
    md = md_path.read_text()
    assert "TestCPU 9000" in md
    geo = (1.25 * 1.5 * 1.0) ** (1 / 3)
    assert f"{geo:.2f}x" in md  # the geometric-mean speedup at K = 2
    assert "| 1.75 |" in md  # verify(8)/verify(1) from the profile
    assert "| 0.250 |" in md  # c
    assert "| 60.0 % | 50.0 % |" in md  # a_1 = 18 / 30, a_2 = 9 / 18, pooled over prompts
    assert "56.2 %" in md  # overall acceptance 27 / 48
    assert "nan" not in md.lower()
    (row,) = report_summary(src)
    assert row["best_k"] == 2 and row["speedup"] == pytest.approx(geo)
    assert row["verify8"] == pytest.approx(1.75) and row["c"] == pytest.approx(0.25)


def test_report_from_a_mock_bench_run(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat sat on the mat\nhello hello hello\n")
    plan = BenchPlan(
        configs=(
            parse_config("draft=mock:close,target=mock:target,label=close"),
            parse_config("draft=ngram,target=mock:target,label=ngram"),
        ),
        ks=(1, 3),
        modes=("greedy", "sampled"),
        prompt_source=str(prompts),
        categories=None,
        prompts_per_category=0,
        max_new_tokens=8,
        stop_on_eos=False,
        profile_repeats=1,
        verify_max=8,
        profile_context_tokens=20,
        warmup=False,
    )
    src = tmp_path / "run.jsonl"
    run_bench(plan, src, progress=False)
    out = tmp_path / "rep"
    md = write_report(src, out).read_text()
    # bench runs record TTFT, so their report also plots it against prompt length
    assert {p.name for p in out.glob("*.png")} == PNGS | {"ttft_vs_prompt_length.png"}
    assert "![TTFT vs prompt length](ttft_vs_prompt_length.png)" in md
    for section in (
        "## Summary",
        "## Speedup vs K",
        "## Acceptance by draft position",
        "## Verify-batch scaling",
        "## Time split",
        "## Acceptance by prompt category",
        "## Predicted vs measured",
        "## Greedy agreement",
    ):
        assert section in md
    assert "| close | greedy |" in md and "| ngram | sampled |" in md


def test_report_needs_measurements(tmp_path: Path) -> None:
    src = tmp_path / "empty.jsonl"
    src.write_text(json.dumps({"type": "header", "session": 1}) + "\n")
    with pytest.raises(ConfigError, match="no measurements"):
        write_report(src)


def test_ttft_and_end_to_end_by_prompt_length(tmp_path: Path) -> None:
    """The report gives median TTFT and end-to-end time per configuration, K and prompt-length
    band, from the records' own figures (older records without ttft are left out)."""
    recs: list[dict[str, Any]] = [{"type": "header", "session": 1, "machine": {}, "plan": {}}]
    for p, n_prompt, ttft, total in (
        ("a", 40, 0.5, 2.0),
        ("b", 100, 0.7, 2.4),
        ("c", 800, 6.0, 9.0),
    ):
        for k, slower in ((0, 1.0), (2, 1.5)):
            r = m(p, k, 10.0, "qa")
            r.update(prompt_tokens=n_prompt, ttft=ttft * slower, t_total=total * slower)
            recs.append(r)
    recs.append(m("old", 0, 10.0, "qa"))  # no ttft: written before it was recorded
    src = tmp_path / "t.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    md = write_report(src).read_text()
    assert "## Time to first token and end-to-end time" in md
    assert "| cfgA | greedy | 0 | 0-128 | 2 | 0.60 s | 2.20 s |" in md  # medians of a and b
    assert "| cfgA | greedy | 2 | > 512 | 1 | 9.00 s | 13.50 s |" in md
    # the plot: one marker per timed run, plain runs together, the untimed record left out
    assert (src.with_name("t-report") / "ttft_vs_prompt_length.png").stat().st_size > 1000
    points = _ttft_points(build(read_results(src)))
    assert sorted(points["plain"]) == [(40, 0.5), (100, 0.7), (800, 6.0)]
    spec = sorted((n, round(s, 9)) for n, s in points["cfgA K=2 (greedy)"])
    assert spec == [(40, 0.75), (100, 1.05), (800, 9.0)]


def test_predicted_column_charges_each_round_its_real_drafts(tmp_path: Path) -> None:
    """Runs that record their draft lengths are predicted from them (a suffix-like drafter at
    K = 8 that mostly drafts nothing is not charged 8 drafts a round)."""
    vr = [1.0 + 0.5 * i for i in range(9)]
    recs: list[dict[str, Any]] = [
        {"type": "header", "session": 1, "machine": {"cpu": "x"}, "plan": {}},
        {"type": "profile", "config": "cfgA", "c": 0.0, "verify_ratio": vr},
    ]
    for p, hist, n in (("p1", [6, 0, 2], 12), ("p2", [10], 10)):
        plain = m(p, 0, 10.0, "qa")
        spec = m(p, 8, 10.0, "qa") | {
            "reached": [2, 2, 0, 0, 0, 0, 0, 0],
            "accepted": [2, 2, 0, 0, 0, 0, 0, 0],
            "draft_lengths": hist,
            "n_tokens": n,
            "drafter": "suffix",
        }
        recs += [plain, spec]
    src = tmp_path / "rounds.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    md = write_report(src).read_text()
    # p1: 12 tokens / (6 plain steps + 2 rounds of verify(3) = 2.0) = 1.2; p2: 10 / 10 = 1
    want = (1.2 * 1.0) ** 0.5
    section = md.split("## Predicted vs measured")[1]
    assert f"| cfgA | greedy | 8 | 1.00x | {want:.2f}x |" in section
    # the summary's "predicted best" is the same round-structure prediction, not the
    # positional formula (which charges 8 drafts a round: about 0.4x here)
    summary = md.split("## Summary")[1].split("##")[0]
    assert f"| {want:.2f}x |" in summary
