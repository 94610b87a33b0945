"""Reuse a prompt's prefill across many generations from the same prompt.

``generate`` starts every call with truncate(0) and a prefill of the prompt. A sampled test
runs hundreds of independent sequences per prompt, and on a real model that prefill would
dominate the cost. ``PrefixReuseLM`` remembers the first extend after truncate(0) and, when
the same tokens are extended from position 0 again, moves the wrapped model's cache back to
the end of that prefix (truncate, exact by the CausalLM contract) instead of recomputing it.
Both decoders being compared go through the same wrapper, so they see the same prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.core.model import (
    CausalLM,
    check_extend_args,
    check_truncate_args,
    extend_last,
)
from specdec.models.wrapped import WrappedLM


class PrefixReuseLM(WrappedLM):
    """A ``CausalLM`` over another one; positions are virtual until the next real extend.

    Invariant: the wrapped cache holds ``self._tokens`` and its first ``n_cached`` entries are
    the tokens this wrapper is said to hold.
    """

    def __init__(self, model: CausalLM) -> None:
        super().__init__(model)
        if model.n_cached:
            model.truncate(0)
        self._tokens: list[int] = []
        self._n = 0
        self._prefix: tuple[int, ...] | None = None
        self._prefix_logits: torch.Tensor | None = None  # [len(prefix), V] or [1, V]
        self.reused = 0  # prefills served from the cache

    @property
    def n_cached(self) -> int:
        return self._n

    def truncate(self, n_keep: int) -> None:
        check_truncate_args(self, n_keep)
        self._n = n_keep

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend_args(self, tokens)
        t = [int(x) for x in tokens]
        stored = self._prefix_logits
        if (
            self._n == 0
            and stored is not None
            and tuple(t) == self._prefix
            and self._tokens[: len(t)] == t
            and (last_only or stored.shape[0] == len(t))
        ):
            self._n = len(t)
            self.reused += 1
            return stored[-1:].clone() if last_only else stored.clone()
        if len(self._tokens) > self._n:
            self.model.truncate(self._n)
            del self._tokens[self._n :]
        out = extend_last(self.model, t) if last_only else self.model.extend(t)  # [1|n, V]
        self._tokens.extend(t)
        if self._n == 0:
            self._prefix, self._prefix_logits = tuple(t), out.clone()
        self._n += len(t)
        return out
