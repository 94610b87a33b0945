"""Where specdec keeps files: one cache-directory rule for the store and every backend."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPECDEC_CACHE"


def default_cache_dir() -> Path:
    """``$SPECDEC_CACHE`` if set and non-empty, else ``~/.cache/specdec/models``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specdec" / "models"


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """An explicit cache directory (``~`` expanded), else the default one."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
