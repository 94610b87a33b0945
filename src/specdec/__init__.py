"""specdec: lossless speculative decoding you can run, measure and certify."""

from specdec.errors import (
    ConfigError,
    ContextOverflowError,
    ModelLoadError,
    SpecdecError,
    VocabMismatchError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ContextOverflowError",
    "ModelLoadError",
    "SpecdecError",
    "VocabMismatchError",
    "__version__",
]
