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
