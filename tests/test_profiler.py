"""`specdec profile` and the reproducible adaptive K: the decision rule on synthetic profiles
(each verdict has a fixture that flips it), the round simulation, the cache key, and the
output distribution under ProfileK."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from seq_dist import exact_first_tokens
from specdec.cli import main
from specdec.cli.profile import render
from specdec.core.loop import generate
from specdec.core.policy import ProfileK
from specdec.core.sampling import SamplingConfig
from specdec.models.mock import mock_pair
from specdec.profiler import cache
from specdec.profiler import run as profiler_run
from specdec.profiler.decide import Candidate, rank
from specdec.profiler.measure import with_prefill_from
from specdec.profiler.predict import (
    ProbeSequence,
    pass_ceiling_tps,
    predict,
    runs_from_matches,
    simulate,
)
from specdec.profiler.run import ProfileSpec, run_profile, skip_reason
from specdec.theory import Costs

STEP = 0.030  # a 30 ms target step


def serial_costs(draft_token_s: float = 0.0, draft_round_s: float = 0.0) -> Costs:
    """Verification about as serial as llama.cpp Q4 on 2 cores: n tokens cost ~0.9 n steps."""
    return Costs(
        verify_s=tuple(STEP * max(1.0, 0.9 * n) for n in range(1, 17)),
        prefill_tps=100.0,
        draft_token_s=draft_token_s,
        draft_round_s=draft_round_s,
    )


def flat_costs(draft_token_s: float = 0.0, draft_round_s: float = 0.0) -> Costs:
    """Batch-parallel verification: 16 tokens cost 1.3 steps."""
    return Costs(
        verify_s=tuple(STEP * (1 + 0.02 * (n - 1)) for n in range(1, 17)),
        prefill_tps=100.0,
        draft_token_s=draft_token_s,
        draft_round_s=draft_round_s,
    )


def model_probe(agree: float, n: int = 400, seed: int = 0) -> list[ProbeSequence]:
    rng = np.random.default_rng(seed)
    matches = (rng.random(n) < agree).tolist()
    return [ProbeSequence(50, n, run=runs_from_matches(matches, 8))]


def recommend(costs_plain: Costs, costs_spec: Costs, seqs: list[ProbeSequence]) -> str:
    plain = Candidate("llamacpp", "none", False)
    spec = Candidate("llamacpp", "draft", True)
    plain_seqs = [ProbeSequence(s.prompt_tokens, s.n_tokens, run=(0,) * s.n_tokens) for s in seqs]
    preds = [(plain, predict(plain.label, costs_plain, plain_seqs, 0, model_draft=False))]
    preds += [
        (spec, predict(spec.label, costs_spec, seqs, k, model_draft=True)) for k in range(1, 9)
    ]
    rec = rank(preds, prompt_tokens=50, new_tokens=400, costs={"llamacpp": costs_plain})
    assert rec.reason  # always says why
    return rec.best.candidate.drafter


def test_serial_verification_recommends_plain_decoding() -> None:
    # a good draft (90 % agreement) costing 0.6 of a step, on a serial verifier
    seqs = model_probe(0.9)
    assert recommend(serial_costs(), serial_costs(draft_token_s=0.6 * STEP), seqs) == "none"


def test_cheap_draft_and_flat_verification_recommend_speculation() -> None:
    # the flipping fixture: the same acceptance, a cheap draft and a flat verifier
    seqs = model_probe(0.9)
    assert recommend(flat_costs(), flat_costs(draft_token_s=0.05 * STEP), seqs) == "draft"


def test_a_poor_draft_on_a_flat_verifier_still_loses() -> None:
    seqs = model_probe(0.1)
    assert recommend(flat_costs(), flat_costs(draft_token_s=0.3 * STEP), seqs) == "none"


def test_runs_from_matches() -> None:
    m = [True, True, False, True, True, True]
    assert runs_from_matches(m, 8) == (2, 1, 0, 3, 2, 1)
    assert runs_from_matches(m, 2) == (2, 1, 0, 2, 2, 1)


def test_simulation_of_a_model_draft_is_exact() -> None:
    seq = ProbeSequence(10, 10, run=runs_from_matches([True] * 10, 8))
    plan = simulate(seq, 3)  # rounds keep 3 drafts + 1 bonus; the last is cut to fit
    assert plan.kept == (3, 3, 1) and plan.drafted == (3, 3, 1) and plan.tokens == 10


def test_model_free_drafts_shorter_than_k_cost_less_and_keep_less() -> None:
    # a lookup that proposes 2 tokens where it has a match and nothing elsewhere
    props = tuple((2, 2) if t % 3 == 0 else (0, 0) for t in range(30))
    seq = ProbeSequence(10, 30, proposals=props)
    plan = simulate(seq, 8)
    assert max(plan.drafted) == 2  # never the K asked for
    costs = flat_costs(draft_round_s=0.001)
    k8 = predict("x", costs, [seq], 8, model_draft=False)
    k2 = predict("x", costs, [seq], 2, model_draft=False)
    assert k8.decode_s == pytest.approx(k2.decode_s)  # K above the draft length changes nothing
    assert k8.mean_drafted < 8


def test_profile_key_changes_with_what_the_numbers_depend_on(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    machine = {"cpu": "x", "cores": 2, "versions": {"llama_cpp": "0.3.36"}}
    base = {
        "target": str(model),
        "drafts": ["ngram"],
        "settings": {"n_ctx": 4096},
        "prompts": ["p"],
    }
    k0 = cache.profile_key(**base, machine=machine)  # type: ignore[arg-type]
    assert cache.profile_key(**base, machine=machine) == k0  # type: ignore[arg-type]
    model.write_bytes(b"GGUF" + b"\1" * 64)  # the model file changed
    k1 = cache.profile_key(**base, machine=machine)  # type: ignore[arg-type]
    assert k1 != k0
    newer = {**machine, "versions": {"llama_cpp": "0.3.37"}}
    assert cache.profile_key(**base, machine=newer) != k1  # type: ignore[arg-type]
    other = {**base, "settings": {"n_ctx": 2048}}
    assert cache.profile_key(**other, machine=machine) != k1  # type: ignore[arg-type]
    assert cache.load_cached(k0, tmp_path) is None
    cache.save(k0, {"x": 1}, tmp_path)
    assert cache.load_cached(k0, tmp_path) == {"x": 1, "key": k0}
    assert cache.load_cached(k1, tmp_path) is None


MOCK_SPEC = ProfileSpec(
    target="mock:target",
    target_backends=("mock",),
    drafts=("mock:close", "ngram"),
    draft_backend="mock",
    n_new=16,
    k_model=(1, 2, 4),
    k_free=(2, 4),
    check_top=2,
    n_ctx=512,
)


def test_run_profile_on_mocks_recommends_and_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    prompts = ["def f(x):\n    return x + 1\n" * 3, "The quick brown fox. " * 4]
    first = run_profile(MOCK_SPEC, prompts)
    labels = {c["config"] for c in first.checks}
    assert "plain mock" in labels and len(first.checks) >= 2
    assert first.recommendation["label"] in {
        "plain mock",
        "mock:close -> mock",
        "ngram -> mock",
    }
    assert first.recommendation["reason"]
    again = run_profile(MOCK_SPEC, prompts)  # from the cache: same numbers
    assert again.predictions == first.predictions and again.key == first.key
    fresh = run_profile(MOCK_SPEC, prompts, refresh=True)
    assert fresh.key == first.key and fresh.costs != first.costs  # measured again


def test_profile_cli_prints_valid_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    argv = ["profile", "--target", "mock:target", "--target-backend", "mock"]
    argv += ["--draft", "ngram", "--new-tokens", "8", "--category", "qa", "--check-top", "1"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommendation"]["label"] in {"plain mock", "ngram -> mock"}
    assert main(argv) == 0
    assert "recommendation:" in capsys.readouterr().out


# -- the reproducible adaptive policy ----------------------------------------------------------


def test_profile_k_falls_back_on_serial_costs_and_speculates_on_flat_ones() -> None:
    serial = ProfileK(serial_costs(draft_token_s=0.6 * STEP), k_max=8, prior_accept=0.9)
    flat = ProfileK(flat_costs(draft_token_s=0.05 * STEP), k_max=8, prior_accept=0.9)
    assert serial.next_k() == 0
    assert flat.next_k() >= 4


def test_profile_k_is_reproducible() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    cfg = SamplingConfig(0.9)

    def run() -> tuple[list[int], list[int]]:
        pol = ProfileK(flat_costs(draft_token_s=0.2 * STEP), k_max=6, probe_every=4)
        res = generate(
            target,
            draft,
            [0, 3],
            max_new_tokens=40,
            k=pol,
            sampling=cfg,
            seed=11,
            stop_on_eos=False,
        )
        return res.tokens, pol.trace

    assert run() == run()
    _, trace = run()
    assert len(set(trace)) > 1  # K really adapts


N_SEQ = 8000  # sequences per configuration; threshold p > 1e-3 stated in advance


@pytest.mark.slow
@pytest.mark.parametrize("closeness", ["close", "far"])
def test_profile_k_keeps_the_target_distribution(closeness: str) -> None:
    """Level 2 style: first 3 tokens of independent sequences against the exact target law."""
    draft, target = mock_pair(closeness, vocab_size=5, order=2, sharpness=1.0)
    cfg = SamplingConfig(1.0)
    prompt = [0, 2]
    exact = exact_first_tokens(target, prompt, cfg, 3)
    keys = sorted(exact)
    counts = dict.fromkeys(keys, 0)
    for s in range(N_SEQ):
        pol = ProfileK(flat_costs(draft_token_s=0.2 * STEP), k_max=3, probe_every=2)
        res = generate(
            target, draft, prompt, max_new_tokens=3, k=pol, sampling=cfg, seed=s, stop_on_eos=False
        )
        counts[tuple(res.tokens)] += 1
    obs = np.array([counts[k] for k in keys], dtype=float)
    exp = np.array([exact[k] for k in keys])
    exp = exp / exp.sum() * N_SEQ
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-3


def test_auto_generate_and_load_auto_run_the_recommendation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import specdec

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    argv = ["generate", "--auto", "--target", "mock:target", "--target-backend", "mock"]
    argv += ["--draft-backend", "mock", "--draft", "ngram", "--max-new-tokens", "12"]
    argv += ["--no-stop", "--json", "abc abc abc abc"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "auto:" in out.err and json.loads(out.out)["n_tokens"] == 12
    pair = specdec.load(
        "mock:target", "ngram", target_backend="mock", draft_backend="mock", auto=True
    )
    assert pair.auto is not None and pair.auto.label in {"plain mock", "ngram -> mock"}
    done = pair.generate("abc abc abc abc", max_new_tokens=12, stop_on_eos=False)
    plain = pair.generate("abc abc abc abc", max_new_tokens=12, stop_on_eos=False, k=0)
    assert done.tokens == plain.tokens  # greedy: whatever auto picks, the target's output


# -- the measured recommendation: margin for speculation, fallback margin for planned ---------


def _scored(drafter: str, k: int) -> Any:
    from specdec.profiler.decide import Candidate, Scored
    from specdec.profiler.predict import Prediction

    pred = Prediction(drafter, k, 1.0, 0.1, 10, 10, 0.0, 0.0, 10)
    return Scored(Candidate("llamacpp", drafter, False), k, pred, 1.0, 1.0, 1.0)


def _measured(plain_s: float, **others: float) -> dict[str, Any]:
    from specdec.profiler.decide import Recommendation
    from specdec.profiler.run import Check, _recommend

    plain = _scored("none", 0)
    rest = [_scored(name, 16 if name == "planned" else 2) for name in others]
    rec = Recommendation(best=plain, ranked=[plain, *rest], plain=plain, reason="predicted")
    checks = [Check("plain llamacpp", 0, 1.0, 1.0, 1.0, plain_s)]
    for s, secs in zip(rest, others.values(), strict=True):
        checks.append(Check(s.candidate.label, s.k, 1.0, 1.0, 1.0, secs))
    return _recommend(rec, checks)


def test_speculation_needs_the_margin_and_planned_only_the_fallback_margin() -> None:
    # planned within 3 % of plain: chosen (it falls back to plain steps by itself)
    r = _measured(10.0, planned=10.2)
    assert r["label"] == "planned -> llamacpp" and "falls back" in r["reason"]
    # planned more than 3 % slower: plain
    assert _measured(10.0, planned=10.4)["label"] == "plain llamacpp"
    # a fixed-K drafter within the noise is not chosen, and not as a fallback either
    assert _measured(10.0, suffix=9.8)["label"] == "plain llamacpp"
    # a drafter 1.05x faster wins over the fallback
    r = _measured(10.0, suffix=9.0, planned=9.9)
    assert r["label"] == "suffix -> llamacpp" and r["k"] == 2


def test_calibration_sets_the_curve_level_from_real_steps_and_keeps_its_shape() -> None:
    from specdec.profiler.measure import calibrated

    c = Costs(verify_s=(0.07, 0.11, 0.14), prefill_tps=100.0, row_s=0.001, round_s=0.001)
    slow = calibrated(c, 0.086)  # real steps took 86 ms: the curve was 20 % optimistic
    assert slow.step_s == pytest.approx(0.086)
    assert [v / slow.verify_s[0] for v in slow.verify_s] == pytest.approx(
        [v / c.verify_s[0] for v in c.verify_s]
    )
    assert calibrated(c, 0.0) == c  # nothing measured: unchanged


# -- skipping a backend that cannot win ---------------------------------------------------------


def test_pass_ceiling_bounds_every_pass_between_timed_points() -> None:
    # passes of 1, 2, 4 and 8 rows took 1, 1.5, 2 and 4 s: between 2 and 4 rows a pass costs
    # at least 1.5 s and yields at most 4 tokens, so 4 / 1.5 is the largest bound
    points = [(1, 1.0), (2, 1.5), (4, 2.0), (8, 4.0)]
    assert pass_ceiling_tps(points) == pytest.approx(max(2 / 1.0, 4 / 1.5, 8 / 2.0, 8 / 4.0))
    assert pass_ceiling_tps(points) == pytest.approx(4.0)
    # a flat curve: the largest pass gives the ceiling
    assert pass_ceiling_tps([(1, 1.0), (17, 1.0)]) == pytest.approx(17.0)
    for bad in ([], [(2, 1.0)], [(1, 1.0), (1, 2.0)], [(1, 0.0)], [(1, float("nan"))]):
        with pytest.raises(ValueError):
            pass_ceiling_tps(bad)


def test_skip_reason_flips_with_the_ceiling_against_plain_decoding() -> None:
    measured = {"llamacpp": replace(serial_costs(), verify_s=(0.1,) * 17)}  # 10 tok/s plain
    # this machine's fp32 transformers passes: at most 8 tok/s, below 10: skipped
    slow = [(1, 0.65), (2, 1.25), (4, 1.94), (8, 2.07), (16, 2.37), (17, 2.44)]
    why = skip_reason("hf", slow, measured)
    assert why is not None and "at most 7.7 tok/s" in why and "llamacpp" in why
    # a flat verifier as fast as plain decoding per pass: up to 170 tok/s, profiled
    flat = [(1, 0.1), (2, 0.1), (4, 0.1), (8, 0.1), (16, 0.1), (17, 0.1)]
    assert skip_reason("hf", flat, measured) is None


@pytest.mark.parametrize("pass_s", [100.0, 1e-9])
def test_profile_leaves_out_a_skipped_backend(
    pass_s: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the ceiling passes are replaced by fixed numbers (no timing): 100 s a pass can never
    # beat the mock's plain step; 1 ns a pass always can
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(profiler_run, "ceiling_passes", lambda _lm, n: [(1, pass_s), (n, pass_s)])
    spec = replace(MOCK_SPEC, target_backends=("mock", "auto"), drafts=("ngram",), n_new=8)
    result = run_profile(spec, ["The quick brown fox. " * 4])
    backends = {c.target_backend for c, _ in result.candidates()}
    if pass_s > 1:
        assert set(result.skipped_backends) == {"auto"}
        assert backends == {"mock"}
        assert "auto: not profiled further" in render(result)
    else:
        assert result.skipped_backends == {}
        assert backends == {"mock", "auto"}


def test_prefill_throughput_from_the_probe_prompts_own_prefills() -> None:
    base = serial_costs()
    got = with_prefill_from(base, [100, 300], [1.0, 3.0])
    assert got.prefill_tps == pytest.approx(100.0)
    assert got.verify_s == base.verify_s  # nothing else changes
    with pytest.raises(ValueError):
        with_prefill_from(base, [100], [0.0])


@pytest.mark.parametrize("prompt", ["a", "The quick brown fox jumps over the lazy dog. " * 4])
def test_probe_prompts_too_short_to_time_fall_back_to_a_prefill_pass(
    prompt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(profiler_run, "prefill_throughput", lambda _lm: 123.0)
    timed: list[list[int]] = []  # the prompt token counts the probe's prefills were timed on

    def from_probe(costs: Costs, tokens: list[int], _seconds: list[float]) -> Costs:
        timed.append(list(tokens))
        return replace(costs, prefill_tps=456.0)

    monkeypatch.setattr(profiler_run, "with_prefill_from", from_probe)
    spec = replace(MOCK_SPEC, drafts=("ngram",), n_new=8, chat=False)
    result = run_profile(spec, [prompt])
    tps = result.costs["plain mock"]["prefill_tps"]
    if len(prompt) < 10:  # a one-token prefill: the dedicated pass
        assert tps == 123.0 and timed == []
    else:  # the probe's own prefill of dozens of tokens
        assert tps == 456.0
        assert len(timed) == 1 and sum(timed[0]) >= profiler_run.MIN_TIMED_PREFILL


def test_curve_samples_are_the_probe_prompts_with_parts_of_their_continuations() -> None:
    got = profiler_run.curve_samples([[1, 2], [3]], [[10, 11, 12, 13, 14, 15], [20, 21]])
    assert got == [  # the longer context first: a cache holding the run is only truncated
        ([1, 2, 10, 11, 12, 13], [14, 15]),
        ([1, 2, 10, 11], [12, 13, 14, 15]),
        ([3, 20], [21]),
        ([3], [20, 21]),  # m = 0: the prompt alone
    ]


def test_the_profile_takes_its_verify_curve_shape_from_the_probe_contexts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    seen: list[list[tuple[list[int], list[int]]]] = []
    cached: list[list[int]] = []  # what the target's cache held at each call

    def fixed_ratios(lm: Any, samples: Any, *, n_max: int) -> dict[int, list[float]]:
        seen.append(list(samples))
        cached.append(list(lm.cached_tokens))
        return {n: [1.0 + 0.7 * (n - 1)] for n in range(2, n_max + 1)}

    monkeypatch.setattr(profiler_run, "curve_ratios", fixed_ratios)
    spec = replace(MOCK_SPEC, drafts=("ngram",), n_new=9, chat=False)
    prompt = "The quick brown fox jumps over the lazy dog. " * 2
    result = run_profile(spec, [prompt])
    v = result.costs["plain mock"]["verify_s"]
    assert len(v) == profiler_run.PLANNED_K + 1  # a round's largest pass: a planned draft's
    assert [x / v[0] for x in v] == pytest.approx([1.0 + 0.7 * (n - 1) for n in range(1, 66)])
    assert result.costs["ngram -> mock"]["verify_s"] == v
    # timed at the probe prompt followed by two thirds and by a third of its continuation,
    # right after its greedy run (whose cache holds all of it: no prefill for the passes)
    (samples,) = seen
    full = samples[0][0] + samples[0][1]
    assert samples[1][0] + samples[1][1] == full
    n_prompt = result.prompt_tokens[0]
    n_cont = len(full) - n_prompt
    assert n_cont >= 3
    assert [len(ctx) - n_prompt for ctx, _ in samples] == [2 * n_cont // 3, n_cont // 3]
    assert cached == [full[:-1]]
