"""What `specdec doctor` prints: one screen a user pastes into a bug report.

Everything is read, nothing is measured (a kernel check runs only when asked, ``--check``):
the machine (CPU model and the instruction-set flags that pick llama.cpp's kernels, OS,
Python), package versions, llama.cpp's system info and optional kernels, how `make install`
built it and where its libraries were loaded from (``LLAMA_CPP_LIB_PATH`` tries another build
without installing it), the kernel checks' verdicts, exact numerics' verdicts (which optional
kernels keep rows bit-identical whatever the pass size), the GPUs torch sees, the model
store, and the profile cache (with exact numerics' price where a profile measured it).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from specdec.util.jsonable import json_ready
from specdec.util.printable import printable

# the flags that decide which llama.cpp / torch kernels a CPU can run
SIMD_PREFIXES = ("sse", "ssse", "avx", "amx", "fma", "f16c", "bmi", "neon", "asimd", "sve")


def _simd(flags: tuple[str, ...]) -> list[str]:
    return [f for f in flags if f.startswith(SIMD_PREFIXES)]


def _llama() -> dict[str, Any]:
    try:
        import llama_cpp
    except ImportError:
        return {"installed": False}
    except (RuntimeError, OSError) as e:  # installed, but its library would not load
        return {
            "installed": True,
            "error": f"its library would not load: {printable(e, 300)}",
            "lib_path_env": os.environ.get("LLAMA_CPP_LIB_PATH"),
        }
    from specdec.llama_trust.build_flags import this_machine
    from specdec.llama_trust.ggml_bufts import ggml, lib_dir
    from specdec.llama_trust.kernel_check import make_install_record

    out: dict[str, Any] = {
        "installed": True,
        "version": getattr(llama_cpp, "__version__", None),
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "built_by_make_install": make_install_record(),  # read safely (llama_trust.kernel_check)
        "lib_dir": str(lib_dir(llama_cpp)),
        "lib_path_env": os.environ.get("LLAMA_CPP_LIB_PATH"),
    }
    plan = this_machine()
    out["build_plan_here"] = {"cmake_args": list(plan.cmake_args), "reason": plan.reason}
    try:
        g = ggml(llama_cpp)
        out["optional_kernels"] = list(g.extra_types())
        out["gpu_devices"] = g.has_gpu()
        out["exact_build"] = g.row_invariant_repack()
        out["exact_build_version"] = g.row_invariant_version()
    except Exception as e:  # an unusual build: say so rather than fail the report
        out["optional_kernels"] = f"unreadable: {e}"
    return out


def exact_build_text(exact_build: object, version: object = None) -> str:
    """Which build is present, in the words doctor and the profile use (``version``: the
    patch version the build reports, where known)."""
    if exact_build is True:
        from specdec.llama_trust.exact_kernels import DEFAULT_ATTENTION_FROM, KEEPS_TILED_FROM

        if not isinstance(version, int) or version < 1:
            kept, named = "the repacked kernels", ""
        elif version >= DEFAULT_ATTENTION_FROM:
            kept = "the repacked kernels, the tiled path and llama.cpp's default attention"
            named = f", patch version {version}"
        elif version >= KEEPS_TILED_FROM:
            kept, named = "the repacked kernels and the tiled path", f", patch version {version}"
        else:
            kept, named = "the repacked kernels, the tiled path off", f", patch version {version}"
        return (
            f"exact build (patches/ggml-cpu-repack-row-invariant.patch{named}): --exact keeps "
            f"{kept} (row-invariant mode)"
        )
    if exact_build is False:
        return (
            "stock build: --exact moves the repacked groups whose rows differ to the plain "
            "kernels (`make install` builds the patched one)"
        )
    return "build kind unknown (its ggml could not be read)"


def _kernel_checks() -> dict[str, Any]:
    from specdec.llama_trust.kernel_check import cached_verdicts, checks_dir

    return {
        "dir": str(checks_dir()),
        "verdicts": [v.to_dict() for v in cached_verdicts()],
    }


def _exact_checks() -> dict[str, Any]:
    from specdec.llama_trust.exact_kernels import cached_verdicts, checks_dir

    return {
        "dir": str(checks_dir()),
        "verdicts": [v.to_dict() for v in cached_verdicts()],
    }


def _exact_line(v: dict[str, Any]) -> str:
    groups = ", ".join(v.get("groups") or []) or "none"
    avoid = ", ".join(v.get("avoid") or [])
    state = f"moved to plain kernels: {avoid}" if avoid else "all kept"
    return f"{v.get('model') or v.get('key')} [{groups}] {state} ({v.get('created', '')})"


def _gpus() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return {"torch": torch.__version__, "cuda": cuda, "mps": mps}


def _store() -> dict[str, Any]:
    from specdec import hub

    return {
        "dir": str(hub.default_cache_dir()),
        "models": {e.name: hub.model_status(e) for e in hub.MODELS},
    }


def _profiles() -> dict[str, Any]:
    from specdec.profiler.cache import profile_dir

    d = profile_dir()
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    out: dict[str, Any] = {"dir": str(d), "cached": len(files)}
    try:
        from specdec.pairs import DEFAULT_TARGET
        from specdec.profiler.auto import auto_profile

        prof = auto_profile(
            DEFAULT_TARGET,
            draft="auto",
            target_backend="auto",
            draft_backend="auto",
            n_ctx=2048,
            n_threads=None,
            cached_only=True,
        )
    except Exception as e:  # a damaged cache or missing backend: report, do not fail
        out["default_profile"] = f"unreadable: {e}"
        return out
    if prof is None:
        out["default_profile"] = None
    else:
        out["default_profile"] = {"recommendation": prof.recommendation, "exact": prof.exact}
    return out


def gather(*, check: Path | None = None) -> dict[str, Any]:
    """The report as a JSON-ready dict; ``check`` runs (or reads) the kernel check of a GGUF."""
    from specdec import __version__
    from specdec.util.machine import all_cpu_flags, machine_info, package_versions

    flags = all_cpu_flags()
    report: dict[str, Any] = {
        "specdec": __version__,
        "machine": {**machine_info(), "os": platform.platform()},
        "cpu_flags": {"simd": _simd(flags), "all": list(flags)},
        "packages": package_versions(),
        "python": sys.version.split()[0],
    }
    report["llama_cpp"] = _llama()
    if check is not None:
        report["kernel_check_now"] = _check_now(check)
    report["kernel_checks"] = _kernel_checks()
    report["exact_checks"] = _exact_checks()
    report["gpus"] = _gpus()
    report["store"] = _store()
    report["profiles"] = _profiles()
    out: dict[str, Any] = json_ready(report)
    return out


def _check_now(path: Path) -> dict[str, Any]:
    from specdec.hub.gguf import check_gguf_header
    from specdec.llama_trust.kernel_check import CheckSettings, kernel_verdict

    header = check_gguf_header(path)
    verdict = kernel_verdict(
        path, header, CheckSettings(n_threads=os.cpu_count() or 1), log=lambda _: None
    )
    return verdict.to_dict()


def _verdict_line(v: dict[str, Any]) -> str:
    off = v.get("disabled") or []
    state = "all kept" if not off else f"{'/'.join(off)} OFF (choice {v['choice']})"
    trials = ", ".join(
        f"{t['choice']}: {t['outcome']}{' ' + t['detail'] if t['detail'] else ''}"
        for t in v.get("trials", [])
    )
    weights = "/".join(v.get("weights") or []) or "?"
    return f"{v.get('model') or v['key']} [{weights}] {state}; {trials} ({v.get('created', '')})"


def format_report(r: dict[str, Any]) -> str:
    """The one-screen text of ``gather``'s dict (every line escaped: cached verdicts and
    llama.cpp's own strings are read from files)."""
    return "\n".join(printable(line) for line in _lines(r))


def _lines(r: dict[str, Any]) -> list[str]:
    m = r["machine"]
    lines = [
        f"specdec {r['specdec']} doctor: paste this into a bug report",
        f"machine     {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"{m['memory_gib']} GiB; {m['os']}; Python {r['python']}",
        f"cpu flags   {' '.join(r['cpu_flags']['simd']) or '(none listed)'}",
        "packages    " + ", ".join(f"{k} {v}" for k, v in r["packages"].items() if v is not None),
    ]
    ll = r["llama_cpp"]
    if not ll.get("installed"):
        lines.append("llama.cpp   llama-cpp-python is not installed")
    elif ll.get("error"):
        env = ll.get("lib_path_env")
        lines.append(
            f"llama.cpp   installed, but {ll['error']}"
            + (f" (LLAMA_CPP_LIB_PATH={env})" if env else "")
        )
    else:
        made = ll.get("built_by_make_install")
        if isinstance(made, dict):
            args = made.get("cmake_args")
            shown = " ".join(map(str, args)) if isinstance(args, list) else str(args or "")
            made_text = printable(f"{made.get('reason')} (CMAKE_ARGS: {shown or 'none'})", 500)
        else:
            made_text = "not by `make install` (its own build: see the system info)"
        kernels = ll.get("optional_kernels")
        lines += [
            f"llama.cpp   {ll.get('version')}: {ll.get('system_info')}",
            f"  optional kernels (extra buffer types): "
            f"{', '.join(kernels) if isinstance(kernels, list) else kernels or 'none'}",
            f"  build: {made_text}",
            "  " + exact_build_text(ll.get("exact_build"), ll.get("exact_build_version")),
            f"  libraries: {ll.get('lib_dir')}"
            + (" (LLAMA_CPP_LIB_PATH: another build)" if ll.get("lib_path_env") else ""),
            f"  make install here would: {ll['build_plan_here']['reason']}",
        ]
    if "kernel_check_now" in r:
        lines.append("kernel check  " + _verdict_line(r["kernel_check_now"]))
    kc = r["kernel_checks"]
    lines.append(f"kernel checks ({len(kc['verdicts'])} cached in {kc['dir']})")
    lines += [f"  {_verdict_line(v)}" for v in kc["verdicts"][:8]]
    ec = r["exact_checks"]
    lines.append(f"exact checks ({len(ec['verdicts'])} cached in {ec['dir']})")
    lines += [f"  {_exact_line(v)}" for v in ec["verdicts"][:8]]
    g = r["gpus"]
    gpu = ", ".join(g.get("cuda") or []) or "no CUDA device"
    lines.append(
        f"gpus        torch {g.get('torch')}: {gpu}; MPS {'yes' if g.get('mps') else 'no'}"
    )
    st = r["store"]
    lines.append(
        f"store       {st['dir']}: " + ", ".join(f"{k} {v}" for k, v in st["models"].items())
    )
    pr = r["profiles"]
    prof = pr.get("default_profile")
    if isinstance(prof, dict):
        rec = prof["recommendation"] or {}
        exact = prof.get("exact") or {}
        price = (
            f"exact numerics +{100 * (exact['exact_step_s'] / exact['step_s'] - 1):.1f} % "
            "per plain step"
            if exact.get("step_s")
            else "exact numerics' price not measured"
        )
        prof_text = f"default target profiled: {rec.get('label', rec.get('candidate'))}; {price}"
    else:
        prof_text = prof or "no profile of the default target yet (specdec profile)"
    lines.append(f"profiles    {pr['cached']} cached in {pr['dir']}; {prof_text}")
    return lines
