"""Which ``libggml-cpu`` a process really runs, so that a comparison of builds compares builds.

A benchmark that tries another llama.cpp build points ``LLAMA_CPP_LIB_PATH`` at a directory.
llama-cpp-python opens ``libggml-cpu.so`` there (the unversioned name); a directory made by
copying a freshly built ``libggml-cpu.so.0.25.3`` beside an installed wheel's libraries still
holds the wheel's ``libggml-cpu.so``, and every "variant" then runs the wheel's kernels (this
project measured the same library against itself that way for two stops, 2026-12-04). So the
benchmarks record, per setting, the file the process mapped (``/proc/self/maps``), its SHA-256
and the build's row-invariant version, and refuse a run whose differently named builds are
one file or whose lib directory holds two different files under ``libggml-cpu.so`` and
``libggml-cpu.so.0``.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdec.llama_trust.ggml_bufts import ROW_INVARIANT_SYMBOL

STEM = "ggml-cpu"
_MAPS = Path("/proc/self/maps")


class LibIdentityError(ValueError):
    """A comparison of builds that would not compare what it names."""


@dataclass(frozen=True)
class LibIdentity:
    """One mapped library file: where, what (SHA-256) and which row-invariant version it
    reports (None: the stock build, which has no such function)."""

    path: str
    sha256: str
    row_invariant_version: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LibIdentity:
        return cls(str(data["path"]), str(data["sha256"]), data.get("row_invariant_version"))


def mapped_paths(maps_text: str, stem: str = STEM) -> list[str]:
    """The distinct files named ``lib<stem>.so[.N...]`` in a ``/proc/<pid>/maps`` listing, in
    the order they first appear."""
    prefix = f"lib{stem}.so"
    out: list[str] = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].strip()
        name = Path(path).name
        if (name == prefix or name.startswith(prefix + ".")) and path not in out:
            out.append(path)
    return out


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def row_invariant_version(path: str | Path) -> int | None:
    """What the exact build's ``ggml_cpu_repack_row_invariant_supported`` returns in that file;
    None where the file has no such function (the stock build)."""
    lib = ctypes.CDLL(str(path))
    fn = getattr(lib, ROW_INVARIANT_SYMBOL, None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return int(fn())


def loaded(stem: str = STEM, maps: Path = _MAPS) -> LibIdentity | None:
    """The ``lib<stem>`` this process has mapped; None where none is (or the platform has no
    ``/proc/self/maps``). Two different files mapped at once is an error: the process would
    run whichever symbol lookup finds first."""
    try:
        text = maps.read_text()
    except OSError:
        return None
    paths = mapped_paths(text, stem)
    if not paths:
        return None
    digests = {p: file_sha256(p) for p in paths}
    if len(set(digests.values())) > 1:
        raise LibIdentityError(f"two different lib{stem} files are mapped: {', '.join(paths)}")
    first = paths[0]
    return LibIdentity(first, digests[first], row_invariant_version(first))


def lib_dir_problem(libdir: str | Path, stem: str = STEM) -> str | None:
    """Why a ``LLAMA_CPP_LIB_PATH`` directory would not run the build it seems to hold: the
    unversioned ``lib<stem>.so`` (the one llama-cpp-python opens) missing, or a different file
    from ``lib<stem>.so.0`` (a new build copied in under one name only). None if fine."""
    base = Path(libdir)
    plain, soname = base / f"lib{stem}.so", base / f"lib{stem}.so.0"
    if not plain.is_file():
        return f"{base}: no lib{stem}.so (llama-cpp-python opens that name)"
    if soname.is_file() and file_sha256(plain) != file_sha256(soname):
        return (
            f"{base}: lib{stem}.so and lib{stem}.so.0 are different files "
            "(llama-cpp-python opens the first; copy the new build over both)"
        )
    return None


def same_build_problems(
    identities: Mapping[str, LibIdentity], lib_dirs: Mapping[str, str | None]
) -> list[str]:
    """Settings that name different lib directories (None: the installed build) but mapped
    one and the same file content: the comparison between them would measure nothing."""
    problems: list[str] = []
    names = sorted(identities)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if lib_dirs.get(a) == lib_dirs.get(b):
                continue
            if identities[a].sha256 == identities[b].sha256:
                problems.append(
                    f"settings {a} ({lib_dirs.get(a) or 'installed build'}) and {b} "
                    f"({lib_dirs.get(b) or 'installed build'}) ran the same libggml-cpu "
                    f"(sha256 {identities[a].sha256[:12]}...)"
                )
    return problems


def recorded_problems(
    records: Mapping[str, tuple[Mapping[str, Any] | None, str | None]],
) -> list[str]:
    """``same_build_problems`` over what workers reported: setting -> (its ``to_json`` record or
    None where nothing was mapped, its lib directory or None for the installed build)."""
    ids = {name: LibIdentity.from_json(rec) for name, (rec, _) in records.items() if rec}
    dirs = {name: libdir for name, (_, libdir) in records.items()}
    return same_build_problems(ids, dirs)
