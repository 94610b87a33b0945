"""The one interface every backend implements, and checks shared by all of them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Protocol, cast, runtime_checkable

import torch


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids for one model."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@runtime_checkable
class CausalLM(Protocol):
    """A causal language model with a KV cache that can be extended and truncated.

    vocab_size      number of rows of the output logits (V)
    eos_token_ids   token ids that end generation
    n_ctx           context window (max tokens the cache can hold)
    n_cached        tokens currently in the cache
    tokenizer       encode/decode (used for prompts and the shared-vocabulary check)

    Optional capabilities, used when present and never required:
    ``extend(tokens, *, last_only=True)`` returns only the last row (``extend_last`` falls
    back to the full pass and slices), and ``cached_tokens`` lists the ids in the cache (lets
    a new prompt reuse a shared prefix).
    """

    vocab_size: int
    eos_token_ids: frozenset[int]
    n_ctx: int

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def n_cached(self) -> int: ...

    def extend(self, tokens: Sequence[int]) -> torch.Tensor:
        """Append tokens to the cache in ONE batched forward pass.

        Returns float32 CPU logits [len(tokens), V]; row i is the next-token logits after
        tokens[i] (given everything cached before it).
        """
        ...

    def truncate(self, n_keep: int) -> None:
        """Drop cached positions >= n_keep (exact: no re-prefill, no approximation)."""
        ...


def supports_last_only(model: CausalLM) -> bool:
    """Whether the backend's ``extend`` takes the optional ``last_only`` keyword."""
    fn = getattr(model.extend, "__func__", model.extend)
    code = getattr(fn, "__code__", None)
    if code is not None:  # a Python function: read its parameter names (cheap, per round)
        return "last_only" in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    try:
        return "last_only" in inspect.signature(model.extend).parameters
    except (TypeError, ValueError):  # a builtin or C extension without a signature
        return False


def extend_last(model: CausalLM, tokens: Sequence[int]) -> torch.Tensor:
    """Extend the cache by ``tokens`` and return only the last logits row [1, V] (prefill and
    draft catch-up need nothing else). Backends that can skip the other rows (``last_only``)
    are asked to; the others run their ordinary pass and the last row is sliced off."""
    if supports_last_only(model):
        extend = cast(Callable[..., torch.Tensor], model.extend)
        return extend(tokens, last_only=True)  # [1, V]
    return model.extend(tokens)[-1:]  # [1, V]


def cached_prefix_len(model: CausalLM, tokens: Sequence[int]) -> int:
    """How many leading ``tokens`` the model already holds in its cache (0 when the backend
    does not report its cached token ids through an optional ``cached_tokens`` attribute)."""
    cached = getattr(model, "cached_tokens", None)
    if cached is None:
        return 0
    n = min(len(cached), len(tokens))
    i = 0
    while i < n and cached[i] == tokens[i]:
        i += 1
    return i


def reuse_prefix_len(model: CausalLM, tokens: Sequence[int]) -> int:
    """How many leading ``tokens`` the model's cache can start with without computing: a
    backend with an optional ``reuse_prefix(tokens)`` (earlier prompts' caches kept as
    snapshots) brings the best one in and says; otherwise what it holds now
    (``cached_prefix_len``). The cache may hold more; the caller truncates to the result."""
    reuse = getattr(model, "reuse_prefix", None)
    if callable(reuse):
        return int(reuse(tokens))
    return cached_prefix_len(model, tokens)


def check_extend_args(model: CausalLM, tokens: Sequence[int]) -> None:
    """Shared argument checks for ``extend`` implementations."""
    if len(tokens) == 0:
        raise ValueError("extend() needs at least one token")
    if model.n_cached + len(tokens) > model.n_ctx:
        raise ValueError(
            f"context window exceeded: {model.n_cached} cached + {len(tokens)} new > "
            f"n_ctx {model.n_ctx}"
        )
    for t in tokens:
        if not 0 <= int(t) < model.vocab_size:
            raise ValueError(f"token id {t} outside vocabulary of size {model.vocab_size}")


def check_truncate_args(model: CausalLM, n_keep: int) -> None:
    if not 0 <= n_keep <= model.n_cached:
        raise ValueError(f"truncate({n_keep}) outside 0..{model.n_cached} cached tokens")
