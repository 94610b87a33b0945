"""Deliberate faults, to show that the certificate can fail (a check that cannot fail shows
nothing). Used by the tests and by ``specdec certify --inject-fault``.

- ``injected_fault(name)``: temporarily replaces one function of ``specdec.rejection`` (the
  real walk then misbehaves everywhere it is used: Level 1, ``generate``); restored on exit.
- ``BatchVariantLM``: a model wrapper whose logits change with the batch shape, like a
  quantized backend's kernels, so batch-invariance effects can be produced on mock models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from specdec import rejection
from specdec.errors import ConfigError
from specdec.models.base import CausalLM, Tokenizer, extend_last


def _residual_is_p(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Bug: after a rejection, sample from p instead of norm(max(0, p - q))."""
    return p / float(p.sum())


def _always_accept(p_x: float, q_x: float) -> float:
    """Bug: every draft token is accepted."""
    return 1.0


FAULTS: Mapping[str, tuple[str, Callable[..., Any]]] = MappingProxyType(
    {
        "residual-is-p": ("residual_distribution", _residual_is_p),
        "always-accept": ("acceptance_probability", _always_accept),
    }
)


@contextmanager
def injected_fault(name: str | None) -> Iterator[None]:
    """Within the block, ``specdec.rejection`` has the named fault (None: no fault)."""
    if name is None:
        yield
        return
    if name not in FAULTS:
        raise ConfigError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    attr, replacement = FAULTS[name]
    original = getattr(rejection, attr)
    setattr(rejection, attr, replacement)
    try:
        yield
    finally:
        setattr(rejection, attr, original)


class BatchVariantLM:
    """Wraps a CausalLM; a pass over n > 1 tokens returns logits plus a deterministic
    perturbation in [-scale, scale] that depends on the pass size n and the absolute position
    (and, with row_dependent=True, also on the row's index within the pass), like kernels
    chosen by batch size. Single-token passes are unchanged; the cache is unaffected."""

    def __init__(
        self, model: CausalLM, scale: float, seed: int = 0, *, row_dependent: bool = False
    ) -> None:
        self.model = model
        self.scale = float(scale)
        self.seed = int(seed)
        self.row_dependent = row_dependent
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

    def perturbation(self, n: int, row: int, position: int) -> torch.Tensor:
        """The perturbation [V] added to row ``row`` of an n-token pass at ``position``."""
        g = torch.Generator(device="cpu")
        r = row if self.row_dependent else 0
        g.manual_seed((self.seed * 1_000_003 + n * 10_007 + r * 101 + position * 7) % (2**62))
        return self.scale * (torch.rand(self.vocab_size, generator=g) * 2 - 1)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        start = self.model.n_cached
        out = extend_last(self.model, tokens) if last_only else self.model.extend(tokens)
        n = len(tokens)
        if n == 1 or self.scale == 0.0:
            return out
        rows = [self.perturbation(n, i, start + i) for i in range(n - out.shape[0], n)]
        return out + torch.stack(rows)
