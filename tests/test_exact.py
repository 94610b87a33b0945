"""Exact numerics: a token's logits do not depend on how many tokens share its pass, so
speculative output is plain decoding's, token for token.

The real-model tests use the small test model (SmolLM2-135M, Q4_1) and skip with a reason
without it. The per-row checks run ``benchmarks/studies/exact_rows.py``'s worker in subprocesses
(ggml reads GGML_CPU_TILED_MM once per process); each has a fixture that must fail: llama.cpp's
default settings, and exact numerics without their KV cache types at a long context.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.errors import ConfigError
from specdec.models.exact import NotExactError, check_rows_exact, compare_rows, self_check
from specdec.models.loader import ModelConfig, load_model
from specdec.models.mock import MockLM
from specdec.models.wrapped import WrappedLM
from tiny_models import llama_cpp_or_skip, store_model_or_skip

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "studies"))


def test_compare_rows_is_bitwise() -> None:
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert compare_rows(a, a.clone(), context=5).exact
    b = a.clone()
    b[2, 1] = torch.nextafter(b[2, 1], torch.tensor(100.0))  # one ulp in one element
    check = compare_rows(b, a, context=5)
    assert not check.exact and check.first_row == 2 and check.n == 3 and check.context == 5
    assert 0 < check.max_abs < 1e-5


class BatchDependentLM(WrappedLM):
    """A mock whose rows move by 1e-6 inside passes of more than one token, as a batched
    kernel with another reduction order would."""

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        rows = super().extend(tokens, last_only=last_only)
        return rows + 1e-6 if len(tokens) > 1 else rows


def _mock() -> MockLM:
    lm = load_model(ModelConfig("mock:target:64"))
    assert isinstance(lm, MockLM)
    return lm


def test_the_mock_models_are_exact_and_a_batch_dependent_one_is_refused() -> None:
    checks = check_rows_exact(_mock(), [1, 2, 3], list(range(4, 20)), range(1, 17))
    assert [c.n for c in checks] == list(range(1, 17)) and all(c.exact for c in checks)
    self_check(_mock(), "mock")  # passes
    with pytest.raises(NotExactError, match="row 0 of a 8-token pass"):
        self_check(BatchDependentLM(_mock()), "batch-dependent mock")


def test_exact_model_configs() -> None:
    assert ModelConfig("mock:target", exact=True).label() == "mock:target@mock/exact"
    assert load_model(ModelConfig("mock:target", exact=True)).n_cached == 0  # checked, emptied
    with pytest.raises(ConfigError, match=r"llama\.cpp backend"):
        ModelConfig("some/dir", backend="hf", exact=True)


def test_exact_settings_refuse_what_contradicts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.llama_trust.exact_kernels import DEFAULT_ATTENTION, FLASH_Q8_0_KEYS
    from specdec.models.llamacpp import TILED_ENV, _exact_settings

    monkeypatch.delenv(TILED_ENV, raising=False)
    flash = FLASH_Q8_0_KEYS
    # repack stays as asked: the groups that break row invariance move off at load
    assert _exact_settings(None, "f16", "f16", flash) == (True, True, "q8_0", "f16")
    assert _exact_settings(False, "f16", "f16", flash) == (False, True, "q8_0", "f16")
    assert _exact_settings(True, "f16", "f16", flash)[0] is True
    # the attention is the build's: llama.cpp's default on the exact build from version 4
    assert _exact_settings(None, "f16", "f16", DEFAULT_ATTENTION) == (True, False, "f16", "f16")
    import os

    assert os.environ[TILED_ENV] == "0"  # set for this process (ggml reads it once)
    with pytest.raises(ConfigError, match="KV cache types"):
        _exact_settings(None, "f32", "f16", flash)
    with pytest.raises(ConfigError, match=r"KV cache types themselves \(f16/f16\)"):
        _exact_settings(None, "q8_0", "f16", DEFAULT_ATTENTION)
    monkeypatch.setenv(TILED_ENV, "1")
    with pytest.raises(ConfigError, match="GGML_CPU_TILED_MM='1'"):
        _exact_settings(None, "f16", "f16", flash)


@pytest.fixture(scope="module")
def smol() -> Path:
    llama_cpp_or_skip()
    return store_model_or_skip()


def _rows(smol: Path, setting: str, threads: list[int], contexts: list[int], ns: list[int]) -> Any:
    from exact_rows import run_setting

    return run_setting(str(smol), setting, threads, contexts, ns)


def _differing(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    from exact_rows import differing_passes

    return differing_passes(result)


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.slow
def test_every_row_of_every_pass_is_bit_identical_under_exact_numerics(smol: Path) -> None:
    """n = 1..16 at a short context and past 512 KV cells (where flash attention's one-token
    path would split the KV range across threads), at 1, 2 and 3 threads."""
    ns = list(range(1, 17))
    result = _rows(smol, "exact", [2], [20, 600, 1100], ns)
    result.update(_rows(smol, "exact", [1, 3], [600], ns))
    assert sorted(result) == ["1", "2", "3"]
    assert _differing(result) == []


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_llama_cpp_default_settings_are_not_batch_invariant(smol: Path) -> None:
    """The fixture the per-row check must fail: llama.cpp's defaults (a batched kernel from 8
    rows on this model)."""
    result = _rows(smol, "default", [2], [20], [2, 9, 16])
    assert ("2", "20", "16") in _differing(result)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_exact_needs_its_cache_types_past_512_cells(smol: Path) -> None:
    """The second fixture: exact numerics with an F16 value cache at 600 tokens of context,
    2 threads; the short context stays identical (no split below 512 cells)."""
    result = _rows(smol, "exact_f16_cache", [2], [20, 600], [2, 8])
    assert _differing(result) == [("2", "600", "2"), ("2", "600", "8")]


def _llama_cpp_loop(llm: Any, prompt_ids: list[int], n: int) -> list[int]:
    """llama-cpp-python's own greedy loop (``Llama.generate``) on a Llama object."""
    out: list[int] = []
    for tok in llm.generate(prompt_ids, top_k=1, temp=0.0, reset=True):
        out.append(int(tok))
        if len(out) == n or tok == llm.token_eos():
            break
    return out


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.slow
@pytest.mark.fresh_process
def test_speculative_output_is_plain_decoding_token_for_token(
    smol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy, on the exact target: suffix drafts up to 16 tokens, prompt lookup and a draft
    model (on llama.cpp's fast numerics: a draft only proposes) give plain decoding's tokens,
    and so does llama-cpp-python's own loop on a second instance with the same settings, on
    a short, a code and a 700+-token prompt."""
    from specdec.core.loop import generate
    from specdec.drafters.suffix import SuffixDrafter
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.pairs import parse_drafter
    from specdec.prompt_sets import load_spec_bench
    from specdec.prompting import encode_prompt

    monkeypatch.setenv("GGML_CPU_TILED_MM", "0")
    target = LlamaCppLM(smol, n_ctx=2048, n_threads=2, exact=True)
    other = LlamaCppLM(smol, n_ctx=2048, n_threads=2, exact=True)
    draft = LlamaCppLM(smol, n_ctx=2048, n_threads=2)  # the fast default numerics
    texts = [p.text for p in load_spec_bench()]
    long_text = "Summarize these questions:\n" + "\n".join(texts[:16])
    prompts = [
        encode_prompt(target, "What is the capital of France?", chat=True),
        encode_prompt(target, "def fibonacci(n):\n    ", chat=False),
        encode_prompt(target, long_text, chat=True),
    ]
    assert len(prompts[2]) > 700
    for ids in prompts:
        plain = generate(target, None, ids, max_new_tokens=48, k=0).tokens
        assert len(plain) > 8
        for drafter, k in ((SuffixDrafter(), 16), (parse_drafter("ngram"), 8), (draft, 6)):
            res = generate(target, drafter, ids, max_new_tokens=48, k=k)
            assert res.tokens == plain, (drafter, len(ids))
            assert res.extra.get("exact") is True
        assert _llama_cpp_loop(other.llm, ids, len(plain)) == plain


@pytest.mark.parametrize(
    ("exact_step", "exact_verify", "exact_prefill", "default"),
    [
        (0.0510, 0.200, 99.0, True),  # +2 % step, +0 % verify, -1 % prefill
        (0.0525, 0.200, 99.0, False),  # the plain step +5 %
        (0.0500, 0.240, 99.0, False),  # the step free, the verify pass +20 % (the exact build)
        (0.0500, 0.200, 50.0, False),  # the step free, prefill at half speed
    ],
)
def test_exact_numerics_are_the_default_only_where_step_verify_and_prefill_cost_at_most_3_percent(
    exact_step: float, exact_verify: float, exact_prefill: float, default: bool
) -> None:
    """The profile's rule on fixed worker figures, a fixture each way for each of the three
    prices (medians over rounds)."""
    from specdec.profiler.exact_price import ExactPrice, price_of

    samples = {
        "default": [
            {"step_s": 0.050, "verify_s": 0.200, "prefill_tps": 100.0},
            {"step_s": 0.051, "verify_s": 0.200, "prefill_tps": 100.0},
        ],
        "exact": [
            {"step_s": exact_step, "verify_s": exact_verify, "prefill_tps": exact_prefill},
            {"step_s": exact_step * 1.02, "verify_s": exact_verify, "prefill_tps": exact_prefill},
        ],
    }
    price = price_of(samples)
    assert price.rounds == 2 and price.step_s == pytest.approx(0.0505)
    assert price.default is default
    assert ("use --exact" in price.sentence()) is not default
    assert ExactPrice.from_dict(price.to_dict()) == price


def test_a_profile_cached_before_verify_passes_were_timed_does_not_make_exact_the_default() -> None:
    from specdec.profiler.exact_price import ExactPrice

    old = {"step_s": 0.05, "exact_step_s": 0.05, "prefill_tps": 100.0}
    price = ExactPrice.from_dict({**old, "exact_prefill_tps": 100.0, "rounds": 2})
    assert price.verify_cost is None and price.cost is None and not price.default
    assert "verify pass not measured" in price.sentence()


def test_cached_exact_costs_are_keyed_by_the_kv_cache_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a cost measured under other cache types must not be reused (it is another price)
    from specdec.llama_trust import exact_kernels
    from specdec.models.loader import ModelConfig
    from specdec.profiler import target_costs

    cfg = ModelConfig("mock:target", backend="mock", exact=True)
    keys = []
    for attention in (
        exact_kernels.FLASH_Q8_0_KEYS,
        exact_kernels.ExactAttention(True, "f16", "q8_0"),
        exact_kernels.DEFAULT_ATTENTION,  # the exact build's (version 4): another price again
    ):
        monkeypatch.setattr(target_costs, "exact_attention", lambda a=attention: a)
        keys.append(target_costs.costs_key(cfg))
    assert len(set(keys)) == 3


def test_a_rows_setting_does_not_inherit_the_callers_ggml_switches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that loaded an exact model has ggml's switches set; the "default" setting's
    child must still run llama.cpp's defaults (else the fixture that must differ passes as
    identical on the exact build), and a setting's own switches still reach its child."""
    import subprocess

    import exact_rows

    seen: list[dict[str, str]] = []

    def fake_run(cmd: list[str], env: dict[str, str], **kw: object) -> object:
        seen.append(env)
        return subprocess.CompletedProcess(cmd, 0, stdout="{}\n", stderr="")

    monkeypatch.setenv("GGML_CPU_REPACK_ROW_INVARIANT", "1")
    monkeypatch.setenv("GGML_CPU_TILED_MM", "0")
    monkeypatch.setattr(exact_rows.subprocess, "run", fake_run)
    exact_rows.run_setting("m.gguf", "default", [1], [20], [2])
    exact_rows.run_setting("m.gguf", "ri_noflash_off", [1], [20], [2])
    assert not set(exact_rows.GGML_SWITCHES) & set(seen[0])
    assert seen[1]["GGML_CPU_REPACK_ROW_INVARIANT"] == "0"
