"""One grammar tried against a vocabulary: a matcher made and its first mask computed, which
is where the engine reports what it cannot use (an invalid schema or grammar, one past its
limits, one that allows no output at all). The checker's worker process runs it under its
limits (``constraints.check``); where no worker can run, this process does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdec.constraints.engine import engine, limits, one_line


def new_matcher(vocab: Any, grammar: str) -> Any:
    """A matcher of ``grammar`` over ``vocab`` with ``engine.LIMITS`` (it may hold an error:
    ``is_error()``)."""
    return engine().LLMatcher(vocab, grammar, log_level=0, limits=limits())


def first_mask_error(vocab: Any, grammar: str) -> str | None:
    """The engine's error for ``grammar`` (one line), or None when it has a first mask."""
    matcher = new_matcher(vocab, grammar)
    if matcher.is_error():
        return one_line(matcher.get_error())
    words = np.zeros((vocab.vocab_size + 31) // 32, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    if matcher.is_error():
        return one_line(matcher.get_error())
    if not words.any():
        return "the grammar allows no output"
    return None
