"""The bench runner on mock models: records, interleaving, crash + resume, the CLI."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specdec.bench.configs import default_matrix, parse_config
from specdec.bench.plan import BenchPlan, full_plan, k_order, measurements, quick_plan
from specdec.bench.results import measurement_key, read_results
from specdec.bench.runner import run_bench
from specdec.cli import main
from specdec.core.model import CausalLM
from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig, load_model
from specdec.prompt_sets import load_prompt_file

PROMPTS = ["the cat sat on the mat", "the cat sat on the hat", "abc abc abc abc", "hello world"]


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    cats = ["a", "a", "b", "b"]
    path.write_text(
        "".join(
            json.dumps({"prompt": t, "category": c}) + "\n"
            for t, c in zip(PROMPTS, cats, strict=True)
        )
    )
    return path


def small_plan(prompt_file: Path, **kw: Any) -> BenchPlan:
    base = BenchPlan(
        configs=(
            parse_config("draft=mock:close,target=mock:target,label=close"),
            parse_config("draft=ngram,target=mock:target,label=ngram"),
        ),
        ks=(1, 2, 3),
        modes=("greedy", "sampled"),
        prompt_source=str(prompt_file),
        categories=None,
        prompts_per_category=0,
        max_new_tokens=10,
        repeats=2,
        stop_on_eos=False,
        profile_repeats=1,
        verify_max=4,
        profile_context_tokens=20,
        warmup=False,
    )
    return replace(base, **kw)


def measurement_records(path: Path) -> list[dict[str, Any]]:
    return read_results(path).measurements


def crash_at(n: int, exc: type[BaseException]) -> Callable[[dict[str, Any]], None]:
    """An on_record hook that raises ``exc`` once the n-th measurement is on disk (a kill)."""
    seen = {"n": 0}

    def crash(record: dict[str, Any]) -> None:
        if record["type"] == "measurement":
            seen["n"] += 1
            if seen["n"] == n:
                raise exc("killed")

    return crash


def test_small_bench_writes_the_expected_records(tmp_path: Path, prompt_file: Path) -> None:
    plan = small_plan(prompt_file)
    out = tmp_path / "r.jsonl"
    outcome = run_bench(plan, out, progress=False, argv=["specdec", "bench"])
    res = read_results(out)
    n_expected = 2 * 4 * 2 * 2 * 4  # configs x prompts x repeats x modes x (plain + 3 K)
    assert outcome.measured == n_expected and outcome.session == 1
    assert len(res.measurements) == n_expected
    assert len(res.keys()) == n_expected  # no duplicate keys
    assert len(res.headers) == 1 and res.headers[0]["argv"] == ["specdec", "bench"]
    assert res.headers[0]["plan"]["ks"] == [1, 2, 3]
    assert {"cpu", "cores"} <= set(res.headers[0]["machine"])
    assert {p["config"] for p in res.profiles} == {"close", "ngram"}
    for p in res.profiles:
        assert len(p["verify_ratio"]) == 4 and p["verify_ratio"][0] == 1.0
        assert p["c"] is not None
    for m in res.measurements:
        assert m["n_tokens"] == 10
        assert len(m["reached"]) == len(m["accepted"]) == m["k"]
        assert all(a <= r for a, r in zip(m["accepted"], m["reached"], strict=True))
        assert set(m["time_split"]) == {"prefill", "draft", "verify", "sampling", "other"}
        assert m["temperature"] == (0.0 if m["mode"] == "greedy" else 1.0)
        assert m["category"] in ("a", "b")
        if m["k"] == 0:
            assert m["speedup"] is None and m["rounds"] == 10
        else:
            # plain runs first in every group, so each K record carries its speedup
            assert m["speedup"] == pytest.approx(
                m["tokens_per_second"] / m["plain_tokens_per_second"]
            )
            assert m["predicted_speedup"] is not None
        # rounds by drafts verified: one entry per round, none drafting more than K
        assert sum(m["draft_lengths"]) == m["rounds"]
        assert len(m["draft_lengths"]) <= m["k"] + 1
        assert sum(j * n for j, n in enumerate(m["draft_lengths"])) == m["drafted"]
    # seed-paired: all measurements of one (prompt, repeat) share the seed; greedy outputs of
    # speculative decoding equal plain decoding's on the mocks
    by_group: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for m in res.measurements:
        by_group.setdefault((m["config"], m["mode"], m["prompt_id"], m["repeat"]), []).append(m)
    for (_, mode, _, _), group in by_group.items():
        assert len({m["seed"] for m in group}) == 1
        if mode == "greedy":
            assert len({tuple(m["tokens"]) for m in group}) == 1


def test_order_is_interleaved_plain_first_then_seeded_shuffle(prompt_file: Path) -> None:
    plan = small_plan(prompt_file, ks=(1, 2, 3, 4, 5, 6, 7, 8), seed=3)
    prompts = load_prompt_file(prompt_file)
    ms = measurements(plan, plan.configs[0], prompts)
    assert len(ms) == 4 * 2 * 2 * 9
    orders = {tuple(m.k for m in ms[i : i + 9]) for i in range(0, len(ms), 9)}
    assert all(o[0] == 0 and sorted(o[1:]) == list(range(1, 9)) for o in orders)
    assert len(orders) > 1  # shuffled per group
    assert k_order(plan, "x", 0, "greedy") == k_order(plan, "x", 0, "greedy")
    assert [m.repeat for m in ms[:72]] == [0] * 72  # repeats are the outer loop


@pytest.mark.parametrize(
    ("crash_after", "exc"),
    [(1, KeyboardInterrupt), (13, RuntimeError), (64, KeyboardInterrupt), (100, RuntimeError)],
)
def test_kill_and_resume_loses_and_duplicates_nothing(
    tmp_path: Path, prompt_file: Path, crash_after: int, exc: type[BaseException]
) -> None:
    plan = small_plan(prompt_file)
    full = tmp_path / "full.jsonl"
    run_bench(plan, full, progress=False)
    want = read_results(full).keys()

    out = tmp_path / "crashed.jsonl"
    with pytest.raises(exc):
        run_bench(plan, out, progress=False, on_record=crash_at(crash_after, exc))
    assert len(measurement_records(out)) == crash_after
    # the kill also hit in the middle of writing the next line
    victim = json.dumps(measurement_records(full)[-1])
    with out.open("a") as f:
        f.write(victim[: len(victim) // 2])
    assert read_results(out).partial_tail

    outcome = run_bench(plan, out, resume=True, progress=False)
    assert outcome.partial_line_cut
    assert outcome.already_done == crash_after
    assert outcome.measured == len(want) - crash_after
    res = read_results(out)
    keys = [measurement_key(m) for m in res.measurements]
    assert not res.partial_tail and not res.bad_lines
    assert Counter(keys).most_common(1)[0][1] == 1  # none duplicated
    assert set(keys) == want  # none lost
    assert [h["session"] for h in res.headers] == [1, 2]
    # profiles are not redone for a configuration that already has one
    assert Counter(p["config"] for p in res.profiles) == Counter(
        p["config"] for p in read_results(full).profiles
    )
    # speedups of resumed K records still pair with the plain record of the first session
    assert all(m["speedup"] is not None for m in res.measurements if m["k"] > 0)
    # resuming a finished file measures nothing
    again = run_bench(plan, out, resume=True, progress=False)
    assert again.measured == 0 and len(measurement_records(out)) == len(want)


def test_resume_can_extend_the_sweep(tmp_path: Path, prompt_file: Path) -> None:
    out = tmp_path / "r.jsonl"
    plan = small_plan(prompt_file, ks=(1,), modes=("greedy",), repeats=1)
    run_bench(plan, out, progress=False)
    outcome = run_bench(replace(plan, ks=(1, 4)), out, resume=True, progress=False)
    assert outcome.measured == 2 * 4  # only K = 4 is new
    assert {m["k"] for m in measurement_records(out)} == {0, 1, 4}


def test_existing_file_needs_resume_or_overwrite(tmp_path: Path, prompt_file: Path) -> None:
    out = tmp_path / "r.jsonl"
    plan = small_plan(prompt_file, ks=(1,), modes=("greedy",), repeats=1)
    run_bench(plan, out, progress=False)
    with pytest.raises(ConfigError, match="--resume"):
        run_bench(plan, out, progress=False)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        run_bench(replace(plan, max_new_tokens=11), out, resume=True, progress=False)
    changed = replace(
        plan, configs=(parse_config("draft=mock:far,target=mock:target,label=close"),)
    )
    with pytest.raises(ConfigError, match="other settings"):
        run_bench(changed, out, resume=True, progress=False)
    run_bench(plan, out, overwrite=True, progress=False)
    assert len(read_results(out).headers) == 1


def test_too_long_prompts_are_skipped_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("short prompt\n" + "x" * 300 + "\n")
    cfg = parse_config("draft=mock:close,target=mock:target,n_ctx=200,label=tiny")
    plan = small_plan(path, configs=(cfg,), ks=(2,), modes=("greedy",), repeats=1)
    out = tmp_path / "r.jsonl"
    outcome = run_bench(plan, out, progress=False)
    res = read_results(out)
    assert {m["prompt_id"] for m in res.measurements} == {"p:line1"}
    assert [s["prompt_id"] for s in res.skips] == ["p:line2"]
    assert "context window" in res.skips[0]["reason"] and outcome.skipped_prompts


def test_default_and_quick_plans() -> None:
    labels = [c.label for c in default_matrix()]
    assert labels == [
        "llamacpp->llamacpp",
        "llamacpp->hf-bf16",
        "hf-bf16->hf-bf16",
        "hf-fp32->hf-fp32",
        "ngram->hf-bf16",
    ]
    full = full_plan()
    assert full.ks == tuple(range(1, 9)) and full.max_new_tokens == 32
    quick = quick_plan()
    assert len(quick.configs) == 2 and quick.ks == (2, 4)
    assert quick.categories is not None and len(quick.categories) == 3
    assert default_matrix()[3].target.dtype == "float32"
    assert default_matrix()[4].ngram is not None


def test_parse_config_keys_and_errors() -> None:
    cfg = parse_config(
        "draft=d0,draft_backend=llamacpp,target=t1,target_backend=hf,dtype=bfloat16,n_threads=2"
    )
    assert cfg.draft is not None
    assert (cfg.draft.model, cfg.draft.backend, cfg.draft.dtype) == ("d0", "llamacpp", "bfloat16")
    assert (cfg.target.model, cfg.target.backend, cfg.target.n_threads) == ("t1", "hf", 2)
    assert cfg.label == "llamacpp->hf-bf16"
    ng = parse_config("draft=ngram:4,ngram_min=2,target=t1,target_backend=hf,dtype=float32")
    assert ng.ngram is not None and (ng.ngram.max_n, ng.ngram.min_n) == (4, 2)
    assert ng.label == "ngram4->hf-fp32"
    for bad, msg in [
        ("draft=x", "no target"),
        ("target=t,color=red", "unknown configuration key"),
        ("target=t,dtype=int3", "dtype"),
        ("target=t,n_ctx=big", "integer"),
        ("target=t,draft=none", "needs a drafter"),
        ("target=t,oops", "key=value"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_config(bad)


def test_cli_bench_and_report(tmp_path: Path, prompt_file: Path, capsys: Any) -> None:
    out = tmp_path / "cli.jsonl"
    args = [
        "bench",
        "--config",
        "draft=mock:close,target=mock:target",
        "--k",
        "1-2",
        "--prompts",
        str(prompt_file),
        "--categories",
        "a",
        "--max-new-tokens",
        "6",
        "--ignore-eos",
        "--profile-repeats",
        "1",
        "--verify-max",
        "3",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    res = read_results(out)
    assert len(res.measurements) == 2 * 3  # 2 prompts of category a x (plain + 2 K)
    assert main(args) == 2  # exists: needs --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    assert len(read_results(out).measurements) == 6
    assert main([*args[:-3], "--dry-run"]) == 0
    assert "total: 6 generations" in capsys.readouterr().out
    assert main(["bench", "--config", "draft=mock:close", "--dry-run"]) == 2
    assert main(["bench", "--k", "1,x", "--dry-run"]) == 2
    assert main(["bench", "--modes", "fast", "--dry-run"]) == 2
    rep = tmp_path / "rep"
    assert main(["report", str(out), "--out", str(rep)]) == 0
    assert (rep / "report.md").is_file()
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


# -- interleaved mode (--interleave) ---------------------------------------------------------

SHARING = (  # every configuration shares mock:target; "window" shares close's draft too
    "draft=mock:close,target=mock:target,label=close",
    "draft=ngram,target=mock:target,label=ngram",
    "draft=mock:target,target=mock:target,label=self",  # draft and target: two instances
    "draft=mock:close,target=mock:target,draft_window=4,label=window",
)


class CountingLoader:
    """load_model, counting calls per ModelConfig and close() calls per loaded object."""

    def __init__(self) -> None:
        self.calls: Counter[ModelConfig] = Counter()
        self.loaded: list[Any] = []
        self.closed: Counter[int] = Counter()

    def __call__(self, mc: ModelConfig) -> CausalLM:
        self.calls[mc] += 1
        lm = load_model(mc)
        index = len(self.loaded)
        self.loaded.append(lm)
        lm.close = lambda: self.closed.update([index])  # type: ignore[attr-defined]
        return lm


def tokens_by_key(path: Path) -> dict[tuple[str, str, str, int, int], list[int]]:
    return {measurement_key(m): m["tokens"] for m in measurement_records(path)}


def assert_paired_with_own_plain(records: list[dict[str, Any]]) -> None:
    """Every speculative run's speedup is against its own configuration's plain run of the
    same (mode, prompt, repeat)."""
    plain = {
        (m["config"], m["mode"], m["prompt_id"], m["repeat"]): m for m in records if m["k"] == 0
    }
    for m in records:
        if m["k"] > 0:
            own = plain[(m["config"], m["mode"], m["prompt_id"], m["repeat"])]
            assert m["plain_tokens_per_second"] == own["tokens_per_second"]
            assert m["speedup"] == m["tokens_per_second"] / own["tokens_per_second"]


def test_interleaved_outputs_equal_block_mode(tmp_path: Path, prompt_file: Path) -> None:
    plan = small_plan(
        prompt_file, configs=tuple(parse_config(c) for c in SHARING), ks=(1, 2), repeats=1
    )
    block, inter = tmp_path / "block.jsonl", tmp_path / "inter.jsonl"
    run_bench(plan, block, progress=False)
    outcome = run_bench(replace(plan, interleave=True), inter, progress=False)
    want = tokens_by_key(block)
    assert outcome.measured == len(want) == 4 * 4 * 2 * 3
    # same keys, same tokens (greedy and seeded sampled) with shared model instances
    assert tokens_by_key(inter) == want
    assert_paired_with_own_plain(measurement_records(inter))


def test_interleaved_order_alternates_prompts_and_rotates_configs(
    tmp_path: Path, prompt_file: Path
) -> None:
    two = tmp_path / "two.txt"
    two.write_text("the cat sat on the mat\nhello world\n")
    plan = small_plan(two, ks=(1,), modes=("greedy",), repeats=2, interleave=True)
    order: list[tuple[int, str, str, int]] = []

    def note(record: dict[str, Any]) -> None:
        if record["type"] == "measurement":
            order.append((record["repeat"], record["prompt_id"], record["config"], record["k"]))

    run_bench(plan, tmp_path / "r.jsonl", progress=False, on_record=note)
    p0, p1 = "two:line1", "two:line2"

    def group(repeat: int, prompt: str, *configs: str) -> list[tuple[int, str, str, int]]:
        return [(repeat, prompt, c, k) for c in configs for k in (0, 1)]

    assert order == [
        *group(0, p0, "close", "ngram"),
        *group(0, p1, "ngram", "close"),  # rotated by the prompt
        *group(1, p0, "ngram", "close"),  # and by the repeat
        *group(1, p1, "close", "ngram"),
    ]


def test_interleaved_loads_identical_models_once_and_releases_each_once(
    tmp_path: Path, prompt_file: Path
) -> None:
    plan = small_plan(
        prompt_file,
        configs=tuple(parse_config(c) for c in SHARING),
        ks=(1,),
        modes=("greedy",),
        repeats=1,
        interleave=True,
    )
    loader = CountingLoader()
    run_bench(plan, tmp_path / "r.jsonl", progress=False, loader=loader)
    target = ModelConfig("mock:target")
    close = ModelConfig("mock:close")
    # mock:target twice (the "self" configuration needs a second instance), mock:close once;
    # block mode loads 2 + 1 + 2 + 2
    assert loader.calls == Counter({target: 2, close: 1})
    assert loader.closed == Counter(range(len(loader.loaded)))  # each released once

    block = CountingLoader()
    run_bench(replace(plan, interleave=False), tmp_path / "b.jsonl", progress=False, loader=block)
    assert block.calls == Counter({target: 5, close: 2})

    # released also when a run fails midway
    failing = CountingLoader()
    crash = crash_at(1, RuntimeError)
    with pytest.raises(RuntimeError):
        run_bench(plan, tmp_path / "f.jsonl", progress=False, loader=failing, on_record=crash)
    assert failing.closed == Counter(range(len(failing.loaded))) and failing.loaded


def test_interleaved_shared_model_never_reuses_another_configs_cache(
    tmp_path: Path, prompt_file: Path
) -> None:
    # with reuse_prefix a run keeps the cached prefix it shares with its prompt; on a shared
    # target the cache a configuration finds must be its own, so a configuration's first run
    # after another configuration's prefills the whole prompt
    plan = small_plan(
        prompt_file, ks=(1, 2), modes=("greedy",), repeats=1, reuse_prefix=True, interleave=True
    )
    loader = CountingLoader()
    seen: dict[str, Any] = {"processed": 0, "last": None, "checked": 0}

    def check(record: dict[str, Any]) -> None:
        target = loader.loaded[0]  # the shared target (load_pair loads it first)
        delta = target.tokens_processed - seen["processed"]
        seen["processed"] = target.tokens_processed
        if record["type"] != "measurement":
            return
        if seen["last"] is not None and seen["last"] != record["config"]:
            assert record["k"] == 0
            # the whole prompt but its last token, then one token per plain step
            assert delta == record["prompt_tokens"] - 1 + record["n_tokens"]
            seen["checked"] += 1
        seen["last"] = record["config"]

    run_bench(plan, tmp_path / "r.jsonl", progress=False, loader=loader, on_record=check)
    assert loader.calls[ModelConfig("mock:target")] == 1
    assert seen["checked"] == 4  # one change of configuration per prompt (rotated order)


@pytest.mark.parametrize("crash_after", [1, 7, 29])  # 7: mid-group, another config first
def test_interleaved_resume_skips_done_measurements(
    tmp_path: Path, prompt_file: Path, crash_after: int
) -> None:
    plan = small_plan(prompt_file, ks=(1, 2), interleave=True)
    full = tmp_path / "full.jsonl"
    run_bench(plan, full, progress=False)
    want = tokens_by_key(full)

    out = tmp_path / "crashed.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_bench(plan, out, progress=False, on_record=crash_at(crash_after, KeyboardInterrupt))
    outcome = run_bench(plan, out, resume=True, progress=False)
    assert outcome.already_done == crash_after
    assert outcome.measured == len(want) - crash_after
    keys = [measurement_key(m) for m in measurement_records(out)]
    assert Counter(keys).most_common(1)[0][1] == 1  # none duplicated
    assert tokens_by_key(out) == want  # none lost, same outputs
    assert_paired_with_own_plain(measurement_records(out))  # across the two sessions too
    assert Counter(p["config"] for p in read_results(out).profiles) == Counter(["close", "ngram"])


def test_interleave_is_recorded_in_the_header(tmp_path: Path, prompt_file: Path) -> None:
    assert BenchPlan().to_dict()["interleave"] is False
    out = tmp_path / "cli.jsonl"
    args = ["bench", "--config", "draft=mock:close,target=mock:target", "--config"]
    args += ["draft=ngram,target=mock:target", "--k", "1", "--prompts", str(prompt_file)]
    args += ["--categories", "a", "--max-new-tokens", "4", "--profile-repeats", "1"]
    args += ["--verify-max", "2", "--out", str(out), "--no-progress", "--interleave"]
    assert main(args) == 0
    res = read_results(out)
    assert res.headers[0]["plan"]["interleave"] is True
    assert len(res.measurements) == 2 * 2 * 2  # configs x prompts of category a x (plain + K)


def test_predictions_are_drafted_and_counted(tmp_path: Path) -> None:
    """``prediction=1``: a prompt's prediction is drafted first; greedy output stays plain
    decoding's; records count OpenAI's accepted / rejected prediction tokens; prompts without
    a prediction keep the configuration's own drafter (counts null); the report shows them."""
    from specdec.bench.report import write_report

    texts = ["edit the cat", "edit the dog", "no prediction here"]
    path = tmp_path / "pred.jsonl"
    rows = [
        {"prompt": texts[0], "category": "code_predict", "prediction": "the cat sat on the mat"},
        {"prompt": texts[1], "category": "code_predict", "prediction": ""},
        {"prompt": texts[2], "category": "code_predict"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = BenchPlan(
        configs=(
            parse_config("draft=suffix,target=mock:target:64,prediction=1"),
            parse_config("draft=suffix,target=mock:target:64"),
        ),
        ks=(4,),
        modes=("greedy",),
        prompt_source=str(path),
        categories=None,
        prompts_per_category=0,
        max_new_tokens=12,
        repeats=1,
        stop_on_eos=False,
        profile_repeats=1,
        verify_max=6,
        profile_context_tokens=20,
        warmup=False,
    )
    out = tmp_path / "r.jsonl"
    run_bench(plan, out)
    ms = measurement_records(out)
    assert plan.configs[0].label == "prediction+suffix->mock:target:64"
    pred = [m for m in ms if m["config"] == plan.configs[0].label and m["k"] > 0]
    plain = {m["prompt_id"]: m["tokens"] for m in ms if m["k"] == 0}
    assert {m["prompt_id"]: m["tokens"] for m in pred} == plain
    counted = {m["prompt_id"]: m["accepted_prediction_tokens"] for m in pred}
    assert counted["pred:line3"] is None and counted["pred:line2"] == 0
    first = next(m for m in pred if m["prompt_id"] == "pred:line1")
    assert first["accepted_prediction_tokens"] + first["rejected_prediction_tokens"] >= 1
    other = [m for m in ms if m["config"] == plan.configs[1].label and m["k"] > 0]
    assert all(m["accepted_prediction_tokens"] is None for m in other)
    md = write_report(out).read_text()
    assert "## Predicted outputs" in md and "prediction+suffix" in md
