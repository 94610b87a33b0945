"""A bounds-checked GGUF header reader: cheap sanity checks before llama.cpp or transformers
see a file."""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"

# --------------------------------------------------------------------------------------------
# GGUF header sanity check
# --------------------------------------------------------------------------------------------

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MAX_COUNT = 1 << 24
_INT_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 10: "Q", 11: "q"}
_ARCH_INTS = ("block_count", "context_length", "embedding_length")
_HEAD_INTS = ("attention.head_count", "attention.head_count_kv")
_MAX_DIMS = 8
_MAX_LAYERS = 4096  # no released model comes near; llama.cpp aborts on absurd counts


@dataclass(frozen=True)
class GGUFHeader:
    """What :func:`check_gguf_header` learned: format version, counts and the data extent."""

    version: int
    tensor_count: int
    kv_count: int
    alignment: int
    data_end: int
    file_size: int
    architecture: str = ""
    block_count: int | None = None  # "{arch}.block_count" as written in the metadata
    layers: int = 0  # distinct blk.N indices in the tensor table
    context_length: int | None = None  # "{arch}.context_length": the trained context
    embedding_length: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None

    def kv_bytes_per_token(self) -> int | None:
        """f16 K and V cache bytes per context position (None when the metadata lacks a
        figure): 2 (K, V) x layers x n_embd x n_head_kv / n_head x 2 bytes."""
        if not (self.block_count and self.embedding_length and self.head_count):
            return None
        kv = self.head_count_kv or self.head_count
        return 2 * self.block_count * self.embedding_length * kv // self.head_count * 2


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

    def integer(self, vtype: int) -> int | None:
        """An integer scalar of GGUF type vtype (None, after skipping it, for other types)."""
        fmt = _INT_FORMATS.get(vtype)
        if fmt is None:
            self.skip_value(vtype)
            return None
        value: int = struct.unpack_from(
            self.order + fmt, self.buf, self.skip(_SCALAR_SIZES[vtype])
        )[0]
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
    arch = ""
    ints: dict[str, int] = {}  # "{arch}.<name>" integer metadata, resolved after the loop
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.u32()
        if key == b"general.alignment" and vtype == _UINT32:
            alignment = cur.u32()
        elif key == b"general.architecture" and vtype == _STRING:
            arch = cur.string().decode("utf-8", "replace")
        elif key.endswith(
            (
                b".block_count",
                b".context_length",
                b".embedding_length",
                b".attention.head_count",
                b".attention.head_count_kv",
            )
        ):
            value = cur.integer(vtype)
            if value is not None:
                ints[key.decode("utf-8", "replace")] = value
        else:
            cur.skip_value(vtype)
    if alignment <= 0 or alignment & (alignment - 1):
        raise _BadHeader(f"bad alignment {alignment}")
    extents = []
    blocks: set[int] = set()
    for _ in range(n_tensors):
        name = cur.string()
        if name.startswith(b"blk."):
            index = name.split(b".")[1]
            if index.isdigit():
                blocks.add(int(index))
        n_dims = cur.u32()
        if n_dims > _MAX_DIMS:
            raise _BadHeader(f"tensor with {n_dims} dimensions at byte {cur.pos}")
        dims = [cur.u64() for _ in range(n_dims)]
        ggml_type, offset = cur.u32(), cur.u64()
        extents.append(offset + _tensor_nbytes(dims, ggml_type))
    data_start = -(-cur.pos // alignment) * alignment
    data_end = data_start + max(extents, default=0)

    def meta(name: str) -> int | None:
        return ints.get(f"{arch}.{name}")

    return GGUFHeader(
        version,
        n_tensors,
        n_kv,
        alignment,
        data_end,
        cur.size,
        architecture=arch,
        block_count=meta("block_count"),
        layers=len(blocks),
        context_length=meta("context_length"),
        embedding_length=meta("embedding_length"),
        head_count=meta("attention.head_count"),
        head_count_kv=meta("attention.head_count_kv"),
    )


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
    check_metadata(p, header)
    return header


def check_metadata(path: Path, header: GGUFHeader) -> None:
    """Crafted or inconsistent model metadata, caught before llama.cpp acts on it (it aborts
    the process, or allocates what the metadata asks for)."""
    if header.block_count is not None and not 0 <= header.block_count <= _MAX_LAYERS:
        raise ModelLoadError(
            f"{path}: corrupt GGUF metadata: {header.architecture}.block_count = "
            f"{header.block_count}"
        )
    if header.block_count is not None and header.layers and header.block_count != header.layers:
        raise ModelLoadError(
            f"{path}: corrupt GGUF metadata: {header.architecture}.block_count says "
            f"{header.block_count} layers but the file holds tensors for {header.layers}"
        )
    for name, value in (
        ("context_length", header.context_length),
        ("embedding_length", header.embedding_length),
        ("attention.head_count", header.head_count),
    ):
        if value is not None and not 1 <= value <= _MAX_COUNT * 64:
            raise ModelLoadError(
                f"{path}: corrupt GGUF metadata: {header.architecture}.{name} = {value}"
            )
    if (
        header.head_count_kv is not None
        and header.head_count
        and not (1 <= header.head_count_kv <= header.head_count)
    ):
        raise ModelLoadError(
            f"{path}: corrupt GGUF metadata: {header.architecture}.attention.head_count_kv = "
            f"{header.head_count_kv} (head_count {header.head_count})"
        )
