"""The drafter interface."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig


@dataclass
class Draft:
    """Proposed tokens [K'] (K' <= the K asked for) and the rows q_i they were sampled from
    [K', V], or None for drafters without probabilities (treated as one-hot q). ``source``
    tags where a drafter that combines several took the tokens from (e.g. "prediction"); the
    round records it."""

    tokens: list[int]
    probs: torch.Tensor | None
    source: str | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    """Proposes continuations of a context. Stateful drafters sync themselves to ``context``
    on each call (the context is the accepted text so far, so rejected drafts are dropped)."""

    name: str

    def reset(self) -> None:
        """Forget all state (a new generation starts)."""
        ...

    def prefill(self, context: Sequence[int]) -> None:
        """Optionally process a prompt prefix ahead of the first round."""
        ...

    def rollback(self, context: Sequence[int]) -> None:
        """Drop any state beyond the accepted ``context`` (rejected drafts)."""
        ...

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        """Up to k tokens continuing ``context``, with their q rows when available. A
        drafter that samples from rows applies ``processor`` to them as the target's rows
        are (``core.processors``); a drafter without rows may ignore it (the round cuts
        the drafts it rules out). Either way the output stays the target's."""
        ...
