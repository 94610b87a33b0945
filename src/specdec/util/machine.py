"""What a results file says about where and how it was measured."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("specdec", "torch", "transformers", "llama_cpp_python", "numpy", "accelerate")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def all_cpu_flags() -> tuple[str, ...]:
    """The CPU's feature flags as /proc/cpuinfo lists them (sorted; empty where it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("flags", "features")):
                return tuple(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return ()


# the CPU flags that decide llama.cpp's kernels on x86 (and so the verify curve), as
# /proc/cpuinfo spells them
SIMD_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The ``SIMD_FLAGS`` this CPU has (the first processor's flags), in that order."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return []
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in SIMD_FLAGS if f in have]
    return []


def machine_line(cpuinfo: str | None = None) -> str:
    """One line naming the machine a figure was measured on: CPU model, cores, SIMD flags."""
    flags = cpu_flags(cpuinfo)
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, "
        f"{' '.join(flags).upper() if flags else 'no AVX2/AVX-512/AMX flags'}"
    )


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(where: Path | None = None) -> dict[str, Any]:
    """The commit of the source tree this package runs from (and whether it is dirty)."""
    cwd = where if where is not None else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return {"commit": None, "dirty": None}
        st = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"commit": rev.stdout.strip(), "dirty": bool(st.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def machine_info() -> dict[str, Any]:
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": _mem_total_gib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # torch missing or a broken driver only loses these two fields
        info["torch_threads"] = None
        info["cuda"] = None
    return info
