"""A bounds-checked GGUF header reader: cheap sanity checks before llama.cpp or transformers
see a file."""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
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
_MAX_DIMS = 8
# tables longer than this are checked but not kept (the largest released models have a few
# thousand tensors; a crafted header could list millions)
_MAX_TENSOR_INFOS = 1 << 16
# what llama.cpp's load_hparams asserts on (GGML_ASSERT: the process aborts, exit 134, nothing
# printed): llama-hparams.h LLAMA_MAX_LAYERS / LLAMA_MAX_EXPERTS, llama-model.cpp (0.3.36)
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# "{arch}.<name>" integer metadata read from the header (scalars; the maximum of an array)
_INT_KEYS = (
    "block_count",
    "context_length",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "expert_count",
    "expert_used_count",
    "expert_group_count",
    "expert_group_used_count",
    "nextn_predict_layers",
    "posnet.block_count",
    "convnext.block_count",
)
_INT_SUFFIXES = tuple(f".{k}".encode() for k in _INT_KEYS)
_ROPE_SCALING_SUFFIX = b".rope.scaling.type"
_MAX_INT_ARRAY = 1 << 16  # a per-layer array longer than this is only skipped


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: name, extents (ne0 first, as ggml orders them) and ggml
    type id."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int


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
    ints: dict[str, int] = field(default_factory=dict)  # every "{arch}.<name>" of _INT_KEYS
    rope_scaling_type: str | None = None
    # the tensor table, in file order (empty when it has more than _MAX_TENSOR_INFOS entries)
    tensors: tuple[TensorInfo, ...] = ()

    def meta(self, name: str) -> int | None:
        """The integer metadata "{arch}.<name>" (the largest entry of a per-layer array)."""
        return self.ints.get(name)

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

    def int_array_max(self) -> int | None:
        """The largest entry of an integer array (None, after skipping it, for another array or
        an empty one)."""
        etype, count = self.u32(), self.u64()
        fmt = _INT_FORMATS.get(etype)
        if fmt is None or count > _MAX_INT_ARRAY:
            if etype in _SCALAR_SIZES:
                self.skip(count * _SCALAR_SIZES[etype])
                return None
            if count > self.size:
                raise _BadHeader(f"array of {count} items at byte {self.pos}")
            for _ in range(count):
                self.skip_value(etype, 1)
            return None
        start = self.skip(count * _SCALAR_SIZES[etype])
        values = struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, start)
        return max(values, default=None)

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
    strings: dict[str, str] = {}
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.u32()
        if key == b"general.alignment" and vtype == _UINT32:
            alignment = cur.u32()
        elif key == b"general.architecture" and vtype == _STRING:
            arch = cur.string().decode("utf-8", "replace")
        elif key.endswith(_INT_SUFFIXES):
            value = cur.int_array_max() if vtype == _ARRAY else cur.integer(vtype)
            if value is not None:
                ints[key.decode("utf-8", "replace")] = value
        elif key.endswith(_ROPE_SCALING_SUFFIX) and vtype == _STRING:
            strings[key.decode("utf-8", "replace")] = cur.string().decode("utf-8", "replace")
        else:
            cur.skip_value(vtype)
    if alignment <= 0 or alignment & (alignment - 1):
        raise _BadHeader(f"bad alignment {alignment}")
    extents = []
    blocks: set[int] = set()
    tensors: list[TensorInfo] = []
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
        if n_tensors <= _MAX_TENSOR_INFOS:
            tensors.append(TensorInfo(name.decode("utf-8", "replace"), tuple(dims), ggml_type))
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
        ints={k: v for k in _INT_KEYS if (v := meta(k)) is not None},
        rope_scaling_type=strings.get(f"{arch}.rope.scaling.type"),
        tensors=tuple(tensors),
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
    """Crafted or inconsistent model metadata, caught before llama.cpp acts on it: it aborts
    the process on what ``check_llama_hparams`` names, and allocates what the rest asks for."""
    problem = check_llama_hparams(header)
    if problem is not None:
        raise ModelLoadError(f"{path}: corrupt GGUF metadata: {header.architecture}.{problem}")
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


def check_llama_hparams(h: GGUFHeader) -> str | None:
    """What llama.cpp's ``load_hparams`` asserts on (it aborts the process, exit 134, with
    nothing on stderr), as "<key> = <value> (<rule>)"; None when all hold. The rules are
    llama.cpp's own, in its order (llama-model.cpp, llama-cpp-python 0.3.36)."""
    layers = h.block_count
    if layers is not None and not 1 <= layers <= LLAMA_MAX_LAYERS:
        return f"block_count = {layers} (llama.cpp allows 1..{LLAMA_MAX_LAYERS})"
    n_layers = layers or 0
    checked = ["nextn_predict_layers"]
    if h.architecture == "wavtokenizer-dec":  # the only architecture that reads these
        checked += ["posnet.block_count", "convnext.block_count"]
    for name in checked:
        value = h.meta(name)
        if value is not None and not 0 <= value <= n_layers:
            return f"{name} = {value} (more than block_count {n_layers})"
    experts = h.meta("expert_count") or 0
    if h.architecture in ("hunyuan_vl", "hunyuan-dense") and experts <= 1:
        return None  # llama.cpp treats these as dense and ignores the expert counts
    used = h.meta("expert_used_count") or 0
    groups = h.meta("expert_group_count") or 0
    group_used = h.meta("expert_group_used_count") or 0
    if not 0 <= experts <= LLAMA_MAX_EXPERTS:
        return f"expert_count = {experts} (llama.cpp allows 0..{LLAMA_MAX_EXPERTS})"
    if not 0 <= used <= experts:
        return f"expert_used_count = {used} (more than expert_count {experts})"
    if experts > 0:
        if used == 0:
            return f"expert_used_count = 0 (expert_count is {experts})"
        if not 0 <= groups < experts:
            return f"expert_group_count = {groups} (expert_count is {experts})"
        if groups > 1 and (experts % groups or not 0 < group_used < groups):
            return (
                f"expert_group_used_count = {group_used} (expert_count {experts} in "
                f"{groups} groups)"
            )
    elif groups != 0:
        return f"expert_group_count = {groups} (expert_count is 0)"
    if h.rope_scaling_type is not None and h.rope_scaling_type not in ROPE_SCALING_TYPES:
        return (
            f"rope.scaling.type = {h.rope_scaling_type!r} (llama.cpp knows "
            f"{', '.join(ROPE_SCALING_TYPES)})"
        )
    return None
