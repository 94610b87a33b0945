"""Which of llama.cpp's optional kernels exact numerics may keep on this machine.

Exact numerics (``models.exact``) need every row of an n-token pass to equal, bit for bit,
the row a one-token pass gives. Whether an optional kernel keeps that depends on the kernel,
so on the weight type it runs for: on x86 the repacked Q4_K gemm (4+ rows) sums in another
order than its one-row gemv, while other repacked kernels may not
(``benchmarks/studies/kernel_rows.py`` measures it per group; docs/exact-numerics.md has the
table). Turning
every optional kernel off (what exact numerics did first) costs ~40 % of decode speed on
AVX-512 machines, so this module decides per *group* (``BUFT/TYPE``, ``llama_trust.ggml_bufts``):

1. the groups a load with the kernel check's choice would use (none: nothing to decide);
2. a child process loads the model with all of them and exact numerics' other settings (tiled
   K-quant path off, the attention of ``exact_attention``) and compares passes of
   ``PROBE_ROWS`` rows with one-token passes bitwise (``models.exact.check_rows_exact``);
3. if any row differs: one child per group, that group alone on its optional kernel; the
   groups whose rows differ (or whose child fails) are avoided.

On the exact build (``make install``: ``patches/ggml-cpu-repack-row-invariant.patch``)
exact numerics first switch the repacked kernels to their row-invariant mode
(``use_row_invariant_kernels``); the same probe then finds every group invariant and nothing
is moved, and a build or machine where the mode does not hold is caught by the same probe.
From the patch's version 2 on the mode also keeps ggml's tiled K-quant path (Q6_K, whose
smaller products then sum in the tiled order; ``row_invariant_keeps_tiled``), so exact
numerics leave it on there. From version 4 on a one-column float product sums in
llamafile_sgemm's order, so llama.cpp's default attention (no flash attention, F16 cache) is
row-invariant too and exact numerics run it (``exact_attention``); elsewhere they run flash
attention with Q8_0 keys and F16 values.

The verdict is cached per llama.cpp build, CPU (model and flags), model file, kernel choice
and thread count (one small JSON file in ``<store>/exact-checks``). The load-time self-check
(``models.exact.self_check``) still runs on every load with the resulting choice: a verdict
that no longer holds refuses exact mode there.

``SPECDEC_TEST_ROWS_FAULT=GROUP`` is the test hook: a child in which that group is in use
reports its rows as differing, so that moving a group off can be tested on machines whose
kernels are all row-invariant.

    python -m specdec.models.exact_probe MODEL --threads N --choice all|avoid:A,B
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from specdec.errors import ModelLoadError
from specdec.llama_trust.ggml_bufts import Choice
from specdec.llama_trust.kernel_check import Log, stderr_log, verdict_dir
from specdec.util import jsonbound

SCHEMA = 1
# past every row-count switch of ggml's CPU kernels (sgemm 2, repack gemm 4 with a gemv
# tail, tiled 8, a 16-row repack block) up to the loop's longest pass (a draft of 64)
PROBE_ROWS = (2, 3, 4, 5, 8, 9, 16, 17, 65)
PROBE_CONTEXT = 20
CHILD_TIMEOUT_S = 900.0
FAULT_ENV = "SPECDEC_TEST_ROWS_FAULT"
CHECKS_DIR_ENV = "SPECDEC_EXACT_CHECKS"
TILED_ENV = "GGML_CPU_TILED_MM"
# the exact build's switch (patches/ggml-cpu-repack-row-invariant.patch): its repacked kernels
# compute every row of an n-row product as the one-row product does; ggml reads it once per
# process, at its first repacked product
ROW_INVARIANT_ENV = "GGML_CPU_REPACK_ROW_INVARIANT"
_MAX_CACHE_BYTES = 1 << 20
PROBE_TEXT = (
    "Exact numerics: the same logits whatever the pass size.\ndef f(x):\n    return x + 1\n"
)


@dataclass(frozen=True)
class ExactAttention:
    """The attention exact numerics run: flash attention or not, and the KV cache types."""

    flash_attn: bool
    type_k: str
    type_v: str

    def kv(self) -> tuple[str, str]:
        return self.type_k, self.type_v

    def key(self) -> str:
        """Its part of a cache key (verdicts, target costs, profiles)."""
        return "/".join(self.kv()) + ("" if self.flash_attn else "/no-flash")


# Any build: flash attention's one-token path splits the KV range across threads from 512
# cells when K and V have the same F16/F32 type, and without flash attention the F16 products
# go through llamafile_sgemm from 2 rows and vec_dot for 1; types that differ avoid the split.
FLASH_Q8_0_KEYS = ExactAttention(True, "q8_0", "f16")
# The exact build from version 4: a one-column float product sums in llamafile_sgemm's order,
# so llama.cpp's default attention is row-invariant and exact numerics pay nothing for it.
DEFAULT_ATTENTION = ExactAttention(False, "f16", "f16")
DEFAULT_ATTENTION_FROM = 4


@dataclass(frozen=True)
class GroupTrial:
    """One child: the groups it kept, whether every row was identical, and the evidence."""

    kept: tuple[str, ...]
    exact: bool
    detail: str  # "row 1 of a 4-token pass differs by 0.37", "identical", "exit 1: ..."
    seconds: float


@dataclass(frozen=True)
class ExactVerdict:
    """The groups exact numerics avoid on top of the kernel check's ``choice``."""

    choice: str  # the kernel check's choice this verdict starts from
    groups: tuple[str, ...]  # the groups that choice uses
    avoid: tuple[str, ...]  # the ones whose rows depend on the pass size
    trials: tuple[GroupTrial, ...] = ()
    key: str = ""
    seconds: float = 0.0
    cached: bool = False
    model: str = ""
    created: str = ""

    @property
    def kept(self) -> tuple[str, ...]:
        return tuple(g for g in self.groups if g not in self.avoid)

    def notice(self) -> str | None:
        """One line when a group is moved off its optional kernel (None otherwise)."""
        if not self.avoid:
            return None
        from specdec.util.printable import printable

        bad = next((t for t in self.trials if not t.exact), None)
        why = f" ({bad.detail})" if bad else ""
        keeps = f"; kept: {', '.join(self.kept)}" if self.kept else ""
        return printable(  # a cached verdict's strings: nothing of theirs drives the terminal
            f"exact numerics: {', '.join(self.avoid)} give rows that depend on the pass "
            f"size{why}; those weights run on the plain kernels{keeps}",
            1000,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExactVerdict:
        """A verdict from its JSON; TypeError, KeyError or ValueError for anything else (a
        cache entry of another shape is checked again)."""
        if not isinstance(data, dict):
            raise TypeError("a verdict is a JSON object")
        Choice.parse(str(data["choice"]))
        trials = data.get("trials", ())
        if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
            raise TypeError("trials is a list of objects")
        return cls(
            choice=str(data["choice"]),
            groups=tuple(str(g) for g in _strings(data["groups"])),
            avoid=tuple(str(g) for g in _strings(data["avoid"])),
            trials=tuple(
                GroupTrial(
                    tuple(str(g) for g in _strings(t["kept"])),
                    bool(t["exact"]),
                    str(t["detail"]),
                    _seconds(t["seconds"]),
                )
                for t in trials
            ),
            key=str(data.get("key", "")),
            model=str(data.get("model", "")),
            created=str(data.get("created", "")),
        )


def _strings(x: object) -> list[object]:
    if not isinstance(x, list) or not all(isinstance(g, str) for g in x):
        raise TypeError("expected a list of strings")
    return x


def _seconds(x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
        raise ValueError("seconds are a finite number >= 0")
    return float(x)


def use_row_invariant_kernels(llama_cpp: Any) -> bool:
    """On the exact build, switch its repacked kernels to their row-invariant mode for this
    process (unless the environment already says otherwise) and say whether it is on; False
    on a stock build, where the probe moves the non-invariant groups off instead."""
    from specdec.llama_trust.ggml_bufts import ggml

    if not ggml(llama_cpp).row_invariant_repack():
        return False
    return os.environ.setdefault(ROW_INVARIANT_ENV, "1").strip() not in ("", "0")


# from this patch version on, the row-invariant mode also keeps ggml's tiled K-quant path
# (Q6_K; the other types leave it in that mode) and the repacked Q4_K gemm
KEEPS_TILED_FROM = 2


def _row_invariant_from(llama_cpp: Any, version: int) -> bool:
    """The exact build's row-invariant mode, patch ``version`` or later, is on (or will be,
    ``use_row_invariant_kernels`` setting it) for this process."""
    from specdec.llama_trust.ggml_bufts import ggml

    if ggml(llama_cpp).row_invariant_version() < version:
        return False
    return os.environ.get(ROW_INVARIANT_ENV, "1").strip() not in ("", "0")


def row_invariant_keeps_tiled(llama_cpp: Any) -> bool:
    """Whether exact numerics may leave ggml's tiled K-quant path on: the exact build's
    row-invariant mode (version 2 on) is on, or will be, for this process."""
    return _row_invariant_from(llama_cpp, KEEPS_TILED_FROM)


# The patch's one-column float product (llamafile_sgemm_one_column) is built for x86 only: on
# ARM builds that keep llamafile_sgemm (no i8mm/SVE: Apple M1, Graviton2) the default
# attention's rows still depend on the pass size, so exact numerics keep flash attention there
# (docs/machines.md; the ARM analysis of patch version 6)
ONE_COLUMN_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def exact_attention(llama_cpp: Any | None = None, machine: str | None = None) -> ExactAttention:
    """The attention exact numerics run with this build (``llama_cpp``: the module, imported
    here when None) on this machine (``machine``: ``platform.machine()`` when None):
    llama.cpp's default on the exact build from patch version 4 with its row-invariant mode
    on (or about to be) on x86, where the patch makes a one-column float product sum in
    llamafile_sgemm's order; flash attention with Q8_0 keys otherwise."""
    if llama_cpp is None:
        try:
            import llama_cpp
        except ImportError:  # no llama.cpp backend: nothing to run, the general choice
            return FLASH_Q8_0_KEYS
    arch = (machine if machine is not None else platform.machine()).lower()
    if arch not in ONE_COLUMN_MACHINES:
        return FLASH_Q8_0_KEYS
    on = _row_invariant_from(llama_cpp, DEFAULT_ATTENTION_FROM)
    return DEFAULT_ATTENTION if on else FLASH_Q8_0_KEYS


def checks_dir(root: Path | None = None) -> Path:
    return verdict_dir(root, CHECKS_DIR_ENV, "exact-checks")


def verdict_key(
    llama_cpp: Any, path: Path, choice: Choice, groups: Sequence[str], threads: int, fault: str
) -> str:
    from specdec.llama_trust.kernel_check import build_id
    from specdec.util.machine import all_cpu_flags, cpu_model

    try:
        version = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        version = getattr(llama_cpp, "__version__", "unknown")
    st = path.stat()
    blob = {
        "schema": SCHEMA,
        "cpu": cpu_model(),
        "flags": hashlib.sha256(" ".join(all_cpu_flags()).encode()).hexdigest(),
        "llama_cpp_python": version,
        "build": build_id(llama_cpp),
        "model": [path.name, st.st_size, st.st_mtime_ns],
        "choice": choice.text(),
        "groups": list(groups),
        "threads": threads,
        "rows": list(PROBE_ROWS),
        "kv": exact_attention(llama_cpp).key(),  # the attention the verdict was found under
        "fault": fault,
        "row_invariant": os.environ.get(ROW_INVARIANT_ENV, ""),
        "tiled": os.environ.get(TILED_ENV, ""),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def _child(
    path: Path, choice: Choice, threads: int, fault: str, keep_tiled: bool = False
) -> tuple[bool, str, float]:
    """(every row identical, evidence, seconds) of one probe child."""
    # the parent's tiled setting (exact numerics set it off unless the build keeps it)
    env = {**os.environ}
    if not keep_tiled:
        env.setdefault(TILED_ENV, "0")
    if fault:
        env[FAULT_ENV] = fault
    cmd = [sys.executable, "-m", "specdec.models.exact_probe", str(path)]
    cmd += ["--threads", str(threads), "--choice", choice.text()]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, errors="replace",
            timeout=CHILD_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"no result after {CHILD_TIMEOUT_S:.0f} s", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return bool(result["exact"]), str(result["detail"]), seconds
    except (IndexError, ValueError, KeyError, TypeError):
        from specdec.util.printable import printable

        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return False, f"exit {done.returncode}: {printable(last, 200)}", seconds


def run_check(
    path: Path,
    choice: Choice,
    groups: Sequence[str],
    threads: int,
    fault: str,
    keep_tiled: bool = False,
) -> tuple[tuple[str, ...], tuple[GroupTrial, ...]]:
    """(groups to avoid, trials): all groups together first, then one at a time."""
    ok, detail, secs = _child(path, choice, threads, fault, keep_tiled)
    trials = [GroupTrial(tuple(groups), ok, detail, round(secs, 2))]
    if ok:
        return (), tuple(trials)
    if len(groups) == 1:
        return tuple(groups), tuple(trials)
    avoid = []
    for g in groups:
        alone = choice.avoiding(x for x in groups if x != g)
        ok, detail, secs = _child(path, alone, threads, fault, keep_tiled)
        trials.append(GroupTrial((g,), ok, detail, round(secs, 2)))
        if not ok:
            avoid.append(g)
    return tuple(avoid), tuple(trials)


def _read_entry(path: Path) -> ExactVerdict | None:
    from specdec.hub.safe_paths import read_regular

    raw = read_regular(path, _MAX_CACHE_BYTES)
    if raw is None:
        return None
    try:
        return replace(ExactVerdict.from_dict(jsonbound.loads(raw.decode("utf-8"))), cached=True)
    except (ValueError, KeyError, TypeError, RecursionError, jsonbound.JsonError):
        return None  # a damaged entry is checked again


def cached_verdicts(root: Path | None = None) -> list[ExactVerdict]:
    """Every verdict in the cache (for ``specdec doctor``), newest first."""
    directory = checks_dir(root)
    if not directory.is_dir():
        return []
    found = [v for p in sorted(directory.glob("*.json")) if (v := _read_entry(p)) is not None]
    return sorted(found, key=lambda v: v.created, reverse=True)


def exact_verdict(
    path: Path,
    tensors: Sequence[Any],
    choice: Choice,
    threads: int,
    *,
    log: Log = stderr_log,
    root: Path | None = None,
) -> ExactVerdict:
    """The groups exact numerics avoid when ``path`` loads with ``choice`` (the kernel
    check's): cached, or checked now in child processes (and cached)."""
    import llama_cpp

    from specdec.llama_trust.ggml_bufts import ggml, weight_groups

    groups = tuple(weight_groups(ggml(llama_cpp), tensors, choice))
    if not groups:
        return ExactVerdict(choice.text(), (), ())
    fault = os.environ.get(FAULT_ENV, "")
    key = verdict_key(llama_cpp, path, choice, groups, threads, fault)
    directory = checks_dir(root)
    hit = _read_entry(directory / f"{key}.json")
    if hit is not None and hit.key == key:
        if hit.notice():
            log(hit.notice() or "")
        return hit
    log(
        f"checking which optional kernels keep exact numerics ({', '.join(groups)}) on this "
        "machine once: bitwise row checks in child processes (cached)"
    )
    t0 = time.perf_counter()
    keep_tiled = row_invariant_keeps_tiled(llama_cpp)
    avoid, trials = run_check(path, choice, groups, threads, fault, keep_tiled)
    verdict = ExactVerdict(
        choice=choice.text(),
        groups=groups,
        avoid=avoid,
        trials=trials,
        key=key,
        seconds=round(time.perf_counter() - t0, 2),
        model=path.name,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    try:
        from specdec.hub.safe_paths import real_dir, write_new

        d = real_dir(directory.parent, directory.name)
        write_new(d / f"{key}.json", json.dumps(verdict.to_dict(), indent=1).encode())
    except (OSError, ModelLoadError) as e:  # an unwritable cache costs a check next time
        log(f"could not cache the exact-numerics check in {directory}: {e}")
    if verdict.notice():
        log(verdict.notice() or "")
    return verdict
