"""Requantize a GGUF to another llama.cpp type with the quantizer llama-cpp-python bundles.

A draft only proposes tokens that the target verifies, so a cheaper draft (for example the
0.5B Q4_K_M requantized to Q4_0, which ggml runs with repacked and batch kernels on x86)
stays lossless; only its acceptance changes. The result is cached beside the model store,
in the model store's ``requantized/`` folder (``$SPECDEC_CACHE``, default
``~/.cache/specdec/models``), with a JSON sidecar recording the source file's
SHA-256, the type, and the output's own SHA-256, which is checked before a cached file is
reused.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError, ModelLoadError

# Output type name -> the llama_ftype constant in llama_cpp.llama_cpp.
FTYPES: dict[str, str] = {
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
}


@dataclass(frozen=True)
class Requantized:
    """A requantized file and what it was made from."""

    path: Path
    sha256: str
    size: int
    source: Path
    source_sha256: str
    ftype: str
    pure: bool
    seconds: float  # quantization time (0 when reused)
    reused: bool

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"], d["source"] = str(self.path), str(self.source)
        return d


def requantized_path(
    source: Path, ftype: str, *, pure: bool = False, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Where the requantized copy of ``source`` lives in the cache."""
    from specdec.hub import default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    stem = source.name.removesuffix(".gguf")
    return root / "requantized" / f"{stem}.{ftype}{'.pure' if pure else ''}.gguf"


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _cached(path: Path, source_sha: str, ftype: str, pure: bool) -> dict[str, Any] | None:
    from specdec.hub import sha256_file
    from specdec.hub.safe_paths import read_regular

    raw = read_regular(_sidecar(path), 1 << 20)  # never a FIFO or a device
    if not path.is_file() or raw is None:
        return None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict):
        return None
    wanted = {"source_sha256": source_sha, "ftype": ftype, "pure": pure}
    if any(meta.get(k) != v for k, v in wanted.items()):
        return None
    if meta.get("sha256") != sha256_file(path):
        return None
    return meta


def requantize(
    source: str | os.PathLike[str],
    ftype: str = "q4_0",
    *,
    pure: bool = False,
    n_threads: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Requantized:
    """Requantize ``source`` (any GGUF llama.cpp reads, quantized or not) to ``ftype``.

    pure: every tensor gets ``ftype`` (llama.cpp otherwise keeps its mixing rules, e.g. a
    larger type for the output head). n_threads <= 0 lets llama.cpp use every core. A cached
    result whose sidecar matches the source's SHA-256, the type and its own SHA-256 is reused
    unless ``force``.
    """
    from specdec.hub import check_gguf_header, sha256_file
    from specdec.models.llamacpp import _import_llama

    if ftype not in FTYPES:
        raise ConfigError(f"unknown type {ftype!r}; choose from {', '.join(FTYPES)}")
    src = Path(source).absolute()
    check_gguf_header(src)
    source_sha = sha256_file(src)
    out = requantized_path(src, ftype, pure=pure, cache_dir=cache_dir)
    if not force:
        meta = _cached(out, source_sha, ftype, pure)
        if meta is not None:
            return Requantized(
                out, meta["sha256"], out.stat().st_size, src, source_sha, ftype, pure, 0.0, True
            )
    llama_cpp = _import_llama()
    low = llama_cpp.llama_cpp
    params = low.llama_model_quantize_default_params()
    params.nthread = n_threads
    params.ftype = getattr(low, FTYPES[ftype])
    params.allow_requantize = True
    params.pure = pure
    from specdec.hub.safe_paths import real_dir, refuse_link, remove_tree, write_new

    real_dir(out.parent.parent, out.parent.name)  # a link planted there is refused
    refuse_link(out)
    partial = out.with_name(out.name + ".partial")
    remove_tree(partial)  # a planted link is removed, not written through
    t0 = time.perf_counter()
    rc = low.llama_model_quantize(
        str(src).encode("utf-8"), str(partial).encode("utf-8"), ctypes.byref(params)
    )
    seconds = time.perf_counter() - t0
    if rc != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise ModelLoadError(f"llama_model_quantize({src.name} -> {ftype}) failed with code {rc}")
    sha = sha256_file(partial)
    os.replace(partial, out)
    version = getattr(llama_cpp, "__version__", "unknown")
    meta = {
        "source": str(src),
        "source_sha256": source_sha,
        "ftype": ftype,
        "pure": pure,
        "sha256": sha,
        "size": out.stat().st_size,
        "llama_cpp_python": version,
    }
    write_new(_sidecar(out), (json.dumps(meta, indent=1) + "\n").encode("utf-8"))
    return Requantized(out, sha, out.stat().st_size, src, source_sha, ftype, pure, seconds, False)
