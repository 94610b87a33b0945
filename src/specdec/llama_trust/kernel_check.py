"""Check llama.cpp's optional CPU kernels on this machine before trusting them.

A llama.cpp build offers *extra buffer types* (``llama_trust.ggml_bufts``): AMX tiles, repacked
gemm/gemv (``CPU_REPACK``), KleidiAI, ... Some machines cannot run some of them although the
build and the OS say they can: on Intel Xeons that advertise AMX, llama-cpp-python 0.3.36
built with GCC 12 dies in ``ggml_backend_amx_mul_mat`` at the first decode (SIGSEGV; SIGILL
with one OpenMP thread), and the kernel's AMX permission check passes there, so no OS-level
test predicts it (llama.cpp issue 20824, ollama issue 17006). A kernel can also run and
compute wrong numbers. So before a model is loaded with them, once per machine, build and
weight types, this module runs a small pass in child processes (``llama_trust.kernel_probe``):

1. the reference, with no optional kernel (``use_extra_bufts = False``);
2. every optional kernel the build lists (llama.cpp's default);
3. if that fails: all but one of them, for each (per tensor, through buffer-type overrides,
   so that ``CPU_REPACK`` stays on when only AMX fails);

and compares each pass's logits with the reference's. A child that dies by a signal, exits
with an error, outlives its time bound (10x the reference child's time, at least
``TIMEOUT_FLOOR_S``) or whose rows differ by more than ``TV_TOLERANCE`` (the largest total
variation distance between the two next-token distributions over the rows) fails. The first
choice that passes is the verdict: cached (one small JSON file per key), and printed as one
line when it turns something off. With every optional kernel healthy (every machine measured
so far but that Xeon) nothing is turned off and the first check costs two child loads.

The tolerance: healthy kernels do not compute bit-identical logits (a repacked gemm sums in
another order than the plain dot product). Measured by ``benchmarks/studies/kernel_diffs.py`` on the
healthy machine of ``benchmarks/results/kernel-diffs.json`` (2-core AMD EPYC with AVX-512:
CPU_REPACK against no extra buffer type, tiled path on and off, 1 and 2 threads, the three
models of the store): the largest row TV was 0.050 (Qwen2.5-Coder-1.5B Q4_K_M); the tolerance
is five times that. A kernel computing garbage gives TV near 1 (the ``wrong`` fault fixture:
0.99+).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import ModelLoadError
from specdec.hub.gguf import GGUFHeader
from specdec.llama_trust.ggml_bufts import Choice
from specdec.llama_trust.kernel_probe import parse_fault

SCHEMA = 2  # 2: verdicts record the model, its weight types and when
TV_TOLERANCE = 0.25
TIMEOUT_FLOOR_S = 60.0  # a child's time bound is at least this (a loaded machine is slow)
TIMEOUT_FACTOR = 10.0  # ... and at least this many times the reference child's time
REFERENCE_TIMEOUT_S = 600.0
FAULT_ENV = "SPECDEC_TEST_KERNEL_FAULT"  # the test hook: KIND:BUFT (llama_trust.kernel_probe)
CHECKS_DIR_ENV = "SPECDEC_KERNEL_CHECKS"
_MAX_CACHE_BYTES = 1 << 20
REBUILD_HINT = "a build without them: make install (docs/machines.md)"

Log = Callable[[str], None]


def stderr_log(message: str) -> None:
    print(f"specdec: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Trial:
    """One child pass: the choice of kernels, what happened, and its wall time."""

    choice: str
    outcome: str  # ok | signal | timeout | exit | mismatch
    detail: str  # "TV 0.003", "SIGSEGV", "after 60 s", "exit 1: ...", "TV 0.93 > 0.25"
    seconds: float


@dataclass(frozen=True)
class KernelVerdict:
    """Which of the build's optional kernels (``listed``) a load may use: ``choice`` is
    ``all``, ``avoid:A[,B]`` or ``none`` (``llama_trust.kernel_probe.Choice``)."""

    listed: tuple[str, ...]
    choice: str
    trials: tuple[Trial, ...] = ()
    key: str = ""
    seconds: float = 0.0  # spent checking now (0 when read from the cache)
    cached: bool = False
    checked: bool = True  # False: nothing to check (no optional kernel, or GPU offload)
    reason: str = ""  # why nothing was checked
    model: str = ""  # the file checked (the verdict holds for every file of these weights)
    weights: tuple[str, ...] = ()  # the ggml types of its matrix weights
    created: str = ""  # when the check ran (UTC, ISO 8601)

    @property
    def disabled(self) -> tuple[str, ...]:
        c = Choice.parse(self.choice)
        return tuple(b for b in self.listed if b not in c.in_use(self.listed))

    def failures(self) -> dict[str, str]:
        """The failed buffer types' evidence: name -> what happened with it in use."""
        return {t.choice: f"{t.outcome} ({t.detail})" for t in self.trials if t.outcome != "ok"}

    def notice(self) -> str | None:
        """One line when something is turned off (None otherwise)."""
        off = self.disabled
        if not off:
            return None
        from specdec.util.printable import printable

        failed = next((t for t in self.trials if t.outcome != "ok"), None)
        why = f"{failed.outcome}: {failed.detail}" if failed else "failed"
        kept = Choice.parse(self.choice).in_use(self.listed)
        keeps = f"; {', '.join(kept)} kept" if kept else ""
        # a cached verdict's strings are a file's: no terminal escape or line break of theirs
        # reaches the terminal
        return printable(
            f"llama.cpp's {'/'.join(off)} kernels failed a test pass on this machine ({why}); "
            f"loading without them{keeps}. For {REBUILD_HINT}.",
            1000,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["disabled"] = list(self.disabled)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelVerdict:
        """A verdict from its JSON; TypeError, KeyError or ValueError for anything else (a
        cache entry of another shape is checked again)."""
        if not isinstance(data, dict):
            raise TypeError("a verdict is a JSON object")
        raw = data.get("trials", ())
        if not isinstance(raw, list | tuple) or not all(isinstance(t, dict) for t in raw):
            raise TypeError("trials is a list of objects")
        trials = tuple(
            Trial(str(t["choice"]), str(t["outcome"]), str(t["detail"]), _seconds(t["seconds"]))
            for t in raw
        )
        Choice.parse(str(data["choice"]))  # a malformed cache entry raises here
        listed = data["listed"]
        if not isinstance(listed, list) or not all(isinstance(b, str) for b in listed):
            raise TypeError("listed is a list of names")
        weights = data.get("weights", ())
        if not isinstance(weights, list | tuple):
            raise TypeError("weights is a list")
        return cls(
            listed=tuple(str(b) for b in listed),
            choice=str(data["choice"]),
            trials=trials,
            key=str(data.get("key", "")),
            model=str(data.get("model", "")),
            weights=tuple(str(w) for w in weights),
            created=str(data.get("created", "")),
        )


def _seconds(x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
        raise ValueError("seconds are a finite number >= 0")
    return float(x)


@dataclass(frozen=True)
class CheckSettings:
    """What a check runs with; tests shorten the time bounds."""

    n_threads: int
    timeout_floor_s: float = TIMEOUT_FLOOR_S
    reference_timeout_s: float = REFERENCE_TIMEOUT_S
    fault: str | None = field(default_factory=lambda: os.environ.get(FAULT_ENV) or None)


def verdict_dir(root: Path | None, env_name: str, subdir: str) -> Path:
    """Where a check caches its verdicts: ``root``, else ``$env_name``, else the store's
    ``subdir`` (the kernel check's and the exact-numerics check's alike)."""
    if root is not None:
        return root
    env = os.environ.get(env_name, "").strip()
    if env:
        return Path(env).expanduser()
    from specdec.hub.paths import default_cache_dir

    return default_cache_dir() / subdir


def checks_dir(root: Path | None = None) -> Path:
    return verdict_dir(root, CHECKS_DIR_ENV, "kernel-checks")


def build_id(llama_cpp: Any) -> str:
    """SHA-256 over the shared libraries llama-cpp-python loads (another build: another id)."""
    from specdec.llama_trust.ggml_bufts import lib_dir

    libdir = lib_dir(llama_cpp)
    h = hashlib.sha256()
    for f in sorted(libdir.glob("*")):
        if f.is_file() and not f.is_symlink():
            h.update(f.name.encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def weight_types(header: GGUFHeader) -> tuple[int, ...]:
    """The ggml types of the model's matrix weights (what picks the kernels)."""
    return tuple(sorted({t.ggml_type for t in header.tensors if len(t.dims) >= 2}))


def type_names(types: Sequence[int]) -> tuple[str, ...]:
    import gguf

    out = []
    for t in types:
        try:
            out.append(gguf.GGMLQuantizationType(t).name)
        except ValueError:
            out.append(f"type {t}")
    return tuple(out)


def verdict_key(
    llama_cpp: Any, header: GGUFHeader, listed: Sequence[str], fault: str | None
) -> str:
    from specdec.util.machine import all_cpu_flags, cpu_model

    try:
        version = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        version = getattr(llama_cpp, "__version__", "unknown")
    blob = {
        "schema": SCHEMA,
        "cpu": cpu_model(),
        "flags": hashlib.sha256(" ".join(all_cpu_flags()).encode()).hexdigest(),
        "llama_cpp_python": version,
        "build": build_id(llama_cpp),
        "weights": list(weight_types(header)),
        "listed": list(listed),
        "fault": fault,
        "tolerance": TV_TOLERANCE,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def row_tv(a: np.ndarray, b: np.ndarray) -> float:
    """Largest total variation distance between softmax rows of a and b [n, V] (inf when a
    row is not finite or the shapes differ)."""
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")

    def softmax(x: np.ndarray) -> np.ndarray:
        z = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
        out: np.ndarray = z / z.sum(axis=-1, keepdims=True)
        return out

    return float(0.5 * np.abs(softmax(a) - softmax(b)).sum(axis=-1).max())


def _probe(
    path: Path,
    choice: Choice,
    listed: Sequence[str],
    settings: CheckSettings,
    timeout_s: float,
    out: Path,
) -> tuple[str, str, float]:
    """Run one child: (outcome, detail, seconds); outcome ok leaves the logits in ``out``."""
    cmd = [
        sys.executable,
        "-m",
        "specdec.llama_trust.kernel_probe",
        str(path),
        str(out),
        "--threads",
        str(settings.n_threads),
        "--choice",
        choice.text(),
        "--listed",
        ",".join(listed),
    ]
    if settings.fault:
        cmd += ["--fault", settings.fault]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return "timeout", f"no result after {timeout_s:.0f} s", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return "signal", name, seconds
    if done.returncode != 0 or not out.is_file():
        from specdec.util.printable import printable

        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return "exit", f"exit {done.returncode}: {printable(last, 200)}", seconds
    return "ok", "", seconds


def _read(out: Path) -> np.ndarray:
    with out.open("rb") as f:
        arr: np.ndarray = np.load(f, allow_pickle=False)
    return arr


def run_check(
    path: Path, listed: Sequence[str], settings: CheckSettings, *, key: str = ""
) -> KernelVerdict:
    """The check itself (no cache): reference, all, all-but-one, as the module doc says."""
    listed = tuple(listed)
    t_start = time.perf_counter()
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="specdec-kernels-") as tmp:
        ref_out = Path(tmp) / "reference.npy"
        none = Choice(extras=False)
        outcome, detail, ref_s = _probe(
            path, none, listed, settings, settings.reference_timeout_s, ref_out
        )
        trials.append(Trial(none.text(), outcome, detail, round(ref_s, 2)))
        if outcome != "ok":
            raise ModelLoadError(
                f"llama.cpp could not run {path.name} on this machine even without its "
                f"optional kernels ({outcome}: {detail})"
            )
        reference = _read(ref_out)
        timeout = max(settings.timeout_floor_s, TIMEOUT_FACTOR * ref_s)
        candidates = [Choice()] + [
            Choice(avoid=(b,)) for b in sorted(listed, key=lambda b: b == "CPU_REPACK")
        ]
        if len(listed) == 1:
            candidates = candidates[:1]  # avoiding the only one is "none"
        verdict = none
        for i, choice in enumerate(candidates):
            out = Path(tmp) / f"trial-{i}.npy"
            outcome, detail, secs = _probe(path, choice, listed, settings, timeout, out)
            if outcome == "ok":
                tv = row_tv(_read(out), reference)
                if tv > TV_TOLERANCE:
                    outcome, detail = "mismatch", f"TV {tv:.3g} > {TV_TOLERANCE}"
                else:
                    detail = f"TV {tv:.3g}"
            trials.append(Trial(choice.text(), outcome, detail, round(secs, 2)))
            if outcome == "ok":
                verdict = choice
                break
    return KernelVerdict(
        listed=listed,
        choice=verdict.text(),
        trials=tuple(trials),
        key=key,
        seconds=round(time.perf_counter() - t_start, 2),
    )


def _read_entry(path: Path) -> KernelVerdict | None:
    from specdec.hub.safe_paths import read_regular

    raw = read_regular(path, _MAX_CACHE_BYTES)
    if raw is None:
        return None
    from specdec.util import jsonbound

    try:
        data = jsonbound.loads(raw.decode("utf-8"))
        return replace(KernelVerdict.from_dict(data), cached=True)
    except (ValueError, KeyError, TypeError, RecursionError, jsonbound.JsonError):
        return None  # a damaged entry is checked again


def _load_cached(directory: Path, key: str) -> KernelVerdict | None:
    verdict = _read_entry(directory / f"{key}.json")
    return verdict if verdict is not None and verdict.key == key else None


def cached_verdicts(root: Path | None = None) -> list[KernelVerdict]:
    """Every verdict in the cache (for ``specdec doctor``), newest first."""
    directory = checks_dir(root)
    if not directory.is_dir():
        return []
    found = [v for p in sorted(directory.glob("*.json")) if (v := _read_entry(p)) is not None]
    return sorted(found, key=lambda v: v.created, reverse=True)


def _save(directory: Path, verdict: KernelVerdict) -> None:
    from specdec.hub.safe_paths import real_dir, write_new

    d = real_dir(directory.parent, directory.name)
    write_new(d / f"{verdict.key}.json", json.dumps(verdict.to_dict(), indent=1).encode())


def listed_types(llama_cpp: Any, fault: str | None) -> tuple[str, ...]:
    """The build's extra buffer types; a test fault names one the build may lack (it is then
    listed first, where ggml lists AMX)."""
    from specdec.llama_trust.ggml_bufts import ggml

    listed = tuple(ggml(llama_cpp).extra_types())
    parsed = parse_fault(fault)
    if parsed is not None and parsed[1] not in listed:
        listed = (parsed[1], *listed)
    return listed


def kernel_verdict(
    path: Path,
    header: GGUFHeader,
    settings: CheckSettings,
    *,
    log: Log = stderr_log,
    root: Path | None = None,
    device: str = "cpu",
) -> KernelVerdict:
    """The verdict for loading ``path`` on this machine: cached, or checked now (and cached).
    ``log`` hears that a check runs and what it turned off."""
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml

    listed = listed_types(llama_cpp, settings.fault)
    if not listed:
        return KernelVerdict((), "all", checked=False, reason="the build lists none")
    if device != "cpu" and ggml(llama_cpp).has_gpu():
        return KernelVerdict(listed, "all", checked=False, reason="layers are offloaded to a GPU")
    key = verdict_key(llama_cpp, header, listed, settings.fault)
    directory = checks_dir(root)
    hit = _load_cached(directory, key)
    if hit is not None:
        if hit.notice():
            log(hit.notice() or "")
        return hit
    log(
        f"checking llama.cpp's optional kernels ({', '.join(listed)}) on this machine once: "
        "a test pass in child processes with and without them (cached)"
    )
    verdict = replace(
        run_check(path, listed, settings, key=key),
        model=path.name,
        weights=type_names(weight_types(header)),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    try:
        _save(directory, verdict)
    except (OSError, ModelLoadError) as e:  # an unwritable cache costs a check next time
        log(f"could not cache the kernel check in {directory}: {e}")
    if verdict.notice():
        log(verdict.notice() or "")
    return verdict


def make_install_record() -> dict[str, Any] | None:
    """What `make install` recorded in this environment (``build_flags.RECORD``), read as a
    record the file system holds: a regular file, bounded, JSON of bounded depth, an object;
    else None (a FIFO there hung doctor, /dev/zero filled memory, 2,000 levels of nesting
    were a RecursionError; ``build_flags.installed_record`` reads it for the build itself)."""
    from specdec.hub.safe_paths import read_json
    from specdec.llama_trust.build_flags import RECORD

    data = read_json(Path(sys.prefix) / RECORD)
    return data if isinstance(data, dict) else None


def build_summary(verdict: KernelVerdict | None) -> dict[str, Any]:
    """What a results file says about the llama.cpp build a model ran on: version, how
    `make install` built it (None: another build), its system info, and the kernel check's
    verdict for the model (None: no optional kernel was in play)."""
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml

    return {
        "llama_cpp_python": getattr(llama_cpp, "__version__", None),
        "make_install": make_install_record(),
        "exact_build": ggml(llama_cpp).row_invariant_repack(),
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "kernels": None
        if verdict is None
        else {
            "listed": list(verdict.listed),
            "choice": verdict.choice,
            "disabled": list(verdict.disabled),
        },
    }


def build_line(summary: dict[str, Any]) -> str:
    """One line of ``build_summary``: the build and which optional kernels ran. The summary
    comes from a file (a cached profile, a results file): any shape gives a line, escaped."""
    from specdec.util.printable import printable

    if not isinstance(summary, dict):
        return "llama.cpp build: not recorded in a readable form"
    made = summary.get("make_install")
    how = str(made.get("reason")) if isinstance(made, dict) else "not built by make install"
    k = summary.get("kernels")

    def names(x: object) -> str:
        return ", ".join(map(str, x)) if isinstance(x, list | tuple) else str(x)

    if not k:
        kernels = "no optional kernels in use"
    elif not isinstance(k, dict):
        kernels = "optional kernels: not recorded in a readable form"
    elif k.get("disabled"):
        listed, off = names(k.get("listed", ())), names(k.get("disabled"))
        kernels = f"optional kernels {listed}: {off} off"
    else:
        kernels = f"optional kernels {names(k.get('listed', ())) or 'none'} all kept"
    exact_build = summary.get("exact_build")  # None: a results file from before it was recorded
    kind = "" if exact_build is None else "exact build; " if exact_build else "stock build; "
    line = f"llama.cpp {summary.get('llama_cpp_python')} ({kind}{how}); {kernels} (kernel check)"
    return printable(line, 1000)
