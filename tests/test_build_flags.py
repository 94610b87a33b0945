"""How `make install` builds llama-cpp-python (src/specdec/llama_trust/build_flags.py): the
native build everywhere but the combination known to be broken (AMX kernels compiled by GCC <
13), whose flags name the CPU's instruction sets and leave AMX out, and a key that changes with
them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdec.llama_trust.build_flags import (
    AMX_OPTIONS,
    BuildPlan,
    plan_build,
    read_cpu_flags,
)

SAPPHIRE_RAPIDS = frozenset(
    [
        "fpu",
        "sse",
        "sse2",
        "ssse3",
        "sse4_1",
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi1",
        "bmi2",
        "avx_vnni",
        "avx512f",
        "avx512cd",
        "avx512vl",
        "avx512dq",
        "avx512bw",
        "avx512vbmi",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
    ]
)
EPYC = frozenset(SAPPHIRE_RAPIDS - {"amx_tile", "amx_int8", "amx_bf16"})


def test_amx_with_gcc_12_names_the_instruction_sets_and_leaves_amx_out() -> None:
    plan = plan_build(SAPPHIRE_RAPIDS, "gcc (Debian 12.2.0-14) 12.2.0", 12)
    args = set(plan.cmake_args)
    assert "-DGGML_NATIVE=OFF" in args
    for opt in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI"):
        assert f"-D{opt}=ON" in args
    for opt in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert f"-D{opt}=ON" in args
    assert all(f"-D{opt}=OFF" in args for opt in AMX_OPTIONS)
    assert "GCC 12" in plan.reason and "AMX" in plan.reason


def test_the_same_cpu_with_gcc_13_or_clang_and_a_cpu_without_amx_build_natively() -> None:
    """The fixtures that must keep the native build."""
    for compiler, major in (("gcc 13.2.0", 13), ("clang version 17", None)):
        assert plan_build(SAPPHIRE_RAPIDS, compiler, major).cmake_args == ()
    assert plan_build(EPYC, "gcc 12.2.0", 12).cmake_args == ()


def test_an_instruction_set_the_cpu_lacks_is_off() -> None:
    no_avx512 = frozenset(f for f in SAPPHIRE_RAPIDS if not f.startswith("avx512"))
    args = plan_build(no_avx512, "gcc 11.4.0", 11).cmake_args
    assert "-DGGML_AVX512=OFF" in args and "-DGGML_AVX2=ON" in args
    partial = frozenset(SAPPHIRE_RAPIDS - {"avx512dq"})  # GGML_AVX512 needs all five
    assert "-DGGML_AVX512=OFF" in plan_build(partial, "gcc 12", 12).cmake_args


def test_the_key_changes_with_the_flags_the_compiler_and_the_version() -> None:
    a = plan_build(SAPPHIRE_RAPIDS, "gcc 12.2.0", 12)
    keys = {
        a.key(),
        plan_build(EPYC, "gcc 12.2.0", 12).key(),
        BuildPlan(a.cmake_args, a.reason, "gcc 12.3.0", True).key(),
        a.key("llama-cpp-python==0.3.37"),
    }
    assert len(keys) == 4


def test_cpuinfo_flags_are_read_from_the_flags_line() -> None:
    text = "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_tile\n\nprocessor\t: 1\n"
    assert read_cpu_flags(text) == frozenset({"fpu", "avx2", "amx_tile"})
    assert read_cpu_flags("") == frozenset()


def test_the_script_runs_without_the_package_installed() -> None:
    """`make install` runs it with the system Python before the virtual environment exists."""
    script = Path(__file__).parents[1] / "src" / "specdec" / "llama_trust" / "build_flags.py"
    done = subprocess.run(
        [sys.executable, "-S", "-I", str(script), "--explain"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "llama-cpp-python build:" in done.stdout and "CMAKE_ARGS=" in done.stdout
    key = subprocess.run(
        [sys.executable, "-S", "-I", str(script), "--key"], capture_output=True, text=True
    )
    assert key.returncode == 0 and len(key.stdout.strip()) == 16


def test_a_failing_build_step_is_one_line_and_a_nonzero_exit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """pip or patch failing (their own output above) ends in one line naming the command,
    not a traceback; so does a folder the build cannot write."""
    import specdec.llama_trust.build_flags as bf

    def fail(cmd: list[str], env: dict[str, str]) -> None:
        raise subprocess.CalledProcessError(2, cmd)

    monkeypatch.setattr(bf, "_run", fail)
    monkeypatch.setattr(bf, "installed_record", lambda prefix=None: None)
    assert bf.main(["--install", sys.executable, "--wheels", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("build_flags: `") and "failed (exit 2)" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err

    def unwritable(*a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "wheels"))

    monkeypatch.setattr(bf, "install", unwritable)
    monkeypatch.setattr(bf, "install_exact", unwritable)
    for stock in ([], ["--stock"]):
        assert bf.main(["--install", sys.executable, "--wheels", str(tmp_path), *stock]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("build_flags: ") and "Permission denied" in err
        assert len(err.splitlines()) == 1


# --------------------------------------------------------------------------------------------
# the build plan as a user's machine gives it (issue 62, item 7)
# --------------------------------------------------------------------------------------------


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_compiler_command_line_is_run_as_one(tmp_path: Path) -> None:
    """``CC="ccache gcc"``: the wrapper and the compiler, not a program named with a space."""
    from specdec.llama_trust.build_flags import compiler_version

    gcc = _script(tmp_path / "gcc", 'echo "gcc (Debian 12.2.0-14) 12.2.0"\n')
    wrapper = _script(tmp_path / "ccache", 'exec "$@"\n')
    banner, major = compiler_version(f"{wrapper} {gcc}")
    assert major == 12 and banner.startswith("gcc (Debian")


def test_a_banner_that_is_not_utf8_is_read_not_a_traceback(tmp_path: Path) -> None:
    from specdec.llama_trust.build_flags import compiler_version

    gcc = _script(tmp_path / "gcc", "printf 'gcc (\\377\\376 build) 11.4.0\\n'\n")
    banner, major = compiler_version(str(gcc))
    assert major == 11 and "\ufffd" in banner


def test_a_compiler_that_cannot_be_run_counts_as_unsafe_for_amx(tmp_path: Path) -> None:
    """On AMX the crashing combination cannot be ruled out: AMX left out, as for GCC < 13."""
    from specdec.llama_trust.build_flags import NOT_RUNNABLE, compiler_version

    banner, major = compiler_version(str(tmp_path / "no-such-cc"))
    assert banner.endswith(NOT_RUNNABLE) and major is None
    failing = _script(tmp_path / "cc", "exit 3\n")
    assert compiler_version(str(failing))[0].endswith(NOT_RUNNABLE)
    plan = plan_build(SAPPHIRE_RAPIDS, banner, major)
    assert all(f"-D{opt}=OFF" in plan.cmake_args for opt in AMX_OPTIONS)
    assert "could not be asked" in plan.reason
    # the fixture: clang (no GCC version) that runs keeps the native build
    assert plan_build(SAPPHIRE_RAPIDS, "clang version 17", None).cmake_args == ()
    assert plan_build(EPYC, banner, major).cmake_args == ()  # no AMX: nothing to fear


def test_the_users_cmake_args_are_kept_last_and_keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    import specdec.llama_trust.build_flags as bf

    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES='80;90'")
    plan = bf.this_machine()
    assert plan.user_args == ("-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=80;90")
    assert plan.all_args.endswith("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=80;90")
    assert "yours last" in bf.explain(plan)
    monkeypatch.setenv("CMAKE_ARGS", "")
    plain = bf.this_machine()
    assert plain.user_args == () and plain.key() != plan.key()
    assert bf.exact_key(plain, b"p") != bf.exact_key(plan, b"p")


def test_only_a_wheel_this_script_built_is_installed(tmp_path: Path) -> None:
    import hashlib
    import json

    import specdec.llama_trust.build_flags as bf

    name = "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    planted = tmp_path / name
    planted.write_bytes(b"planted")
    assert bf.built_wheel(tmp_path) is None and not planted.exists()  # no record: removed
    good = tmp_path / name
    good.write_bytes(b"built here")
    digest = hashlib.sha256(b"built here").hexdigest()
    (tmp_path / bf.WHEEL_RECORD).write_text(json.dumps({"wheel": name, "sha256": digest}))
    assert bf.built_wheel(tmp_path) == good
    good.write_bytes(b"swapped after the build")  # same name, other bytes
    assert bf.built_wheel(tmp_path) is None and not good.exists()


def test_install_builds_the_patched_library_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import specdec.llama_trust.build_flags as bf

    called: list[str] = []
    monkeypatch.setattr(bf, "install", lambda *a, **k: called.append("stock"))
    monkeypatch.setattr(bf, "install_exact", lambda *a, **k: called.append("patched"))
    assert bf.main(["--install", sys.executable, "--wheels", str(tmp_path)]) == 0
    assert bf.main(["--install", sys.executable, "--stock", "--wheels", str(tmp_path)]) == 0
    assert called == ["patched", "stock"]
