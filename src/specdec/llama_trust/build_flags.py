"""How `make install` builds llama-cpp-python on this machine, and why (standard library only:
it runs before the virtual environment exists).

llama-cpp-python builds llama.cpp from source with ``-march=native`` (``GGML_NATIVE=ON``), so
the build compiles every kernel the CPU advertises. One combination is known to be broken:
**AMX kernels built by GCC older than 13**. On Intel Xeons with AMX (Sapphire Rapids and
later: every current Xeon cloud instance), llama-cpp-python 0.3.36 built by GCC 12.2 dies at
the first decode in ``ggml_backend_amx_mul_mat`` (SIGSEGV; SIGILL with one OpenMP thread;
llama.cpp issue 20824, ollama issue 17006; ollama traced its AMX crashes to GCC 11/12 code
generation and fixed them by building with GCC 13). For that combination the build names the
CPU's instruction sets one by one instead of ``-march=native`` and leaves AMX out; the
repacked kernels (CPU_REPACK, most of the speed on AVX-512) are kept. Everywhere else it is
the native build, as pip would make it.

pip caches a wheel built from source by the source archive alone, not by ``CMAKE_ARGS``, so a
cached native build would be handed back for a changed flag set. The wheel is therefore built
with pip's cache off into ``.whl/llama-<key>/``, where the key covers the package version, the
flags and the compiler, and installed from there; a later install with the same key reuses it.

The build is **patched** by default: ``patches/ggml-cpu-repack-row-invariant.patch`` is
applied to the llama.cpp that llama-cpp-python vendors. It gives ggml's repacked CPU kernels a
row-invariant mode (``GGML_CPU_REPACK_ROW_INVARIANT=1``, off unless set; specdec's exact
numerics set it), in which an n-row product computes every row as the one-row product does, so
that speculative output can be plain decoding's token for token at llama.cpp's speed. With the
mode off the patched library runs the stock code (from patch version 6 the mode's kernels are
copies beside the stock ones). The source archive comes from the package index and is checked
against its pinned SHA-256 before it is unpacked; the wheel goes to ``.whl/llama-exact-<key>/``
(the key also covers the patch). ``--stock`` (``make stock-build``) builds and installs the
unpatched library instead, into ``.whl/llama-<key>/``.

A user's own ``CMAKE_ARGS`` (``-DGGML_CUDA=on``, say) are passed on after the plan's, so they
win where both set an option, and they are part of the key. The C compiler is ``$CC`` (a
command line such as ``ccache gcc`` is run as one), else ``cc``/``gcc``; where it cannot be run
on a CPU with AMX, AMX is left out as for GCC < 13 (the safe side). A wheel is installed only
if it is the file this script built there (its SHA-256 is recorded beside it at build time); a
wheel found without that record, or with another digest, is built again.

    python src/specdec/llama_trust/build_flags.py --explain   # what would be built, and why
    python src/specdec/llama_trust/build_flags.py --install VENV_PY  # build (or reuse), install
    python src/specdec/llama_trust/build_flags.py --install VENV_PY --stock  # the stock library
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGE = "llama-cpp-python==0.3.36"  # the version specdec is tested and measured with
# its source archive on PyPI (files there never change), checked before the exact build uses it
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PATCH = Path(__file__).resolve().parents[3] / "patches" / "ggml-cpu-repack-row-invariant.patch"
FIRST_GOOD_GCC = 13
# /proc/cpuinfo flag(s) -> the GGML option that compiles for them (ggml/CMakeLists.txt)
ISA_OPTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("sse4_2",), "GGML_SSE42"),
    (("avx",), "GGML_AVX"),
    (("avx2",), "GGML_AVX2"),
    (("fma",), "GGML_FMA"),
    (("f16c",), "GGML_F16C"),
    (("bmi2",), "GGML_BMI2"),
    (("avx_vnni",), "GGML_AVX_VNNI"),
    # GGML_AVX512 compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
    (("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "GGML_AVX512"),
    (("avx512vbmi",), "GGML_AVX512_VBMI"),
    (("avx512_vnni",), "GGML_AVX512_VNNI"),
    (("avx512_bf16",), "GGML_AVX512_BF16"),
)
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
RECORD = "llama-build.json"  # written into the virtual environment after an install


@dataclass(frozen=True)
class BuildPlan:
    """The CMAKE_ARGS for llama-cpp-python's build (empty: the native build) and why;
    ``user_args``: the user's own ``CMAKE_ARGS``, passed after the plan's (they win)."""

    cmake_args: tuple[str, ...]
    reason: str
    compiler: str
    amx: bool  # the CPU advertises AMX
    user_args: tuple[str, ...] = ()

    def key(self, package: str = PACKAGE) -> str:
        parts: list[object] = [package, list(self.cmake_args), self.compiler]
        if self.user_args:  # absent otherwise, so the keys of earlier builds still hold
            parts.append(list(self.user_args))
        blob = json.dumps(parts, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def all_args(self) -> str:
        """The CMAKE_ARGS the build runs with: the plan's, then the user's."""
        return " ".join((*self.cmake_args, *self.user_args))


def read_cpu_flags(cpuinfo: str) -> frozenset[str]:
    for line in cpuinfo.splitlines():
        if line.lower().startswith(("flags", "features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


NOT_RUNNABLE = "(not runnable)"


def compiler_version(cc: str | None = None) -> tuple[str, int | None]:
    """(what the build's C compiler says it is, GCC's major version or None for another).
    ``cc`` (default ``$CC``) is a command line: ``ccache gcc`` runs ``ccache gcc --version``.
    A compiler that cannot be run says so in the first item (``NOT_RUNNABLE``)."""
    cc = cc or os.environ.get("CC", "").strip() or shutil.which("cc") or shutil.which("gcc")
    cc = cc or "cc"
    try:
        argv = shlex.split(cc)
    except ValueError:
        argv = []
    if not argv:
        return f"{cc} {NOT_RUNNABLE}", None
    try:
        proc = subprocess.run([*argv, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return f"{cc} {NOT_RUNNABLE}", None
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0 or not out.strip():
        return f"{cc} {NOT_RUNNABLE}", None
    first = out.splitlines()[0].strip()
    if "clang" in out.lower():
        return first, None
    m = re.search(r"\b(\d+)\.\d+(\.\d+)?\b", first)
    return first, int(m.group(1)) if m else None


def plan_build(flags: frozenset[str], compiler: str, gcc_major: int | None) -> BuildPlan:
    """The pure decision: the native build unless the CPU has AMX and GCC < 13 compiles it."""
    amx = any(f.startswith("amx") for f in flags)
    if not amx:
        return BuildPlan((), "native build: this CPU has no AMX", compiler, amx)
    unknown = compiler.endswith(NOT_RUNNABLE)
    if not unknown and (gcc_major is None or gcc_major >= FIRST_GOOD_GCC):
        return BuildPlan(
            (), "native build: AMX with a compiler not known to break it", compiler, amx
        )
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{opt}={'ON' if set(need) <= flags else 'OFF'}" for need, opt in ISA_OPTIONS]
    args += [f"-D{opt}=OFF" for opt in AMX_OPTIONS]
    which = (
        "the compiler could not be asked its version (it may be a GCC < 13)"
        if unknown
        else f"the compiler is GCC {gcc_major} (< {FIRST_GOOD_GCC})"
    )
    reason = (
        f"this CPU has AMX and {which}, whose AMX kernels crash at the first decode: the "
        "CPU's instruction sets named one by one, AMX left out, repacked kernels kept"
    )
    return BuildPlan(tuple(args), reason, compiler, amx)


def user_cmake_args(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The user's own ``CMAKE_ARGS`` (shell words), passed on after the plan's."""
    text = (os.environ if environ is None else environ).get("CMAKE_ARGS", "")
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return tuple(text.split())


def this_machine() -> BuildPlan:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    compiler, major = compiler_version()
    plan = plan_build(read_cpu_flags(cpuinfo), compiler, major)
    user = user_cmake_args()
    return BuildPlan(plan.cmake_args, plan.reason, plan.compiler, plan.amx, user)


def explain(plan: BuildPlan) -> str:
    args = plan.all_args or "(none: pip's default native build)"
    mine = f" (yours last: {' '.join(plan.user_args)})" if plan.user_args else ""
    return (
        f"llama-cpp-python build: {plan.reason}\n  CMAKE_ARGS={args}{mine}\n"
        f"  compiler: {plan.compiler}"
    )


def _prefix(python: str) -> Path:
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(out)


WHEEL_RECORD = "built.json"  # beside a wheel this script built: its file name and SHA-256


def built_wheel(where: Path) -> Path | None:
    """The wheel this script built in ``where`` (its recorded SHA-256 matches), or None: a
    wheel without the record, or with another digest, is not trusted (and is removed)."""
    name = digest = None
    try:
        record = json.loads((where / WHEEL_RECORD).read_text(encoding="utf-8"))
        name, digest = str(record["wheel"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for wheel in sorted(where.glob("llama_cpp_python-*.whl")):
        if wheel.name == name and wheel.is_file() and _sha256(wheel) == digest:
            return wheel
        print(f"llama-cpp-python: {wheel} is not a wheel this build made; removed", flush=True)
        wheel.unlink()
    return None


def _build_wheel(python: str, source: str, plan: BuildPlan, where: Path) -> Path:
    """``pip wheel`` of ``source`` (a requirement or a source tree) with pip's cache off into
    ``where``, recorded by its SHA-256."""
    where.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": plan.all_args}
    _run([python, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "-w", str(where),
          source], env)  # fmt: skip
    wheels = sorted(where.glob("llama_cpp_python-*.whl"), key=lambda w: w.stat().st_mtime)
    if not wheels:
        raise OSError(f"pip wheel left no llama_cpp_python wheel in {where}")
    wheel = wheels[-1]
    record = {"wheel": wheel.name, "sha256": _sha256(wheel)}
    (where / WHEEL_RECORD).write_text(json.dumps(record), encoding="utf-8")
    return wheel


def install(python: str, plan: BuildPlan, wheels: Path, package: str = PACKAGE) -> Path:
    """The stock (unpatched) build: build (pip's cache off) or reuse the wheel for ``plan``
    and install it into the environment of ``python``, unless that environment already holds
    this build; record what was installed beside it."""
    record = _prefix(python) / RECORD
    done = installed_record(str(record.parent))
    importable = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode
    if done is not None and done.get("key") == plan.key(package) and importable == 0:
        print(f"llama-cpp-python: this build is installed already ({record})", flush=True)
        return record
    where = wheels / f"llama-{plan.key(package)}"
    wheel = built_wheel(where) or _build_wheel(python, package, plan, where)
    _run([python, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)],
         dict(os.environ))  # fmt: skip
    _run([python, "-m", "pip", "install", package], dict(os.environ))  # its dependencies
    record.write_text(json.dumps({**asdict(plan), "package": package, "key": plan.key(package)}))
    return record


def exact_key(plan: BuildPlan, patch: bytes, package: str = PACKAGE) -> str:
    """The key of the patched build (the default): the stock build's key and the patch's
    bytes."""
    blob = json.dumps([plan.key(package), hashlib.sha256(patch).hexdigest()])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(python: str, cache: Path) -> Path:
    """The source archive from the package index (cached in ``cache``), SHA-256 checked."""
    archive = cache / SDIST
    if not archive.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        _run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "-d", str(cache), PACKAGE], dict(os.environ))  # fmt: skip
    got = _sha256(archive)
    if got != SDIST_SHA256:
        archive.unlink()
        raise SystemExit(f"{archive}: SHA-256 {got} is not the pinned {SDIST_SHA256}; removed")
    return archive


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply ``patch`` (paths relative to llama.cpp's root) to the vendored llama.cpp."""
    root = tree / "vendor" / "llama.cpp"
    if shutil.which("patch"):
        cmd = ["patch", "--batch", "--forward", "-p1", "-d", str(root), "-i", str(patch)]
    else:
        cmd = ["git", "apply", "-p1", f"--directory={root}", str(patch)]
    _run(cmd, dict(os.environ))


def build_exact_wheel(
    python: str, plan: BuildPlan, wheels: Path, patch: Path = PATCH, package: str = PACKAGE
) -> Path:
    """The patched wheel in ``wheels/llama-exact-<key>/``, built there (pip's cache off) from
    the checked source archive unless this script built it there already."""
    where = wheels / f"llama-exact-{exact_key(plan, patch.read_bytes(), package)}"
    wheel = built_wheel(where)
    if wheel is not None:
        return wheel
    archive = fetch_sdist(python, wheels / "sdist")
    with tempfile.TemporaryDirectory(prefix="llama-exact-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tree = next(Path(tmp).glob("llama_cpp_python-*"))
        apply_patch(tree, patch)
        return _build_wheel(python, str(tree), plan, where)


def install_exact(
    python: str, plan: BuildPlan, wheels: Path, patch: Path = PATCH, package: str = PACKAGE
) -> Path:
    """Build (or reuse) llama-cpp-python with ``patch`` applied and install it into the
    environment of ``python``; the record names the patch."""
    record = _prefix(python) / RECORD
    key = exact_key(plan, patch.read_bytes(), package)
    done = installed_record(str(record.parent))
    importable = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode
    if done is not None and done.get("key") == key and importable == 0:
        print(f"llama-cpp-python: the patched build is installed already ({record})", flush=True)
        return record
    wheel = build_exact_wheel(python, plan, wheels, patch, package)
    _run([python, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)],
         dict(os.environ))  # fmt: skip
    _run([python, "-m", "pip", "install", package], dict(os.environ))  # its dependencies
    patch_sha256 = hashlib.sha256(patch.read_bytes()).hexdigest()
    made = {**asdict(plan), "package": package, "key": key, "patch": patch.name}
    record.write_text(json.dumps({**made, "patch_sha256": patch_sha256}))
    return record


def _run(cmd: Sequence[str], env: dict[str, str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(list(cmd), env=env, check=True)


def installed_record(prefix: str | None = None) -> dict[str, object] | None:
    """What `make install` recorded in this environment (None where it did not run, or
    where something else is there: a FIFO hung the read, /dev/zero filled memory, 2,000
    levels of nesting were a RecursionError; a record of another shape is rebuilt over).
    Standard library only: this file runs before specdec is installed."""
    path = Path(prefix or sys.prefix) / RECORD
    limit = 1 << 20
    try:  # a regular file, not followed through a link, opened without blocking on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(limit + 1)
        data = json.loads(raw.decode("utf-8")) if len(raw) <= limit else None
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="llama-cpp-python's build flags for this machine")
    ap.add_argument("--explain", action="store_true", help="say what would be built and why")
    ap.add_argument("--install", metavar="PYTHON", help="build or reuse, then install into it")
    ap.add_argument(
        "--stock", action="store_true", help="the unpatched library (default: the patched one)"
    )
    ap.add_argument("--install-exact", metavar="PYTHON", help=argparse.SUPPRESS)  # = --install
    ap.add_argument("--key", action="store_true", help="print only the build's key")
    ap.add_argument("--wheels", type=Path, default=Path(".whl"))
    args = ap.parse_args(argv)
    plan = this_machine()
    if args.key:
        print(plan.key() if args.stock else exact_key(plan, PATCH.read_bytes()))
        return 0
    print(explain(plan), flush=True)
    python = args.install or args.install_exact
    try:
        if python and args.stock:
            print("  the stock library (no patch)", flush=True)
            install(python, plan, args.wheels)
        elif python:
            print(f"  patch: {PATCH.name} (GGML_CPU_REPACK_ROW_INVARIANT)", flush=True)
            install_exact(python, plan, args.wheels)
    except subprocess.CalledProcessError as e:  # its own output is above; one line here
        print(f"build_flags: `{' '.join(map(str, e.cmd))}` failed (exit {e.returncode})",
              file=sys.stderr)  # fmt: skip
        return 1
    except OSError as e:  # no compiler, no patch program, a folder it cannot write
        print(f"build_flags: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
