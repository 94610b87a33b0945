"""The check of llama.cpp's optional kernels (llama_trust.kernel_check): a child that crashes, hangs
or computes wrong numbers turns its buffer type off, healthy kernels stay on, the verdict is
cached by what it depends on, and every load goes through it.

CI has no machine whose AMX kernels crash, so the faults are injected into the child through
the test hook (``SPECDEC_TEST_KERNEL_FAULT=KIND:BUFT``): a fault naming a buffer type this
build lacks (AMX here) makes the parent list it first, where ggml lists AMX, exactly as on such
a machine; the child then dies (or hangs, or returns garbage) whenever that type is in use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.llama_trust.ggml_bufts import Choice
from specdec.llama_trust.kernel_check import (
    FAULT_ENV,
    TV_TOLERANCE,
    CheckSettings,
    KernelVerdict,
    kernel_verdict,
    row_tv,
    run_check,
    verdict_key,
)
from specdec.llama_trust.kernel_probe import parse_fault
from tiny_models import llama_cpp_or_skip, store_model_or_skip, threads

# --------------------------------------------------------------------------------------------
# pure parts
# --------------------------------------------------------------------------------------------


def test_choices_round_trip_and_say_what_they_keep() -> None:
    listed = ("AMX", "CPU_REPACK")
    for text, kept in (("all", listed), ("none", ()), ("avoid:AMX", ("CPU_REPACK",))):
        c = Choice.parse(text)
        assert c.text() == text and c.in_use(listed) == kept
    for bad in ("", "some", "avoid:", "AMX"):
        with pytest.raises(ValueError, match="bad kernel choice"):
            Choice.parse(bad)


def test_faults_parse_and_reject_nonsense() -> None:
    assert parse_fault("segv:AMX") == ("segv", "AMX")
    assert parse_fault(None) is None and parse_fault("") is None
    for bad in ("segv", "boom:AMX", "segv:"):
        with pytest.raises(ValueError, match="bad kernel fault"):
            parse_fault(bad)


def test_row_tv_is_zero_for_equal_rows_and_near_one_for_unrelated_ones() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(0, 4, (3, 500)).astype(np.float32)
    assert row_tv(a, a) == 0.0
    assert row_tv(a, rng.normal(0, 4, (3, 500)).astype(np.float32)) > 0.9
    assert row_tv(a, a[:2]) == float("inf")
    b = a.copy()
    b[1, 7] = np.nan
    assert row_tv(a, b) == float("inf")


def test_the_placement_probe_sizes_its_buffer_as_the_buffer_type_asks() -> None:
    """On a build with AMX, AMX's layout of a weight is larger than ggml_nbytes, and a buffer
    of ggml_nbytes fails ggml's bounds assertion in ggml_backend_tensor_alloc: the process
    aborted (SIGABRT) while the kernel check asked which type takes a tensor, so every
    avoid-one child died and both AMX and CPU_REPACK were turned off (found on an Intel Xeon
    with AMX, native build). The buffer must be the type's own alloc size."""
    from specdec.llama_trust.ggml_bufts import Ggml

    sizes: list[int] = []
    g = Ggml.__new__(Ggml)
    g.init = lambda params: 1
    g.free = lambda ctx: None
    g.overhead = lambda: 368
    g.new_2d = lambda ctx, t, ne0, ne1: 10 + ne1
    g.mul_mat = lambda ctx, a, b: 99
    g.alloc_size = lambda buft, tensor: 4096  # AMX's padded layout: more than the bytes
    g.alloc_buffer = lambda buft, size: sizes.append(size) or 7
    g.buffer_base = lambda buffer: 1 << 20
    g.tensor_alloc = lambda buffer, tensor, addr: 0
    g.buffer_free = lambda buffer: None
    g.supports_op = lambda dev, op: True
    g.cpu = 3
    assert g.supports_mul_mat(5, 12, 896, 896) is True
    assert sizes == [4096]


def test_the_notice_names_what_is_off_and_what_is_kept() -> None:
    from specdec.llama_trust.kernel_check import Trial

    v = KernelVerdict(
        ("AMX", "CPU_REPACK"),
        "avoid:AMX",
        (Trial("none", "ok", "", 1.0), Trial("all", "signal", "SIGSEGV", 0.5)),
    )
    assert v.disabled == ("AMX",)
    line = v.notice()
    assert line is not None and "\n" not in line
    assert "AMX" in line and "SIGSEGV" in line and "CPU_REPACK kept" in line
    assert "make install" in line
    assert KernelVerdict(("CPU_REPACK",), "all").notice() is None


# --------------------------------------------------------------------------------------------
# real children on the small test model
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol() -> Path:
    llama_cpp_or_skip()
    return store_model_or_skip()


@pytest.fixture(scope="module")
def smol_q4_0(smol: Path) -> Path:
    """SmolLM2 with every weight in Q4_0: a type ggml repacks on x86 (the Q4_1 file has none)."""
    from specdec.models.requantize import requantize

    return requantize(smol, "q4_0", pure=True, n_threads=threads()).path


def _settings(fault: str | None, floor: float = 60.0) -> CheckSettings:
    return CheckSettings(n_threads=threads(), timeout_floor_s=floor, fault=fault)


@pytest.mark.parametrize("kind", ["segv", "ill", "abort", "wrong"])
def test_a_failing_amx_kernel_is_turned_off_and_repack_kept(smol: Path, kind: str) -> None:
    v = run_check(smol, ("AMX", "CPU_REPACK"), _settings(f"{kind}:AMX"))
    assert v.choice == "avoid:AMX" and v.disabled == ("AMX",)
    failed = {t.choice: t for t in v.trials}["all"]
    want = {"segv": "SIGSEGV", "ill": "SIGILL", "abort": "SIGABRT", "wrong": "TV"}[kind]
    assert want in failed.detail, failed
    assert failed.outcome == ("mismatch" if kind == "wrong" else "signal")


def test_a_hanging_kernel_is_killed_at_its_bound_and_turned_off(smol: Path) -> None:
    v = run_check(smol, ("AMX", "CPU_REPACK"), _settings("hang:AMX", floor=3.0))
    assert v.choice == "avoid:AMX"
    assert {t.choice: t.outcome for t in v.trials}["all"] == "timeout"


def test_when_every_kernel_fails_nothing_optional_is_used(smol: Path) -> None:
    v = run_check(smol, ("CPU_REPACK",), _settings("segv:CPU_REPACK"))
    assert v.choice == "none" and v.disabled == ("CPU_REPACK",)


def test_healthy_kernels_stay_on_within_the_stated_tolerance(smol_q4_0: Path) -> None:
    """The fixture that must keep them: the build's real CPU_REPACK on a model it repacks."""
    v = run_check(smol_q4_0, ("CPU_REPACK",), _settings(None))
    assert v.choice == "all" and v.disabled == () and v.notice() is None
    tv = float({t.choice: t for t in v.trials}["all"].detail.split()[1])
    assert 0.0 <= tv <= TV_TOLERANCE


def test_overrides_move_exactly_the_tensors_of_the_avoided_type(smol_q4_0: Path) -> None:
    """Avoiding CPU_REPACK through per-tensor overrides computes what no extra buffer type
    computes, bit for bit, and differs from the repacked kernels: the overrides took effect."""
    from specdec.models.llamacpp import LlamaCppLM

    def rows(**kw: object) -> torch.Tensor:
        lm = LlamaCppLM(smol_q4_0, n_ctx=64, n_threads=threads(), check_kernels=False, **kw)
        return lm.extend(list(range(300, 312)))

    plain = rows(repack=False)
    repacked = rows()
    moved = _rows_with_choice(smol_q4_0, Choice(avoid=("CPU_REPACK",)))
    assert torch.equal(moved, plain)
    assert not torch.equal(repacked, plain)


def _rows_with_choice(path: Path, choice: Choice) -> torch.Tensor:
    import llama_cpp

    from specdec.llama_trust.llama_params import load_llama

    llm = load_llama(llama_cpp, path, choice, n_ctx=64, n_threads=threads(), logits_all=True)
    llm.eval(list(range(300, 312)))
    return torch.from_numpy(np.array(llm.scores[:12], dtype=np.float32))


def test_the_verdict_is_cached_by_machine_build_weights_and_fault(
    smol: Path, smol_q4_0: Path, tmp_path: Path
) -> None:
    import llama_cpp

    from specdec.hub.gguf import check_gguf_header

    header = check_gguf_header(smol)
    notes: list[str] = []
    first = kernel_verdict(smol, header, _settings("segv:AMX"), log=notes.append, root=tmp_path)
    assert not first.cached and first.choice == "avoid:AMX" and first.seconds > 0
    assert any("checking llama.cpp's optional kernels" in n for n in notes)
    assert any("AMX" in n and "kept" in n for n in notes)  # the one line saying what is off
    again = kernel_verdict(smol, header, _settings("segv:AMX"), log=notes.append, root=tmp_path)
    assert again.cached and again.choice == first.choice and again.key == first.key
    listed = ("AMX", "CPU_REPACK")
    other = check_gguf_header(smol_q4_0)
    keys = {
        verdict_key(llama_cpp, header, listed, "segv:AMX"),
        verdict_key(llama_cpp, other, listed, "segv:AMX"),  # other weight types
        verdict_key(llama_cpp, header, listed, None),  # no fault
        verdict_key(llama_cpp, header, ("CPU_REPACK",), None),  # another build's listing
    }
    assert len(keys) == 4 and first.key in keys
    (tmp_path / f"{first.key}.json").write_text("{not json")  # a damaged entry: checked again
    redone = kernel_verdict(smol, header, _settings("segv:AMX"), root=tmp_path, log=notes.append)
    assert not redone.cached and redone.choice == "avoid:AMX"


def test_every_load_goes_through_the_check(
    smol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec.models.loader import ModelConfig, load_model

    monkeypatch.setenv(FAULT_ENV, "segv:AMX")
    monkeypatch.setenv("SPECDEC_KERNEL_CHECKS", str(tmp_path))
    lm = load_model(ModelConfig(str(smol), n_ctx=128, n_threads=threads(), exact=False))
    assert lm.kernels is not None and lm.kernels.choice == "avoid:AMX"  # type: ignore[attr-defined]
    assert lm.extend([1, 2, 3]).shape == (3, 49152)
    # exact numerics keep the optional kernels that pass both checks: the kernel check first.
    # In a process of its own: ggml reads its kernel switches (the tiled path, the patched
    # build's row-invariant mode) once per process, at the first product, so an exact model
    # loaded where a default one has run is refused by its self-check (models.exact)
    code = (
        "import sys\n"
        "from specdec.models.loader import ModelConfig, load_model\n"
        f"m = load_model(ModelConfig(sys.argv[1], n_ctx=128, n_threads={threads()}, exact=True))\n"
        "print(m.kernels.choice, list(m.exact_kernels.groups))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(smol)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "avoid:AMX []"  # Q4_1: no group repacked


def test_the_command_line_survives_a_crashing_kernel_and_says_so(
    smol: Path, tmp_path: Path
) -> None:
    """What `make demo` / `make test` meet on a machine whose AMX kernels crash: generate
    completes, with one line saying what it turned off."""
    env = {**os.environ, FAULT_ENV: "segv:AMX", "SPECDEC_KERNEL_CHECKS": str(tmp_path)}
    env["SPECDEC_PROFILES"] = str(tmp_path / "profiles")
    cmd = [sys.executable, "-m", "specdec", "generate", "--raw", "def add(a, b):", "-n", "8"]
    cmd += ["-m", str(smol), "--draft", "none", "--threads", str(threads())]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if "kernels failed a test pass" in ln]
    assert len(lines) == 1 and "AMX" in lines[0] and "SIGSEGV" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout.strip()


def test_the_build_line_says_which_kernels_ran() -> None:
    from specdec.llama_trust.kernel_check import build_line

    base = {"llama_cpp_python": "0.3.36", "make_install": None}
    off = {"listed": ["AMX", "CPU_REPACK"], "choice": "avoid:AMX", "disabled": ["AMX"]}
    kept = {"listed": ["CPU_REPACK"], "choice": "all", "disabled": []}
    assert "AMX off" in build_line({**base, "kernels": off})
    assert "all kept" in build_line({**base, "kernels": kept})
    assert "no optional kernels" in build_line({**base, "kernels": None})
    made = {**base, "make_install": {"reason": "native build: this CPU has no AMX"}}
    assert "native build" in build_line({**made, "kernels": kept})
