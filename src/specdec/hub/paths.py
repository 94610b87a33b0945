"""Where specdec keeps files: one cache-directory rule for the store and every backend.

The cache is always an absolute path, fixed when it is named: a relative ``--cache-dir`` or
``SPECDEC_CACHE`` is taken from the working directory at that moment, so that a subprocess
run from another directory (pip, downloading into the cache) writes where the store reads.
An empty ``--cache-dir`` is an error rather than the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from specdec.errors import ConfigError

CACHE_ENV = "SPECDEC_CACHE"


def default_cache_dir() -> Path:
    """``$SPECDEC_CACHE`` if set and non-empty, else ``~/.cache/specdec/models`` (absolute)."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".cache" / "specdec" / "models"


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """An explicit cache directory (``~`` expanded, made absolute), else the default one."""
    if cache_dir is None:
        return default_cache_dir()
    if not str(cache_dir).strip():
        raise ConfigError("the cache directory is empty: give a path (or leave it out)")
    return Path(cache_dir).expanduser().absolute()
