"""The bench with every drafter (suffix, planned, hybrid) and its report against plain
llama.cpp: configuration parsing, a mock run, and the baseline table's arithmetic."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specdec.bench.analysis import against_baseline, baseline_configs
from specdec.bench.configs import MATRICES, BenchConfig, llamacpp_matrix, parse_config
from specdec.bench.plan import BenchPlan, config_ks, measurements
from specdec.bench.results import read_results
from specdec.bench.runner import planner_costs, run_bench
from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig
from specdec.prompt_sets import load_prompt_file


def test_parse_the_new_drafters() -> None:
    s = parse_config("draft=suffix:max_draft=8;min_match=3,target=t.gguf")
    assert s.free == "suffix:max_draft=8,min_match=3" and s.drafter_kind == "suffix"
    assert s.label == "suffix->llamacpp"
    p = parse_config("draft=planned,target=t.gguf,k=16")
    assert p.free == "planned" and p.ks == (16,) and p.label == "planned->llamacpp"
    h = parse_config("draft=hybrid:d.gguf,target=t.gguf,k=2;4")
    assert h.hybrid and h.draft is not None and h.draft.model == "d.gguf" and h.ks == (2, 4)
    assert h.label == "hybrid-llamacpp->llamacpp" and h.drafter_kind == "hybrid"
    for bad, msg in [
        ("draft=suffix:bogus=1,target=t", "suffix option"),
        ("draft=planned,target=t,k=0", "distinct values >= 1"),
        ("draft=planned,target=t,k=2;2", "distinct values >= 1"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_config(bad)
    with pytest.raises(ConfigError, match="exactly one drafter"):
        BenchConfig("x", ModelConfig("t"), free="suffix", ngram=None, draft=ModelConfig("d"))
    with pytest.raises(ConfigError, match="hybrid needs a draft model"):
        BenchConfig("x", ModelConfig("t"), free="suffix", hybrid=True)


def test_configs_round_trip_and_old_records_still_load() -> None:
    for cfg in llamacpp_matrix():
        assert BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = {"label": "a", "target": {"model": "t"}, "draft": None, "ngram": {"max_n": 3}}
    assert BenchConfig.from_dict(old).ngram is not None
    assert set(MATRICES) == {"study", "llamacpp"}
    assert all(c.target.backend == "llamacpp" for c in llamacpp_matrix())


def test_a_configuration_may_carry_its_own_k_sweep(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("one prompt\n")
    prompts = load_prompt_file(f)
    planned = parse_config("draft=planned,target=mock:target,k=16")
    plan = BenchPlan(configs=(planned,), ks=(1, 2), prompt_source=str(f), categories=None)
    assert config_ks(plan, planned) == (16,)
    assert sorted(m.k for m in measurements(plan, planned, prompts)) == [0, 16]


def test_a_mock_bench_runs_every_drafter(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        "".join(json.dumps({"prompt": t, "category": "c"}) + "\n" for t in ["ab ab ab ab", "xy"])
    )
    plan = BenchPlan(
        configs=(
            parse_config("draft=planned,target=mock:target,k=8"),
            parse_config("draft=suffix,target=mock:target"),
            parse_config("draft=hybrid:mock:close,target=mock:target"),
        ),
        ks=(2,),
        prompt_source=str(f),
        categories=None,
        prompts_per_category=0,
        max_new_tokens=12,
        stop_on_eos=False,
        profile_repeats=1,
        verify_max=9,
        profile_context_tokens=20,
        warmup=False,
    )
    out = tmp_path / "r.jsonl"
    run_bench(plan, out, progress=False)
    res = read_results(out)
    by = {(m["config"], m["k"]) for m in res.measurements}
    assert by == {
        ("planned->mock:target", 0),
        ("planned->mock:target", 8),
        ("suffix->mock:target", 0),
        ("suffix->mock:target", 2),
        ("hybrid-mock:close->mock:target", 0),
        ("hybrid-mock:close->mock:target", 2),
    }
    plain = {m["prompt_id"]: m["tokens"] for m in res.measurements if m["k"] == 0}
    for m in res.measurements:  # greedy: every drafter reproduces plain decoding
        assert m["tokens"] == plain[m["prompt_id"]]
    drafters = {m["config"]: m["drafter"] for m in res.measurements if m["k"] > 0}
    assert drafters["planned->mock:target"] == "planned"
    assert drafters["hybrid-mock:close->mock:target"] == "hybrid"
    prof = res.profile_for("planned->mock:target")
    assert prof is not None and len(planner_costs(prof).verify_s) == 9


def _m(config: str, k: int, prompt: str, tps: float, t_total: float, cat: str = "c") -> Any:
    return {
        "config": config,
        "mode": "greedy",
        "k": k,
        "prompt_id": prompt,
        "category": cat,
        "repeat": 0,
        "tokens_per_second": tps,
        "t_total": t_total,
    }


def test_the_baseline_is_plain_llamacpp_of_the_same_prompt() -> None:
    configs = [
        {"label": "a", "target": {"model": "t.gguf", "backend": "llamacpp"}},
        {"label": "b", "target": {"model": "qwen-store-name", "backend": "auto"}},
        {"label": "h", "target": {"model": "t.gguf", "backend": "hf"}},
    ]
    assert baseline_configs(configs) == {"a", "b"}
    ms = [
        _m("a", 0, "p", 10.0, 5.0),
        _m("b", 0, "p", 12.0, 4.0),
        _m("a", 4, "p", 13.0, 3.0),
        _m("h", 0, "p", 2.0, 20.0),  # a slow plain decoder is not the baseline
        _m("h", 2, "p", 4.0, 10.0),
        _m("a", 4, "q", 9.0, 1.0),  # no baseline run for q: left out
    ]
    speed = against_baseline(ms, {"a", "b"})
    assert speed[("a", "greedy", 4)] == [("p", "c", pytest.approx(13.0 / 11.0))]
    assert speed[("h", "greedy", 2)] == [("p", "c", pytest.approx(4.0 / 11.0))]
    assert speed[("a", "greedy", 0)] == [("p", "c", pytest.approx(10.0 / 11.0))]
    e2e = against_baseline(ms, {"a", "b"}, "t_total")
    assert e2e[("h", "greedy", 0)] == [("p", "c", pytest.approx(4.5 / 20.0))]


def test_the_report_shows_the_baseline_table_only_with_a_llamacpp_baseline(
    tmp_path: Path,
) -> None:
    from specdec.bench.report import write_report

    def write(target_backend: str) -> Path:
        out = tmp_path / f"{target_backend}.jsonl"
        header = {
            "type": "header",
            "session": 1,
            "plan": {
                "configs": [
                    {"label": "x", "target": {"model": "t.gguf", "backend": target_backend}}
                ],
                "max_new_tokens": 8,
            },
        }
        base = {"session": 1, "type": "measurement", "reached": [1], "accepted": [1]}
        recs = [
            header,
            {**base, **_m("x", 0, "p", 10.0, 2.0), "speedup": None, "ttft": 0.1},
            {**base, **_m("x", 1, "p", 12.0, 1.8), "speedup": 1.2, "ttft": 0.1},
        ]
        out.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return out

    report = write_report(write("llamacpp"), tmp_path / "r1").read_text()
    assert "## Against plain llama.cpp on the same file" in report
    assert "1.20x" in report
    assert "one after another (blocks)" in report and "ran interleaved" not in report
    report = write_report(write("hf"), tmp_path / "r2").read_text()
    assert "Against plain llama.cpp" not in report
    # an interleaved file says that its pooled plain runs are the steadier baseline
    inter = write("llamacpp")
    lines = inter.read_text().splitlines()
    header = json.loads(lines[0])
    header["plan"]["interleave"] = True
    inter.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    report = write_report(inter, tmp_path / "r3").read_text()
    assert "ran interleaved" in report and "(blocks)" not in report


def _tiny_plan(f: Path, *configs: BenchConfig, **kw: Any) -> BenchPlan:
    f.write_text(json.dumps({"prompt": "ab ab ab ab", "category": "c"}) + "\n")
    return replace(
        BenchPlan(
            configs=configs,
            ks=(2,),
            prompt_source=str(f),
            categories=None,
            prompts_per_category=0,
            max_new_tokens=6,
            stop_on_eos=False,
            profile_repeats=1,
            verify_max=4,
            profile_context_tokens=20,
            warmup=False,
        ),
        **kw,
    )


def test_the_planned_configuration_runs_the_planner_on_the_profiled_curve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec.bench import runner

    built: list[Any] = []

    class Recording(runner.PlannedSuffixDrafter):  # type: ignore[misc,name-defined]
        def __init__(self, inner: Any, costs: Any) -> None:
            super().__init__(inner, costs)
            built.append(costs)

    monkeypatch.setattr(runner, "PlannedSuffixDrafter", Recording)
    cfg = parse_config("draft=planned,target=mock:target,k=4")
    run_bench(_tiny_plan(tmp_path / "p.jsonl", cfg), tmp_path / "r.jsonl", progress=False)
    prof = read_results(tmp_path / "r.jsonl").profile_for(cfg.label)
    assert prof is not None and len(built) == 1
    assert list(built[0].verify_s) == prof["verify_s"]  # the configuration's own curve


@pytest.mark.parametrize("reuse", [False, True])
def test_every_run_prefills_its_own_prompt_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reuse: bool
) -> None:
    from specdec.bench import runner

    seen: list[bool] = []
    real = runner.generate

    def spy(*args: Any, **kw: Any) -> Any:
        if kw.get("max_new_tokens") == 6:  # the measurements, not the profile's own runs
            seen.append(kw["reuse_prefix"])
        return real(*args, **kw)

    monkeypatch.setattr(runner, "generate", spy)
    cfg = parse_config("draft=suffix,target=mock:target")
    plan = _tiny_plan(tmp_path / "p.jsonl", cfg, reuse_prefix=reuse)
    run_bench(plan, tmp_path / "r.jsonl", progress=False)
    assert seen == [reuse, reuse]  # K = 0 and K = 2
