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
