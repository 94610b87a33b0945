"""What runs when nothing about speculation is chosen (`specdec generate` with no -k, --draft
or --adaptive; `specdec.load()` with the default draft; `specdec serve`): the cached
profile's recommendation when this machine has one, else the cost-aware suffix drafter on the
target's own backend, whose costs are measured once and cached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import specdec
from specdec.cli import main
from specdec.pairs import DEFAULT_DRAFT, DEFAULT_TARGET_BACKEND
from specdec.profiler import auto
from specdec.profiler.auto import machine_default, unprofiled_choice
from specdec.profiler.run import ProfileSpec, cached_profile, run_profile

MOCK = ["--target", "mock:target", "--target-backend", "mock", "--no-stop", "--json"]


def test_without_a_profile_generate_runs_the_planned_drafter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["generate", *MOCK, "-n", "12", "abc abc abc abc"]) == 0
    out = capsys.readouterr()
    assert "default: planned -> mock" in out.err
    assert "measuring the target's verify cost" in out.err  # once ...
    spec = json.loads(out.out)
    assert spec["configuration"]["label"] == "planned -> mock" and spec["configuration"]["k"] == 64
    assert main(["generate", *MOCK, "-n", "12", "-k", "0", "abc abc abc abc"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert spec["n_tokens"] == 12 and spec["text"] == plain["text"]  # greedy: the same text
    assert main(["generate", *MOCK, "-n", "12", "abc abc abc abc"]) == 0
    assert "measuring" not in capsys.readouterr().err  # ... then cached


def test_naming_a_drafter_or_k_is_not_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", *MOCK, "-n", "6", "--draft", "ngram", "--draft-backend", "mock", "xy"]
    assert main(argv) == 0
    assert "default:" not in capsys.readouterr().err
    assert main(["generate", *MOCK, "-n", "6", "-k", "0", "xy"]) == 0
    assert "default:" not in capsys.readouterr().err


def test_a_cached_profile_decides_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a profile on record its recommendation runs, not the unprofiled rule."""
    spec = ProfileSpec(
        target="mock:target",
        target_backends=("mock",),
        drafts=("ngram",),
        draft_backend="mock",
        n_new=12,
        k_free=(2, 4),
        check_top=1,
        n_ctx=512,
    )
    result = run_profile(spec, ["abc abc abc abc abc", "the cat sat on the mat"])
    seen: list[dict[str, Any]] = []

    def cached(*args: Any, **kw: Any) -> Any:
        seen.append(kw)
        return result

    monkeypatch.setattr(auto, "auto_profile", cached)
    choice = machine_default(
        "mock:target", target_backend="mock", draft_backend="mock", n_ctx=512, n_threads=None
    )
    assert seen and seen[0]["cached_only"] is True  # nothing is profiled by the default
    assert choice.label == result.recommendation["label"]
    assert main(["generate", *MOCK, "-n", "8", "abc abc abc abc"]) == 0
    assert f"default: {result.recommendation['label']}" in capsys.readouterr().err


def test_the_profile_cli_caches_what_the_default_looks_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """`specdec profile` with no flags and `generate` with no flags use one cache key."""
    from specdec.cli import build_parser
    from specdec.cli import profile as profile_cli

    args = build_parser().parse_args(["profile"])
    cli_spec = profile_cli.spec_from_args(args)
    looked_up: list[ProfileSpec] = []

    def fake_cached(spec: ProfileSpec, prompts: Any, log: Any = None) -> None:
        looked_up.append(spec)

    monkeypatch.setattr(auto, "cached_profile", fake_cached)
    machine_default(
        cli_spec.target,
        target_backend=DEFAULT_TARGET_BACKEND,
        draft_backend="auto",
        n_ctx=cli_spec.n_ctx,
        n_threads=None,
    )
    assert looked_up == [cli_spec]
    assert DEFAULT_DRAFT in cli_spec.drafts and "planned" in cli_spec.drafts


def test_the_api_default_and_serve_use_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    pair = specdec.load("mock:target", target_backend="mock", n_ctx=512)
    assert pair.auto is not None and pair.auto.label == "planned -> mock"
    done = pair.generate("abc abc abc abc", max_new_tokens=10, stop_on_eos=False)
    plain = pair.generate("abc abc abc abc", max_new_tokens=10, stop_on_eos=False, k=0)
    assert done.tokens == plain.tokens
    assert cached_profile(ProfileSpec(target="mock:target"), ["x"]) is None
    assert unprofiled_choice("llamacpp").speculative


def test_a_profiled_planned_choice_uses_the_profiles_costs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the cached profile recommends the planned drafter, its costs are the profile's:
    nothing is measured again (the cost measurement here would raise)."""
    import dataclasses

    from specdec.profiler import target_costs
    from specdec.theory import Costs

    n = target_costs.N_MAX  # a profile of this version measures passes up to a planned draft's
    costs = Costs(verify_s=tuple(1.0 + 0.02 * i for i in range(n)), prefill_tps=1e3)
    choice = dataclasses.replace(unprofiled_choice("mock"), costs=costs, reason="profiled")

    def no_measuring(*args: Any, **kw: Any) -> Any:
        raise AssertionError("measured again")

    monkeypatch.setattr(auto, "machine_default", lambda *a, **kw: choice)
    monkeypatch.setattr(target_costs, "cached_target_costs", no_measuring)
    pair = specdec.load("mock:target", target_backend="mock", n_ctx=512)
    assert pair.auto is choice and pair.draft is not None
    assert pair.draft.costs is costs  # type: ignore[union-attr]
    assert main(["generate", *MOCK, "-n", "8", "abc abc abc abc"]) == 0
    err = capsys.readouterr().err
    assert "default: planned -> mock: profiled" in err and "measuring" not in err


def test_the_cost_provider_uses_the_profiles_costs_only_for_the_numerics_it_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planned drafter gets the profile's costs unless exact numerics run (the profile
    timed the default kernels): then, as without a profile, the target's are measured."""
    from specdec.models.loader import ModelConfig
    from specdec.profiler import target_costs
    from specdec.theory import Costs

    profiled = Costs(verify_s=(1.0, 1.1), prefill_tps=1e3)
    measured = Costs(verify_s=(2.0, 2.2), prefill_tps=5e2)
    monkeypatch.setattr(target_costs, "cached_target_costs", lambda *a, **kw: measured)
    cfg, lm = ModelConfig("mock:target"), object()

    def provided(draft: str, profile: Costs | None, exact: bool) -> Costs | None:
        provider = target_costs.cost_provider(draft, profile, exact=exact)
        return None if provider is None else provider(cfg, lm)  # type: ignore[arg-type]

    long = Costs(verify_s=(1.0,) * target_costs.N_MAX, prefill_tps=1e3)
    assert provided("planned", long, exact=False) is long
    assert provided("planned", profiled, exact=True) is measured
    assert provided("planned", None, exact=False) is measured
    assert provided("ngram", profiled, exact=False) is None  # only a planned drafter asks


def test_a_profile_cached_for_shorter_drafts_is_extended_never_extrapolated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A profile measured before drafts of 64 holds passes of up to 16 rows: its curve is
    continued with the shape of the target's cached measurement (to N_MAX rows), its own
    points kept; a planned draft never reads past a curve's end."""
    from specdec.drafters.planned import best_plan
    from specdec.models.loader import ModelConfig
    from specdec.profiler import target_costs
    from specdec.theory import Costs

    n = target_costs.N_MAX
    measured = Costs(verify_s=tuple(2.0 * (1 + i) for i in range(n)), prefill_tps=5e2)
    monkeypatch.setattr(target_costs, "cached_target_costs", lambda *a, **kw: measured)
    old = Costs(verify_s=tuple(1.0 + 0.5 * i for i in range(16)), prefill_tps=1e3)
    provider = target_costs.cost_provider("planned", old, exact=False)
    assert provider is not None
    got = provider(ModelConfig("mock:target"), object())  # type: ignore[arg-type]
    assert len(got.verify_s) == n and got.verify_s[:16] == old.verify_s
    # past 16 rows the measured shape (linear, 2 per row) from the profile's last pass (8.5)
    assert got.verify_s[16] == pytest.approx(8.5 * 17 / 16)
    assert got.verify_s[-1] == pytest.approx(8.5 * n / 16)
    assert best_plan(1.0, 1.0, 1000, old)[0] <= 15  # the short curve: at most 16 rows


def test_cached_target_costs_shorter_than_the_longest_draft_are_measured_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry holding a curve of fewer passes than N_MAX (one written before drafts of 64,
    under a key of that version) is not read as a full curve: the costs are measured again
    and the entry replaced; an entry of the right length is read back as it was saved."""
    from dataclasses import asdict

    from specdec.models.loader import ModelConfig, load_model
    from specdec.profiler import cache, target_costs
    from specdec.theory import Costs

    cfg = ModelConfig("mock:target")
    lm = load_model(cfg)
    key = target_costs.costs_key(cfg)
    short = Costs(verify_s=(1.0,) * 17, prefill_tps=1e3)
    assert target_costs.cached_costs({"costs": asdict(short)}) is None
    cache.save(key, {"costs": asdict(short), "model": cfg.model})
    logs: list[str] = []
    got = target_costs.cached_target_costs(cfg, lm, log=logs.append)
    # measured, and said: the short entry named (issue 62, item 8), then the measurement
    assert len(got.verify_s) == target_costs.N_MAX and len(logs) == 2, logs
    assert "shorter than" in logs[0]
    again = target_costs.cached_target_costs(cfg, lm, log=logs.append)
    assert again == got and len(logs) == 2  # then read back
