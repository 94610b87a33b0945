"""The bounds of settings that several commands and the Python API share, checked in one place.

``generate``, ``serve``, ``bench`` (flags and ``--config`` items), ``certify``, ``profile``
and ``specdec.load`` all call these, so a value refused by one is refused by all, with the
same words (``--seed -1`` used to be refused by ``generate`` and accepted by ``certify``).
"""

from __future__ import annotations

import math

from specdec.errors import ConfigError

SEED_LIMIT = 2**63  # torch generators take seeds below 2^64; JSON and numpy need < 2^63
MAX_SCALE = 1000.0  # certify --scale: sample sizes times this (1000x is days of work)
MAX_LIST = 10_000  # the longest list a range such as 1-8 may expand to


def check_seed(seed: int | None, name: str = "--seed") -> None:
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{name} must be in 0..2^63-1, got {seed}")


def check_threads(threads: int | None, name: str = "--threads") -> None:
    if threads is not None and threads < 1:
        raise ConfigError(f"{name} must be >= 1, got {threads}")


def check_n_ctx(n_ctx: int | None, name: str = "--n-ctx") -> None:
    if n_ctx is not None and n_ctx < 2:
        raise ConfigError(f"{name} must be >= 2, got {n_ctx}")


def check_scale(scale: float, name: str = "--scale") -> None:
    if not (math.isfinite(scale) and 0 < scale <= MAX_SCALE):
        raise ConfigError(f"{name} must be > 0 and at most {MAX_SCALE:g}, got {scale}")


def check_range(value: int, name: str, low: int, high: int) -> None:
    """``low <= value <= high`` (a count, a K, a number of repeats)."""
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in {low}..{high:,}, got {value}")
