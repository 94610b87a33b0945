"""Exact numerics keep the optional kernels that are row-invariant and move only the groups
(buffer type, weight type) whose rows depend on the pass size (``llama_trust.exact_kernels``).

The real-child tests use the small test model requantized to Q4_0 and to Q4_K_M (types ggml
repacks on x86; the Q4_1 file has none) and skip with a reason without it. A non-invariant group is
injected through the test hook (``SPECDEC_TEST_ROWS_FAULT=GROUP``) so that moving it off is
tested whatever this machine's kernels do; the fixture that must refuse plants a cached
verdict that keeps a group this machine's own probe found non-invariant.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.llama_trust.exact_kernels import ExactVerdict, GroupTrial, run_check
from specdec.llama_trust.ggml_bufts import Choice, group_name
from specdec.models.exact import NotExactError
from tiny_models import llama_cpp_or_skip, store_model_or_skip

Q4_0 = "CPU_REPACK/Q4_0"
Q4_K = "CPU_REPACK/Q4_K"


def test_group_names_and_choices_that_avoid_groups() -> None:
    assert group_name("CPU_REPACK", 12) == "CPU_REPACK/Q4_K"
    c = Choice.parse("avoid:CPU_REPACK/Q4_K,AMX")
    assert c.avoid == ("AMX", "CPU_REPACK/Q4_K")
    assert c.in_use(("AMX", "CPU_REPACK")) == ("CPU_REPACK",)  # a group keeps its buffer type
    assert Choice().avoiding(["CPU_REPACK/Q4_K"]).text() == "avoid:CPU_REPACK/Q4_K"
    assert Choice(avoid=("AMX",)).avoiding(["B/X", "AMX"]).avoid == ("AMX", "B/X")
    assert Choice(extras=False).avoiding(["B/X"]) == Choice(extras=False)


def test_the_verdict_round_trips_and_its_notice_names_the_moved_groups() -> None:
    v = ExactVerdict(
        "all",
        ("CPU_REPACK/Q4_0", "CPU_REPACK/Q4_K"),
        ("CPU_REPACK/Q4_K",),
        (GroupTrial(("CPU_REPACK/Q4_K",), False, "row 0 of a 4-token pass differs by 0.3", 1.0),),
        key="k",
    )
    assert ExactVerdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    assert v.kept == ("CPU_REPACK/Q4_0",)
    line = v.notice() or ""
    assert "CPU_REPACK/Q4_K" in line and "4-token pass" in line and "kept: CPU_REPACK/Q4_0" in line
    assert "\n" not in line
    assert ExactVerdict("all", ("CPU_REPACK/Q4_0",), ()).notice() is None


# --------------------------------------------------------------------------------------------
# real children on the small test model
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_q4_0() -> Path:
    llama_cpp_or_skip()
    from specdec.models.requantize import requantize

    return requantize(store_model_or_skip(), "q4_0", pure=True).path


@pytest.fixture(scope="module")
def smol_q4_k() -> Path:
    """Q4_K where rows allow it (the feed-forward down projections), Q5_0/Q6_K/Q8_0 else."""
    llama_cpp_or_skip()
    from specdec.models.requantize import requantize

    return requantize(store_model_or_skip(), "q4_k_m").path


def _tensors(path: Path) -> list[object]:
    from specdec.hub.gguf import check_gguf_header

    return list(check_gguf_header(path).tensors)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_groups_are_found_and_moved_per_weight_type(smol_q4_0: Path) -> None:
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ROW_LOOKUP, ggml, moved_tensors, weight_groups

    g = ggml(llama_cpp)
    if "CPU_REPACK" not in g.extra_types():
        pytest.skip("this llama.cpp build has no CPU_REPACK buffer type")
    tensors = _tensors(smol_q4_0)
    groups = weight_groups(g, tensors, Choice())
    assert Q4_0 in groups and groups[Q4_0] > 100
    assert weight_groups(g, tensors, Choice(avoid=(Q4_0,))) == {}
    assert weight_groups(g, tensors, Choice(extras=False)) == {}
    moved = moved_tensors(g, tensors, frozenset({Q4_0}))
    assert len([n for n in moved if n not in ROW_LOOKUP]) == groups[Q4_0]
    assert moved_tensors(g, tensors, frozenset({"CPU_REPACK/Q4_K"})) == {}  # none of that type


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_an_injected_non_invariant_group_is_moved_off(smol_q4_0: Path) -> None:
    """The must-fail fixture of the probe: the group is reported non-invariant in the child
    (``FAULT_ENV``), so the verdict avoids it (and says why)."""
    avoid, trials = run_check(smol_q4_0, Choice(), (Q4_0,), 2, Q4_0)
    assert avoid == (Q4_0,)
    assert not trials[0].exact and "injected" in trials[0].detail


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.fresh_process
def test_exact_mode_moves_what_the_probe_finds_and_refuses_a_wrong_verdict(
    smol_q4_k: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real probe on this machine's CPU_REPACK Q4_K kernel: exact mode loads with the
    verdict's choice and passes its self-check. Where the kernel is not row-invariant (x86
    AVX-512: the repacked gemm from 4 rows sums in another order than the gemv), a planted
    verdict that keeps it must make the load refuse exact mode with one line: the self-check
    is the last word.

    It runs in a fresh pytest process (marked ``fresh_process``): ggml reads
    GGML_CPU_TILED_MM once per process, at its first K-quant product, so after any
    default-numerics K-quant load in this process (the slow suite has many) the tiled path is
    on for good and the self-check rightly refuses even the right verdict."""
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml
    from specdec.models.llamacpp import LlamaCppLM

    if "CPU_REPACK" not in ggml(llama_cpp).extra_types():
        pytest.skip("this llama.cpp build has no CPU_REPACK buffer type")
    monkeypatch.setenv("SPECDEC_EXACT_CHECKS", str(tmp_path))
    lines: list[str] = []
    lm = LlamaCppLM(smol_q4_k, n_ctx=128, n_threads=2, exact=True, log=lines.append)
    v = lm.exact_kernels
    assert v is not None and v.groups == (Q4_K,) and not v.cached
    assert lm.kernel_choice == Choice(avoid=v.avoid) or not v.avoid
    if not v.avoid:
        pytest.skip(f"{Q4_K} is row-invariant on this machine: nothing to refuse")
    assert any(f"{Q4_K} give rows that depend on the pass size" in s for s in lines)
    (entry,) = tmp_path.glob("*.json")
    data = json.loads(entry.read_text())
    data["avoid"] = []  # the wrong verdict: keep the kernel
    entry.write_text(json.dumps(data))
    with pytest.raises(NotExactError, match=r"not batch-invariant.*row \d+ of a \d+-token pass"):
        LlamaCppLM(smol_q4_k, n_ctx=128, n_threads=2, exact=True, log=lines.append)
