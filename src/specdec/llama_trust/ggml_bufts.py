"""llama.cpp's optional CPU kernels, as ggml names them: the CPU device's *extra buffer types*
(``AMX``, ``CPU_REPACK``, ``KLEIDIAI``, ...), and per-tensor overrides that keep a weight out of
the ones that must not be used.

llama.cpp places each weight in the first buffer type of its list that supports the weight's
operation (``llama-model-loader.cpp`` ``select_weight_buft``): the extra buffer types in the
order the CPU backend lists them, then the plain CPU buffer. A buffer type decides the kernels
the weight's matrix products run on (AMX tiles, repacked gemm/gemv, ...). Turning every extra
type off (``llama_model_params.use_extra_bufts = False``) is coarse: on AVX-512 machines the
repacked kernels are ~40 % of decode speed. ``tensor_buft_overrides`` place chosen tensors
in a chosen buffer type instead; this module computes, for a set of extra types to avoid,
the overrides that move exactly the tensors llama.cpp would have put there: each to the next
type of the list that supports it (asked of ggml itself, ``ggml_backend_dev_supports_op`` on
a small tensor of the same type and row count), or to a plain CPU buffer (``CPU_Mapped``: an
override to the ``CPU`` type itself would make llama.cpp choose among the extra types again).
Tensors read by row lookup (token embeddings) only ever move to the plain buffer.

A *group* is one weight type inside one extra buffer type, named ``BUFT/TYPE``
(``CPU_REPACK/Q4_K``): the kernels a weight runs on depend on both (the repacked Q4_K gemm is
not the repacked Q4_0 one), so a choice can avoid a group while the buffer type keeps the
other weight types (``llama_trust.exact_kernels`` moves only the groups whose rows depend on the
pass size).

Everything here is introspection through ggml's public C API (ctypes over the libraries
llama-cpp-python ships); no kernel runs. Whether a configuration actually computes the right
numbers is ``llama_trust.kernel_check``'s question, answered in a child process.
"""

from __future__ import annotations

import ctypes
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from specdec.errors import ModelLoadError
from specdec.hub.gguf import TensorInfo

PLAIN = "CPU_Mapped"  # a plain CPU buffer that llama.cpp does not re-route through the extras
# exported by the exact build only (patches/ggml-cpu-repack-row-invariant.patch)
ROW_INVARIANT_SYMBOL = "ggml_cpu_repack_row_invariant_supported"
REPACK = "CPU_REPACK"
# tensors that llama.cpp reads by row (GGML_OP_GET_ROWS): their bytes must keep ggml's layout
ROW_LOOKUP = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight"})
_CPU_DEVICE = 0  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU
_GPU_DEVICE_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
_F32 = 0


class _InitParams(ctypes.Structure):
    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


class TensorOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (include/llama.h)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class Override:
    """Tensors whose name matches ``pattern`` (a regular expression, anchored) go to the
    buffer type named ``buft``."""

    pattern: str
    buft: str


def type_name(ggml_type: int) -> str:
    """ggml's name of a weight type (``Q4_K``), or ``type N`` for one gguf does not know."""
    import gguf

    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def group_name(buft: str, ggml_type: int) -> str:
    """``CPU_REPACK/Q4_K``: one weight type in one buffer type."""
    return f"{buft}/{type_name(ggml_type)}"


@dataclass(frozen=True)
class Choice:
    """Which optional kernels a load uses: all the build offers (``extras`` and no ``avoid``),
    all but those named in ``avoid`` (per-tensor overrides; a name is a buffer type, or a
    group ``BUFT/TYPE``, which keeps the buffer type's other weight types), or none
    (``extras`` False)."""

    extras: bool = True
    avoid: tuple[str, ...] = ()

    def text(self) -> str:
        if not self.extras:
            return "none"
        return "all" if not self.avoid else "avoid:" + ",".join(self.avoid)

    @classmethod
    def parse(cls, text: str) -> Choice:
        if text == "all":
            return cls()
        if text == "none":
            return cls(extras=False)
        if text.startswith("avoid:") and len(text) > len("avoid:"):
            return cls(avoid=tuple(sorted(text[len("avoid:") :].split(","))))
        raise ValueError(f"bad kernel choice {text!r}: all | none | avoid:NAME[,NAME]")

    def in_use(self, listed: tuple[str, ...]) -> tuple[str, ...]:
        """The listed extra buffer types this choice keeps (for some weight type at least)."""
        return tuple(b for b in listed if b not in self.avoid) if self.extras else ()

    def avoiding(self, more: Iterable[str]) -> Choice:
        """This choice with ``more`` buffer types or groups avoided as well."""
        if not self.extras:
            return self
        return Choice(avoid=tuple(sorted({*self.avoid, *more})))


def lib_dir(llama_cpp: Any) -> Path:
    """The directory llama-cpp-python loaded its libraries from: its own ``lib/``, or
    ``LLAMA_CPP_LIB_PATH`` where that is set (another build, tried without installing it)."""
    base = getattr(getattr(llama_cpp, "llama_cpp", None), "_base_path", None)
    return Path(base) if base is not None else Path(llama_cpp.__file__).parent / "lib"


class Ggml:
    """The handful of ggml functions this module needs, bound once per process."""

    def __init__(self, llama_cpp: Any) -> None:
        from llama_cpp import _ctypes_extensions

        libdir = lib_dir(llama_cpp)
        libs = []
        for name in ("ggml", "ggml-base", "ggml-cpu"):
            try:
                libs.append(_ctypes_extensions.load_shared_library(name, libdir))
            except (OSError, RuntimeError, FileNotFoundError):
                continue
        if not libs:
            raise ModelLoadError(f"no ggml library found beside llama-cpp-python ({libdir})")
        self._libs = libs
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self.dev_count = self._fn("ggml_backend_dev_count", sz, [])
        self.dev_get = self._fn("ggml_backend_dev_get", vp, [sz])
        self.dev_type = self._fn("ggml_backend_dev_type", ctypes.c_int, [vp])
        self.dev_by_type = self._fn("ggml_backend_dev_by_type", vp, [ctypes.c_int])
        self.dev_reg = self._fn("ggml_backend_dev_backend_reg", vp, [vp])
        self.proc = self._fn("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p])
        self.buft_name = self._fn("ggml_backend_buft_name", ctypes.c_char_p, [vp])
        self.init = self._fn("ggml_init", vp, [_InitParams])
        self.free = self._fn("ggml_free", None, [vp])
        self.overhead = self._fn("ggml_tensor_overhead", sz, [])
        self.new_2d = self._fn(
            "ggml_new_tensor_2d", vp, [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        )
        self.mul_mat = self._fn("ggml_mul_mat", vp, [vp, vp, vp])
        self.alloc_buffer = self._fn("ggml_backend_buft_alloc_buffer", vp, [vp, sz])
        self.alloc_size = self._fn("ggml_backend_buft_get_alloc_size", sz, [vp, vp])
        self.buffer_base = self._fn("ggml_backend_buffer_get_base", vp, [vp])
        self.buffer_type = self._fn("ggml_backend_buffer_get_type", vp, [vp])
        self.buffer_free = self._fn("ggml_backend_buffer_free", None, [vp])
        self.tensor_alloc = self._fn("ggml_backend_tensor_alloc", ctypes.c_int, [vp, vp, vp])
        self.supports_op = self._fn("ggml_backend_dev_supports_op", ctypes.c_bool, [vp, vp])
        self.from_ptr = self._fn("ggml_backend_cpu_buffer_from_ptr", vp, [vp, sz])
        llama_cpp.llama_backend_init()
        cpu = self.dev_by_type(_CPU_DEVICE)
        if not cpu:
            raise ModelLoadError("llama.cpp lists no CPU device")
        self.cpu = cpu

    def _fn(self, name: str, restype: Any, argtypes: list[Any]) -> Any:
        for lib in self._libs:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = restype, argtypes
                return fn
        raise ModelLoadError(f"this llama-cpp-python's ggml has no {name}")

    def extra_types(self) -> dict[str, int]:
        """The CPU device's extra buffer types, name -> pointer, in llama.cpp's order."""
        address = self.proc(self.dev_reg(self.cpu), b"ggml_backend_dev_get_extra_bufts")
        if not address:
            return {}
        listing = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
        array = listing(self.cpu)
        out: dict[str, int] = {}
        i = 0
        while array and array[i]:
            out[self.buft_name(array[i]).decode("utf-8", "replace")] = int(array[i])
            i += 1
        return out

    def plain_type(self) -> int:
        """The ``CPU_Mapped`` buffer type: ggml's plain host buffer under another pointer than
        the ``CPU`` type's (read off a buffer made over a few bytes, then freed)."""
        raw = ctypes.create_string_buffer(256)
        aligned = (ctypes.addressof(raw) + 127) // 128 * 128
        buffer = self.from_ptr(aligned, 64)
        try:
            buft = int(self.buffer_type(buffer))
        finally:
            self.buffer_free(buffer)  # a from-pointer buffer frees nothing of the bytes
        assert self.buft_name(buft) == PLAIN.encode(), self.buft_name(buft)
        return buft

    def row_invariant_repack(self) -> bool:
        """Whether this build has the row-invariant mode of its repacked kernels (the exact
        build, ``make install``: ``patches/ggml-cpu-repack-row-invariant.patch``)."""
        return self.row_invariant_version() > 0

    def row_invariant_version(self) -> int:
        """The exact build's patch version (0: a stock build). 1: every row through the
        one-row kernels; 2: also Q4_K's repacked gemm and Q6_K's tiled path kept, the small
        products summing in their order; 3: Q4_K's gemm summing in the stock one-row gemv's
        order instead, so the rows outside groups of 4 run the stock gemv."""
        for lib in self._libs:
            fn = getattr(lib, ROW_INVARIANT_SYMBOL, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                fn.argtypes = []
                return max(1, int(fn()))
        return 0

    def has_gpu(self) -> bool:
        return any(
            self.dev_type(self.dev_get(i)) in _GPU_DEVICE_TYPES for i in range(self.dev_count())
        )

    def supports_mul_mat(self, buft: int, ggml_type: int, ne0: int, ne1: int) -> bool:
        """Whether ``buft`` takes a [ne1 rows x ne0] weight of ``ggml_type`` for a matrix
        product, as llama.cpp's loader asks (``weight_buft_supported``): a weight of the same
        type, row length and row count modulo 64 (the kernels' interleave constraints), in a
        buffer of that type, times a 512-column F32 activation. The buffer holds what the type
        asks for the weight (AMX's layout is larger than ``ggml_nbytes``: a buffer of that size
        fails ggml's bounds assertion and aborts the process)."""
        ctx = self.init(_InitParams(self.overhead() * 8, None, True))
        if not ctx:
            raise ModelLoadError("ggml could not make a context")
        try:
            weight = self.new_2d(ctx, ggml_type, ne0, 64 + ne1 % 64)
            act = self.new_2d(ctx, _F32, ne0, 512)
            op = self.mul_mat(ctx, weight, act)
            buffer = self.alloc_buffer(buft, self.alloc_size(buft, weight))
            if not buffer:
                return False
            try:
                if self.tensor_alloc(buffer, weight, self.buffer_base(buffer)) != 0:
                    return False
                return bool(self.supports_op(self.cpu, op))
            finally:
                self.buffer_free(buffer)
        finally:
            self.free(ctx)


@cache
def ggml(llama_cpp: Any) -> Ggml:
    """The bindings, made once per process (the libraries do not change under it)."""
    return Ggml(llama_cpp)


def _choice(
    g: Ggml, types: Sequence[tuple[str, int]], tensor: TensorInfo
) -> str:  # the buffer type llama.cpp would pick for a matrix-product weight
    ne0, ne1 = tensor.dims[0], tensor.dims[1]
    for name, ptr in types:
        if g.supports_mul_mat(ptr, tensor.ggml_type, ne0, ne1):
            return name
    return PLAIN


def _avoided(buft: str, ggml_type: int, avoid: frozenset[str]) -> bool:
    return buft in avoid or group_name(buft, ggml_type) in avoid


def moved_tensors(g: Ggml, tensors: Iterable[TensorInfo], avoid: frozenset[str]) -> dict[str, str]:
    """tensor name -> the buffer type it goes to instead, for every 2-D weight that llama.cpp
    would place in one of the ``avoid`` types or groups (the others stay where llama.cpp puts
    them)."""
    extras = g.extra_types()
    every = list(extras.items())
    moved: dict[str, str] = {}
    for t in tensors:
        if len(t.dims) != 2:
            continue  # norms and biases (1-D) are not matrix weights; 3-D: see the module doc
        if not _avoided(_choice(g, every, t), t.ggml_type, avoid):
            continue
        kept = [(n, p) for n, p in every if not _avoided(n, t.ggml_type, avoid)]
        moved[t.name] = PLAIN if t.name in ROW_LOOKUP else _choice(g, kept, t)
    return moved


def weight_groups(g: Ggml, tensors: Iterable[TensorInfo], choice: Choice) -> dict[str, int]:
    """``BUFT/TYPE`` -> how many matrix weights a load with ``choice`` places there, for the
    extra buffer types only (the plain buffer's kernels are not optional)."""
    if not choice.extras:
        return {}
    avoid = frozenset(choice.avoid)
    kept = [(n, p) for n, p in g.extra_types().items() if n not in avoid]
    out: dict[str, int] = defaultdict(int)
    for t in tensors:
        if len(t.dims) != 2 or t.name in ROW_LOOKUP:
            continue
        types = [(n, p) for n, p in kept if not _avoided(n, t.ggml_type, avoid)]
        buft = _choice(g, types, t)
        if buft != PLAIN:
            out[group_name(buft, t.ggml_type)] += 1
    return dict(sorted(out.items()))


def group_patterns(moved: dict[str, str]) -> tuple[Override, ...]:
    """Anchored patterns for ``moved``: one per (role, destination), the layers of a role
    joined (``^blk\\.(?:0|5|6)\\.ffn_down\\.weight$``), so llama.cpp compiles a few dozen
    expressions rather than one per tensor."""
    layered: dict[tuple[str, str], list[str]] = defaultdict(list)
    single: list[Override] = []
    for name, dest in moved.items():
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if m is None:
            single.append(Override(f"^{re.escape(name)}$", dest))
        else:
            layered[(m.group(2), dest)].append(m.group(1))
    for (role, dest), layers in layered.items():
        single.append(Override(rf"^blk\.(?:{'|'.join(layers)})\.{re.escape(role)}$", dest))
    return tuple(single)


class OverrideArray:
    """A NULL-terminated ``llama_model_tensor_buft_override`` array for the overrides (it
    owns the pattern bytes; keep it alive while llama.cpp loads)."""

    def __init__(self, g: Ggml, overrides: Sequence[Override]) -> None:
        types = {**g.extra_types(), PLAIN: g.plain_type()}
        unknown = sorted({o.buft for o in overrides} - types.keys())
        if unknown:
            raise ModelLoadError(f"this llama.cpp build has no buffer type {', '.join(unknown)}")
        self._patterns = [o.pattern.encode() for o in overrides]
        items = [
            TensorOverride(p, types[o.buft]) for p, o in zip(self._patterns, overrides, strict=True)
        ]
        self.array = (TensorOverride * (len(items) + 1))(*items, TensorOverride(None, None))

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)
