"""The plain-baseline script's accounting on real weights (SmolLM2-135M through llama.cpp):
llama-cpp-python's loop and specdec's are credited the same tokens for the same passes."""

from __future__ import annotations

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
