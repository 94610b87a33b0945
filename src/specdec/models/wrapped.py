"""A ``CausalLM`` over another one: the base of the backends that only watch or alter a few
calls (fault injection, recording, prefix reuse, batch-dependent noise)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.core.model import CausalLM, Tokenizer, extend_last


class WrappedLM:
    """Delegates the ``CausalLM`` interface to ``self.model``; subclasses override what they
    change. ``extend(tokens, last_only=True)`` goes through ``extend_last``, so the wrapped
    model need not take the keyword."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids
        self.n_ctx = model.n_ctx

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    @property
    def n_cached(self) -> int:
        return self.model.n_cached

    def truncate(self, n_keep: int) -> None:
        self.model.truncate(n_keep)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        return extend_last(self.model, tokens) if last_only else self.model.extend(tokens)
