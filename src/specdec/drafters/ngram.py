"""Prompt-lookup (n-gram) drafting: no draft model at all.

If the last n tokens of the context occurred earlier in the context, propose the tokens that
followed that earlier occurrence (the most recent one). Longer n-grams are tried first. The
draft has no probabilities (one-hot q), which the accept/reject rule handles exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.core.drafter import Draft
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.errors import ConfigError


def lookup_continuation(context: Sequence[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the context's last n-gram."""
    length = len(context)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = list(context[length - n :])
        # search right to left, excluding the suffix itself
        for start in range(length - n - 1, -1, -1):
            if list(context[start : start + n]) == suffix:
                follow = list(context[start + n : start + n + k])
                if follow:
                    return follow
    return []


class NgramDrafter:
    """Prompt-lookup drafter (one-hot q)."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ConfigError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n = max_n
        self.min_n = min_n
        self.name = f"ngram{min_n}-{max_n}"

    def reset(self) -> None:
        pass

    def prefill(self, context: Sequence[int]) -> None:
        pass

    def rollback(self, context: Sequence[int]) -> None:
        pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        if k <= 0:
            return Draft([], None)
        tokens = lookup_continuation(context, k, self.max_n, self.min_n)
        return Draft(tokens, None)
