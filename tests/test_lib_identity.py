"""The guard that a comparison of llama.cpp builds ran the builds it names.

The fixture that must fail is the lib directory this project measured with for two stops: a
wheel's libraries with a new ``libggml-cpu.so.0`` copied in and the wheel's own unversioned
``libggml-cpu.so`` left beside it (llama-cpp-python opens the latter)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specdec.llama_trust.lib_identity import (
    LibIdentity,
    LibIdentityError,
    lib_dir_problem,
    loaded,
    mapped_paths,
    recorded_problems,
    same_build_problems,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 123 /opt/x/lib/libggml-cpu.so
7f0000001000-7f0000002000 r-xp 00001000 08:01 123 /opt/x/lib/libggml-cpu.so
7f0000003000-7f0000004000 r--p 00000000 08:01 124 /opt/x/lib/libggml-cpu-extra.so
7f0000005000-7f0000006000 r--p 00000000 08:01 125 /opt/x/lib/libggml-base.so
7f0000007000-7f0000008000 rw-p 00000000 00:00 0
7f0000009000-7f000000a000 r--p 00000000 08:01 126 /opt/y/lib/libggml-cpu.so.0.25.3
"""


def test_mapped_paths_finds_each_file_once_and_no_lookalikes() -> None:
    assert mapped_paths(MAPS) == ["/opt/x/lib/libggml-cpu.so", "/opt/y/lib/libggml-cpu.so.0.25.3"]
    assert mapped_paths(MAPS, stem="ggml-base") == ["/opt/x/lib/libggml-base.so"]
    assert mapped_paths("", stem="ggml-cpu") == []


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_lib_dir_with_a_new_soname_beside_the_old_unversioned_file_is_refused(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "libggml-cpu.so", b"the wheel's build")
    _write(tmp_path / "libggml-cpu.so.0", b"the new build")
    problem = lib_dir_problem(tmp_path)
    assert problem is not None and "different files" in problem


def test_lib_dir_with_both_names_one_build_passes(tmp_path: Path) -> None:
    _write(tmp_path / "libggml-cpu.so", b"the new build")
    _write(tmp_path / "libggml-cpu.so.0", b"the new build")
    assert lib_dir_problem(tmp_path) is None
    (tmp_path / "libggml-cpu.so.0").unlink()
    assert lib_dir_problem(tmp_path) is None  # the unversioned name alone is what is opened


def test_lib_dir_without_the_unversioned_name_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "libggml-cpu.so.0", b"the new build")
    problem = lib_dir_problem(tmp_path)
    assert problem is not None and "no libggml-cpu.so" in problem


def _ident(sha: str, version: int | None = None) -> LibIdentity:
    return LibIdentity(f"/lib/{sha}/libggml-cpu.so", sha, version)


def test_two_builds_that_are_one_file_are_reported() -> None:
    ids = {"exact@v2": _ident("a" * 64, 2), "exact@v3": _ident("a" * 64, 2)}
    problems = same_build_problems(ids, {"exact@v2": "/libs/v2", "exact@v3": "/libs/v3"})
    assert len(problems) == 1 and "same libggml-cpu" in problems[0]


def test_two_builds_that_differ_and_settings_on_one_build_pass() -> None:
    ids = {"a": _ident("a" * 64), "b": _ident("b" * 64), "c": _ident("a" * 64)}
    # a and c share the installed build (no lib dir): switches on one build, not two builds
    assert same_build_problems(ids, {"a": None, "b": "/libs/v3", "c": None}) == []


def test_recorded_problems_reads_worker_records() -> None:
    rec = _ident("c" * 64, 3).to_json()
    assert LibIdentity.from_json(rec) == _ident("c" * 64, 3)
    assert recorded_problems({"default": (rec, None), "exact@v3": (rec, "/libs/v3")})
    assert not recorded_problems({"default": (None, None), "exact@v3": (rec, "/libs/v3")})


def test_verify_curve_stops_a_run_that_compares_a_build_with_itself() -> None:
    import verify_curve

    rec = _ident("d" * 64, 2).to_json()
    same = {"exact": [{"lib": rec, "lib_dir": None}], "exact@v3": [{"lib": rec, "lib_dir": "/x"}]}
    with pytest.raises(SystemExit, match="same libggml-cpu"):
        verify_curve.check_builds_differ(same)
    other = _ident("e" * 64, 3).to_json()
    verify_curve.check_builds_differ(
        {"exact": [{"lib": rec, "lib_dir": None}], "exact@v3": [{"lib": other, "lib_dir": "/x"}]}
    )


def _libm() -> Path:
    """A real shared library this process has mapped (the C math library)."""
    for path in mapped_paths(Path("/proc/self/maps").read_text(), stem="m"):
        return Path(path)
    pytest.skip("no /proc/self/maps listing libm on this platform")


def test_loaded_reads_a_real_mapping_and_a_library_without_the_version_function(
    tmp_path: Path,
) -> None:
    libm = _libm()
    maps = _write(tmp_path / "maps", f"0-1 r--p 0 08:01 1 {libm}\n".encode())
    ident = loaded(stem="m", maps=maps)
    assert ident is not None and ident.path == str(libm)
    assert ident.row_invariant_version is None  # not the exact build
    assert len(ident.sha256) == 64
    assert loaded(stem="ggml-none", maps=maps) is None


def test_loaded_refuses_two_different_files_mapped_at_once(tmp_path: Path) -> None:
    libm = _libm()
    other = _write(tmp_path / "libm.so.9", b"another file")
    maps = _write(tmp_path / "maps", f"0-1 r--p 0 0 1 {libm}\n2-3 r--p 0 0 2 {other}\n".encode())
    with pytest.raises(LibIdentityError, match="two different"):
        loaded(stem="m", maps=maps)
