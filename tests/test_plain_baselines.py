"""The plain-baseline script's accounting on real weights (SmolLM2-135M through llama.cpp):
llama-cpp-python's loop and specdec's are credited the same tokens for the same passes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tiny_models import llama_cpp_or_skip, store_model_or_skip, threads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def smol() -> Path:
    llama_cpp_or_skip()
    return store_model_or_skip()


def test_both_loops_count_one_token_per_pass_after_the_first(smol: Path) -> None:
    import llama_cpp
    from plain_baselines import llama_cpp_own, specdec_run

    from specdec.models.llamacpp import LlamaCppLM

    n_new = 12
    ours = LlamaCppLM(smol, n_ctx=256, n_threads=threads())
    own = llama_cpp.Llama(
        model_path=str(smol), n_ctx=256, n_threads=threads(), n_batch=128, verbose=False
    )
    # a prompt that keeps the model talking past n_new tokens (a full-length run)
    ids = ours.tokenizer.encode("One, two, three, four, five, six, seven, eight, nine,")
    _, _, tokens_b = specdec_run(ours, None, ids, n_new, 0)
    _, _, tokens_a = llama_cpp_own(own, ids, n_new)
    # n_new tokens: the first comes with the prefill, the other n_new - 1 take one pass each
    assert tokens_b == n_new - 1
    assert tokens_a == n_new - 1


def test_the_report_gives_each_category_its_own_geometric_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Fixed runs (prefill s, decode s, tokens): per prompt the median of the runs' decode
    tokens/s, per category the geometric mean of the prompts' ratios, and the drafter also
    against specdec's plain loop. Category a: auto at half llama-cpp-python's speed on one
    prompt and equal on the other -> sqrt(0.5); category b: auto at 1.1x."""
    from plain_baselines import report

    base = [(1.0, 10.0, 100), (1.0, 10.0, 100)]  # 10 tok/s
    rows = {
        "p1": {"llama-cpp-python": base, "specdec plain": base, "auto": [(1.0, 20.0, 100)] * 2},
        "p2": {"llama-cpp-python": base, "specdec plain": base, "auto": base},
        "p3": {"llama-cpp-python": base, "specdec plain": base, "auto": [(1.0, 10.0, 110)] * 2},
    }
    report(rows, {"p1": "a", "p2": "a", "p3": "b"}, {"p1": 5, "p2": 6, "p3": 7})
    out = capsys.readouterr().out
    # the per-category rows: "  <decoder> / <baseline>" padded to 44 columns, then the cells
    lines = {ln[2:46].strip(): ln[46:] for ln in out.splitlines() if ln.startswith("  ")}
    auto = lines["auto / llama-cpp-python"]
    assert "0.707 [0.50, 1.00]" in auto and "1.100 [1.10, 1.10]" in auto
    assert "0.707 [0.50, 1.00]" in lines["auto / specdec plain"]
    assert "1.000 [1.00, 1.00]" in lines["specdec plain / llama-cpp-python"]


def test_reuse_prompt_prefills_a_prompt_once_per_instance(smol: Path) -> None:
    """With reuse_prompt, a second run of the same prompt evaluates only the last prompt token
    before decoding, on both loops, and is credited the same tokens; without it, the prompt is
    evaluated again."""
    import llama_cpp
    from plain_baselines import llama_cpp_own, specdec_run

    from specdec.models.llamacpp import LlamaCppLM

    n_new = 8
    ours = LlamaCppLM(smol, n_ctx=256, n_threads=threads())
    own = llama_cpp.Llama(
        model_path=str(smol), n_ctx=256, n_threads=threads(), n_batch=128, verbose=False
    )
    evaluated: list[int] = []  # tokens per eval call of the library's loop
    library_eval = own.eval

    def recording_eval(tokens):  # type: ignore[no-untyped-def]
        evaluated.append(len(tokens))
        return library_eval(tokens)

    own.eval = recording_eval  # type: ignore[method-assign]
    ids = ours.tokenizer.encode("One, two, three, four, five, six, seven, eight, nine,")
    assert len(ids) > 2
    for reuse, first_eval in ((False, len(ids)), (True, 1)):
        evaluated.clear()
        _, _, tokens_a = llama_cpp_own(own, ids, n_new, reuse_prompt=reuse)
        assert evaluated[0] == first_eval
        assert tokens_a == n_new - 1
    specdec_run(ours, None, ids, n_new, 0)  # the cache now holds the prompt and 8 tokens
    for reuse, passes in ((True, n_new), (False, n_new + 1)):  # + 1: the prefill's call
        before = ours.extend_calls
        _, _, tokens_b = specdec_run(ours, None, ids, n_new, 0, reuse_prompt=reuse)
        assert ours.extend_calls - before == passes
        assert tokens_b == n_new - 1


def _floor_rows(auto_tps: dict[str, float]) -> tuple[dict, dict[str, str]]:  # type: ignore[type-arg]
    """Two prompts per category, llama-cpp-python at 10 tok/s, auto at the given speed."""
    rows, cats = {}, {}
    for cat, tps in auto_tps.items():
        for j in range(2):
            pid = f"{cat}{j}"
            rows[pid] = {
                "llama-cpp-python": [(1.0, 10.0, 100)] * 3,
                "auto": [(1.0, 10.0, round(10 * tps))] * 3,
            }
            cats[pid] = cat
    return rows, cats


@pytest.mark.parametrize(
    ("auto_tps", "verdict"),
    [
        ({"a": 10.0, "b": 9.6}, "MET (lowest: b, 0.960x)"),
        ({"a": 10.0, "b": 9.4}, "NOT MET (lowest: b, 0.940x)"),  # one category under 0.95
    ],
)
def test_the_floor_verdict_flips_with_one_category(
    auto_tps: dict[str, float], verdict: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from plain_baselines import report

    rows, cats = _floor_rows(auto_tps)
    report(rows, cats, dict.fromkeys(rows, 5), end_to_end=False)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("floor"))
    assert line.endswith(verdict)
    assert "end to end: not measured" in out


def test_the_interval_resamples_prompts_so_pooled_copies_of_one_prompt_are_one_unit() -> None:
    from plain_baselines import gmean, interval

    xs = [0.90, 0.95, 1.00, 1.02, 1.10, 0.97]
    lo, hi = interval(xs, [f"p{i}" for i in range(6)])
    assert lo < gmean(xs) < hi
    assert interval(xs, [f"p{i}" for i in range(6)]) == (lo, hi)  # seeded
    # one prompt in three pooled runs: a single unit, so no interval
    lo, hi = interval([0.9, 1.0, 1.1], ["p #1", "p #2", "p #3"])
    assert math.isnan(lo) and math.isnan(hi)


def test_resume_keeps_complete_prompts_of_a_run_with_the_same_arguments(tmp_path: Path) -> None:
    from plain_baselines import resumed_rows, save

    args: dict[str, object] = {"model": "m", "source": "spec_bench", "repeats": 2, "k": 8}
    done = {"llama-cpp-python": [(1.0, 5.0, 63)] * 2, "auto": [(1.0, 5.0, 63)] * 2}
    half = {"llama-cpp-python": [(1.0, 5.0, 63)] * 2, "auto": [(1.0, 5.0, 63)]}
    path = tmp_path / "run.json"
    save(path, {"p1": done, "p2": half}, {"p1": "a", "p2": "b"}, {"p1": 5, "p2": 6}, args)
    kept = resumed_rows(path, args, ["llama-cpp-python", "auto"])
    assert list(kept) == ["p1"]  # p2 lacks one auto run: measured again
    assert kept["p1"]["auto"] == [(1.0, 5.0, 63)] * 2
    with pytest.raises(SystemExit, match="repeats"):
        resumed_rows(path, args | {"repeats": 3}, ["llama-cpp-python", "auto"])


def test_pooled_runs_key_each_prompt_by_run_and_keep_the_common_decoders() -> None:
    from plain_baselines import pooled

    one = [(1.0, 5.0, 63)]
    run1 = (
        {"p": {"llama-cpp-python": one, "specdec plain": one, "auto": one}},
        {"p": "a"},
        {"p": 5},
    )
    run2 = ({"p": {"llama-cpp-python": one, "auto": one}}, {"p": "a"}, {"p": 5})
    rows, cats, toks = pooled([run1, run2])
    assert list(rows) == ["p #1", "p #2"]
    assert list(rows["p #1"]) == ["llama-cpp-python", "auto"]  # specdec plain: run 2 lacks it
    assert cats == {"p #1": "a", "p #2": "a"} and toks == {"p #1": 5, "p #2": 5}


CATS = {
    "e1": "rename",
    "e2": "whole_file",
    "e3": "docstring",
    "c1": "control_empty",
    "c2": "control_unrelated",
}


@pytest.mark.parametrize(
    ("ratios", "met", "why"),
    [
        ({"e1": 1.6, "e2": 1.8, "e3": 1.5, "c1": 0.99, "c2": 0.98}, True, "met"),
        ({"e1": 1.3, "e2": 1.6, "e3": 1.4, "c1": 0.99, "c2": 0.98}, False, "edits"),  # mean
        ({"e1": 0.95, "e2": 2.5, "e3": 2.0, "c1": 0.99, "c2": 0.98}, False, "edits"),  # a prompt
        ({"e1": 1.6, "e2": 1.8, "e3": 1.5, "c1": 0.99, "c2": 0.96}, False, "control_unrelated"),
    ],
)
def test_the_prediction_verdict_flips(ratios: dict[str, float], met: bool, why: str) -> None:
    """Issue 27's rule, fixed before the run: edits >= 1.5x (geometric mean) with none below
    1.0x, controls with an empty or unrelated prediction >= 0.97x; each way of failing it."""
    from plain_baselines import prediction_verdict

    got, lines = prediction_verdict(ratios, CATS)
    assert got is met
    failing = [ln for ln in lines if "NOT met" in ln]
    assert (failing == []) is met
    assert met or failing[0].startswith(why)
