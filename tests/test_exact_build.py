"""The exact build: llama-cpp-python with ``patches/ggml-cpu-repack-row-invariant.patch`` (``make
install``, the default; ``make test-exact`` runs this file on it).

The patch gives ggml's repacked CPU kernels and its tiled K-quant path a row-invariant mode
(``GGML_CPU_REPACK_ROW_INVARIANT=1``): a row of an n-row product gets the bits a one-row
product gives it (Q4_K keeps its repacked gemm for groups of 4 rows, summing each super-block
as the stock one-row gemv does, which the other rows run; Q6_K keeps the tiled path, its
smaller products summing in the tiled order), so exact numerics can keep those kernels; from
version 4 a one-column float product sums in llamafile_sgemm's order, so llama.cpp's default
attention (no flash attention, F16 cache) is row-invariant too, with its own fixture (the mode
off: rows differ from 2 rows). Its bitwise test: on the small test model requantized to Q4_K_M
(Q4_K, which ggml repacks on x86, and Q6_K weights), with every optional kernel kept and exact
numerics' other settings, each row of an n-token pass (n = 1..32, contexts 20 and 1,100, 1-3
threads) equals the one-token row bit for bit with the mode on; with it off (the stock kernels,
the fixture that must fail) rows differ. Each setting runs in a process of its own (ggml reads
the switch once per process). The tests on the build skip, saying how to make it, on a stock
build; the tests of how it is made run everywhere.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

import specdec.llama_trust.build_flags as bf
from tiny_models import llama_cpp_or_skip, store_model_or_skip

Q4_K = "CPU_REPACK/Q4_K"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))  # exact_rows: the per-kernel row check


# --------------------------------------------------------------------------------------------
# what the product does with either build, the other one injected (no build needed)
# --------------------------------------------------------------------------------------------


class _FakeGgml:
    def __init__(self, exact_build: bool, version: int = 2) -> None:
        self.exact_build = exact_build
        self.version = version if exact_build else 0

    def row_invariant_repack(self) -> bool:
        return self.exact_build

    def row_invariant_version(self) -> int:
        return self.version


@pytest.mark.parametrize(
    ("exact_build", "preset", "on", "after"),
    [
        (False, None, False, None),  # stock build: nothing to switch, the env left alone
        (True, None, True, "1"),  # exact build: switched on for the process
        (True, "0", False, "0"),  # the user turned it off: respected (the probe then decides)
    ],
)
def test_exact_numerics_switch_the_row_invariant_mode_only_on_the_exact_build(
    monkeypatch: pytest.MonkeyPatch,
    exact_build: bool,
    preset: str | None,
    on: bool,
    after: str | None,
) -> None:
    import os

    import specdec.llama_trust.ggml_bufts as bufts
    from specdec.llama_trust.exact_kernels import ROW_INVARIANT_ENV, use_row_invariant_kernels

    monkeypatch.delenv(ROW_INVARIANT_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(ROW_INVARIANT_ENV, preset)
    monkeypatch.setattr(bufts, "ggml", lambda _llama_cpp: _FakeGgml(exact_build))
    assert use_row_invariant_kernels(object()) is on
    assert os.environ.get(ROW_INVARIANT_ENV) == after


@pytest.mark.parametrize(
    ("version", "preset", "kept"),
    [
        (0, None, False),  # stock build: exact numerics turn the tiled path off
        (1, None, False),  # the first patch: only the repacked kernels had the mode
        (2, None, True),  # the mode also makes the tiled path and the small products agree
        (2, "0", False),  # the user turned the mode off: the tiled path goes off again
        (3, None, True),  # version 3: the gemm in the gemv's order; the tiled path as in 2
    ],
)
def test_exact_numerics_keep_the_tiled_path_only_where_the_build_makes_it_row_invariant(
    monkeypatch: pytest.MonkeyPatch, version: int, preset: str | None, kept: bool
) -> None:
    import os

    import specdec.llama_trust.ggml_bufts as bufts
    from specdec.llama_trust.exact_kernels import (
        FLASH_Q8_0_KEYS,
        ROW_INVARIANT_ENV,
        row_invariant_keeps_tiled,
    )
    from specdec.models.llamacpp import TILED_ENV, _exact_settings

    monkeypatch.delenv(ROW_INVARIANT_ENV, raising=False)
    monkeypatch.delenv(TILED_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(ROW_INVARIANT_ENV, preset)
    monkeypatch.setattr(bufts, "ggml", lambda _llama_cpp: _FakeGgml(version > 0, version))
    assert row_invariant_keeps_tiled(object()) is kept
    flash = FLASH_Q8_0_KEYS
    assert _exact_settings(None, "f16", "f16", flash, kept) == (True, True, "q8_0", "f16")
    assert os.environ.get(TILED_ENV) == (None if kept else "0")
    if kept:  # the tiled switch set either way is fine: both orders agree on this build
        monkeypatch.setenv(TILED_ENV, "1")
        assert _exact_settings(None, "f16", "f16", flash, True)[0] is True


@pytest.mark.parametrize(
    ("version", "preset", "attention"),
    [
        (0, None, "flash"),  # stock build: flash attention with Q8_0 keys
        (3, None, "flash"),  # version 3: its float products still take two orders
        (4, None, "default"),  # version 4: llama.cpp's default attention is row-invariant
        (4, "1", "default"),
        (4, "0", "flash"),  # the mode turned off by the user: back to flash attention
        (5, None, "default"),  # version 5 keeps it
        (6, None, "default"),
    ],
)
def test_exact_numerics_run_the_default_attention_only_where_the_build_makes_it_row_invariant(
    monkeypatch: pytest.MonkeyPatch, version: int, preset: str | None, attention: str
) -> None:
    import specdec.llama_trust.ggml_bufts as bufts
    from specdec.llama_trust.exact_kernels import (
        DEFAULT_ATTENTION,
        FLASH_Q8_0_KEYS,
        ROW_INVARIANT_ENV,
        exact_attention,
    )

    monkeypatch.delenv(ROW_INVARIANT_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(ROW_INVARIANT_ENV, preset)
    monkeypatch.setattr(bufts, "ggml", lambda _llama_cpp: _FakeGgml(version > 0, version))
    want = DEFAULT_ATTENTION if attention == "default" else FLASH_Q8_0_KEYS
    assert exact_attention(object(), machine="x86_64") == want
    # ARM: the patch's one-column product is x86 only, so flash attention whatever the build
    assert exact_attention(object(), machine="aarch64") == FLASH_Q8_0_KEYS
    assert exact_attention(object(), machine="arm64") == FLASH_Q8_0_KEYS


def test_the_build_version_is_read_from_the_exported_symbol() -> None:
    from specdec.llama_trust.ggml_bufts import ROW_INVARIANT_SYMBOL, Ggml

    class Lib:
        pass

    def version_two() -> int:
        return 2

    exact = Lib()
    setattr(exact, ROW_INVARIANT_SYMBOL, version_two)
    g = object.__new__(Ggml)
    g._libs = [Lib(), exact]
    assert g.row_invariant_version() == 2 and g.row_invariant_repack()
    g._libs = [Lib()]
    assert g.row_invariant_version() == 0 and not g.row_invariant_repack()


def test_doctor_and_the_profile_name_the_build() -> None:
    from specdec.doctor import exact_build_text
    from specdec.llama_trust.kernel_check import build_line

    assert exact_build_text(True).startswith("exact build")
    assert "version" not in exact_build_text(True)  # a report from before it was recorded
    v1, v2 = exact_build_text(True, 1), exact_build_text(True, 2)
    assert "patch version 1" in v1 and "the tiled path off" in v1
    assert "patch version 2" in v2 and "and the tiled path" in v2
    assert "patch version 3" in exact_build_text(True, 3)
    assert "default attention" not in exact_build_text(True, 3)
    v4 = exact_build_text(True, 4)
    assert "patch version 4" in v4 and "the tiled path and llama.cpp's default attention" in v4
    assert exact_build_text(False).startswith("stock build") and "make install" in (
        exact_build_text(False)
    )
    assert "unknown" in exact_build_text("unreadable")
    base = {"llama_cpp_python": "0.3.36", "make_install": None, "kernels": None}
    assert "(exact build; " in build_line({**base, "exact_build": True})
    assert "(stock build; " in build_line({**base, "exact_build": False})
    assert "build; " not in build_line(base)  # a results file from before it was recorded


# --------------------------------------------------------------------------------------------
# how the build is made (no build, no network)
# --------------------------------------------------------------------------------------------


def test_the_patch_touches_ggml_cpu_matrix_kernels_only() -> None:
    text = bf.PATCH.read_text()
    files = [line.split()[-1] for line in text.splitlines() if line.startswith("+++ ")]
    assert files and all(f.startswith("b/ggml/src/ggml-cpu/") for f in files), files
    assert {"b/ggml/src/ggml-cpu/repack.cpp", "b/ggml/src/ggml-cpu/tiled/tiled.cpp"} <= set(files)
    added = [x for x in text.splitlines() if x.startswith("+") and not x.startswith("+++")]
    # v6: the mode's Q4_K gemm and mul_mat chunk function are copies beside the stock ones
    assert 0 < len(added) <= 2300
    assert "TILED_ROW_INVARIANT_Q6_K_FUSED" in text  # v5: the Q6_K vec_dot's FMA said explicitly
    assert "GGML_CPU_REPACK_ROW_INVARIANT" in text
    assert "ggml_cpu_repack_row_invariant_supported" in text  # what the product looks for
    assert "return 6;" in text  # version 6 (>= 2 keeps the tiled path, >= 4 the attention)
    # v6: the default path is the stock code: no line of the x86 kernels is removed or
    # changed, and of ggml-cpu.c's matrix product only the call of its chunk function (now
    # a dispatch to it or to the mode's copy); the mode's versions are added beside them
    removed: dict[str, int] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("+++ "):
            current = line.split()[-1]
        elif line.startswith("-") and not line.startswith("---"):
            removed[current] = removed.get(current, 0) + 1
    assert "b/ggml/src/ggml-cpu/arch/x86/repack.cpp" not in removed, removed
    assert removed.get("b/ggml/src/ggml-cpu/ggml-cpu.c", 0) <= 1, removed
    assert sum(removed.values()) <= 6, removed  # the dispatches in repack.cpp and tiled.cpp
    assert "ggml_gemm_q4_K_8x8_q8_K_per_block" in text  # the gemm in the one-row gemv's order
    assert "llamafile_sgemm_one_column" in text  # a lone column in llamafile_sgemm's order


def test_the_exact_build_has_a_key_of_its_own_that_covers_the_patch() -> None:
    plan = bf.BuildPlan((), "native", "gcc 12", False)
    key = bf.exact_key(plan, b"patch one")
    assert key != plan.key()
    assert key != bf.exact_key(plan, b"patch two")
    other = bf.BuildPlan(("-DGGML_NATIVE=OFF",), "named", "gcc 12", True)
    assert key != bf.exact_key(other, b"patch one")


def test_a_source_archive_with_another_sha256_is_refused_and_removed(tmp_path: Path) -> None:
    archive = tmp_path / bf.SDIST
    archive.write_bytes(b"not the archive on PyPI")
    with pytest.raises(SystemExit, match="is not the pinned"):
        bf.fetch_sdist("python-never-run", tmp_path)  # the file is there: nothing is fetched
    assert not archive.exists()


def test_the_patch_applies_to_the_vendored_files_it_was_made_from(tmp_path: Path) -> None:
    """Applied to a tree holding the archive's copies of the files it names (where the archive
    is cached: the first make install downloads it), the patch goes in cleanly and changes
    only those; a second application is refused (--forward)."""
    archive = ROOT / ".whl" / "sdist" / bf.SDIST
    if not archive.is_file() or hashlib.sha256(archive.read_bytes()).hexdigest() != bf.SDIST_SHA256:
        pytest.skip(f"the source archive is not cached in {archive.parent} (make install)")
    files = [
        line.split()[-1].removeprefix("b/")
        for line in bf.PATCH.read_text().splitlines()
        if line.startswith("+++ ")
    ]
    tree = tmp_path / "llama_cpp_python-0.3.36"
    originals = {}
    with tarfile.open(archive) as tar:
        for f in files:
            member = tar.extractfile(f"llama_cpp_python-0.3.36/vendor/llama.cpp/{f}")
            assert member is not None, f
            originals[f] = member.read()
            target = tree / "vendor/llama.cpp" / f
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(originals[f])
    bf.apply_patch(tree, bf.PATCH)
    for f in files:
        assert (tree / "vendor/llama.cpp" / f).read_bytes() != originals[f], f
    repack = tree / "vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp"
    assert "ggml_repack_row_invariant()" in repack.read_text()
    with pytest.raises(subprocess.CalledProcessError):
        bf.apply_patch(tree, bf.PATCH)


# --------------------------------------------------------------------------------------------
# the build itself: the patch's bitwise test
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_q4_k() -> Path:
    llama_cpp_or_skip()
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml

    g = ggml(llama_cpp)
    if not g.row_invariant_repack():
        pytest.skip("llama-cpp-python is the stock build here (`make install` builds it)")
    if "CPU_REPACK" not in g.extra_types():
        pytest.skip("this llama.cpp build has no CPU_REPACK buffer type")
    from specdec.models.requantize import requantize

    return requantize(store_model_or_skip(), "q4_k_m").path


def _rows(path: Path, setting: str, threads: list[int], contexts: list[int]) -> Any:
    from exact_rows import run_setting

    return run_setting(str(path), setting, threads, contexts, list(range(1, 33)))


def _differing(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    from exact_rows import differing_passes

    return differing_passes(result)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_the_q4_k_weights_take_the_repacked_kernels(smol_q4_k: Path) -> None:
    """What the bitwise test is about is in play: without it the test below proves nothing."""
    import llama_cpp

    from specdec.hub.gguf import check_gguf_header
    from specdec.llama_trust.ggml_bufts import Choice, ggml, weight_groups

    tensors = check_gguf_header(smol_q4_k).tensors
    q4_k = [t for t in tensors if t.ggml_type == 12]  # GGML_TYPE_Q4_K
    # the feed-forward down projections that Q4_K_M leaves at Q4_K (16 of 30; the others
    # are Q6_K, and rows of 576 are no multiple of 256, so no other tensor is a K-quant)
    assert len(q4_k) >= 8
    assert weight_groups(ggml(llama_cpp), tensors, Choice()).get(Q4_K, 0) == len(q4_k)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_row_invariant_mode_every_row_of_every_pass_is_bit_identical(smol_q4_k: Path) -> None:
    result = _rows(smol_q4_k, "repack_row_invariant", [2], [20, 1100])
    result.update(_rows(smol_q4_k, "repack_row_invariant", [1, 3], [20]))
    assert sorted(result) == ["1", "2", "3"]
    assert _differing(result) == []


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_the_stock_repacked_gemm_is_not_row_invariant(smol_q4_k: Path) -> None:
    """The fixture that must fail, on the same build with the mode off: the repacked gemm
    takes rows in fours, and its rows differ from the one-row gemv's."""
    result = _rows(smol_q4_k, "repack_stock", [2], [20])
    differing = _differing(result)
    assert differing, "the stock repacked gemm gave one-row results: nothing for the patch to do"
    assert all(int(n) >= 4 for _, _, n in differing)  # gemm starts at 4 rows


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_row_invariant_mode_keeps_the_default_attention_bit_identical(smol_q4_k: Path) -> None:
    """Version 4: with no flash attention and the F16 cache, a one-token pass's attention
    products sum in llamafile_sgemm's order, as every wider pass's do."""
    result = _rows(smol_q4_k, "ri_noflash", [2], [20, 1100])
    result.update(_rows(smol_q4_k, "ri_noflash", [1, 3], [20]))
    assert sorted(result) == ["1", "2", "3"]
    assert _differing(result) == []


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_the_default_attention_is_not_row_invariant_with_the_mode_off(smol_q4_k: Path) -> None:
    """The fixture that must fail: with the mode off the F16 products of a 2- or 3-token pass
    go through llamafile_sgemm and a one-token pass's through vec_dot, so rows differ before
    the repacked gemm (4 rows) or the tiled path (8) come in. On this model they do past a
    long context (1,100 tokens: row 1 of 2- and 3-token passes), not at 20 tokens, where its
    2- and 3-token rows are identical with the mode off too (measured in a clean environment;
    an earlier version of this test asked at 20 tokens and passed only because a tiled-path
    switch left in the test process by an exact load reached the child)."""
    differing = _differing(_rows(smol_q4_k, "ri_noflash_off", [2], [1100]))
    assert any(int(n) < 4 for _, _, n in differing), differing


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_exact_mode_keeps_the_repacked_kernels_on_the_exact_build(
    smol_q4_k: Path, tmp_path: Path
) -> None:
    """exact=True on the exact build: the mode is switched on, the probe finds every group
    row-invariant (nothing moved off), the self-check passes, and speculative greedy output
    is plain decoding's token for token (in a fresh process: ggml reads both switches once)."""
    import os
    import sys

    code = f"""
import json
from specdec.core.loop import generate
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.llamacpp import LlamaCppLM
from specdec.prompting import encode_prompt
lm = LlamaCppLM({str(smol_q4_k)!r}, n_ctx=1024, n_threads=2, exact=True, log=lambda s: None)
out = {{"row_invariant": lm.row_invariant, "avoid": list(lm.exact_kernels.avoid),
        "groups": list(lm.exact_kernels.groups), "same": []}}
for text in ("def fibonacci(n):\\n    ", "List the planets of the solar system, one per line."):
    ids = encode_prompt(lm, text, chat=False)
    plain = generate(lm, None, ids, max_new_tokens=40, k=0).tokens
    spec = generate(lm, SuffixDrafter(), ids, max_new_tokens=40, k=16).tokens
    out["same"].append([len(plain), plain == spec])
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_")}
    env["SPECDEC_EXACT_CHECKS"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["row_invariant"] is True
    assert Q4_K in out["groups"] and out["avoid"] == []
    assert all(n > 8 and same for n, same in out["same"]), out["same"]
