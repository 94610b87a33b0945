"""specdec: lossless speculative decoding you can run, measure and certify.

    import specdec
    pair = specdec.load()                                   # default draft/target pair
    print(pair.generate("def fib(n):", max_new_tokens=16))   # text; .result has the stats

The API names below are imported on first use (PEP 562), so ``import specdec`` and the
command line's light subcommands do not pay for torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from specdec.errors import (
    ConfigError,
    ContextOverflowError,
    ModelLoadError,
    SpecdecError,
    VocabMismatchError,
)

if TYPE_CHECKING:
    from specdec.api import Pair, load
    from specdec.completion import Comparison, Completion, TextStream
    from specdec.core.loop import generate, generate_stream
    from specdec.core.result import GenerationResult
    from specdec.core.sampling import SamplingConfig

__version__ = "0.1.0"

_LAZY: Mapping[str, str] = MappingProxyType(
    {
        "load": "specdec.api",
        "Pair": "specdec.api",
        "Comparison": "specdec.completion",
        "Completion": "specdec.completion",
        "TextStream": "specdec.completion",
        "generate": "specdec.core.loop",
        "generate_stream": "specdec.core.loop",
        "GenerationResult": "specdec.core.result",
        "SamplingConfig": "specdec.core.sampling",
    }
)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Comparison",
    "Completion",
    "ConfigError",
    "ContextOverflowError",
    "GenerationResult",
    "ModelLoadError",
    "Pair",
    "SamplingConfig",
    "SpecdecError",
    "TextStream",
    "VocabMismatchError",
    "__version__",
    "generate",
    "generate_stream",
    "load",
]
