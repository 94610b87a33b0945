"""Suffix drafts where the context has a match, a model's drafts where it has none.

The suffix drafter is asked first; only when it proposes nothing does the wrapped
``ModelDrafter`` draft (with at most ``model_max_k`` tokens, since a model draft's best K is
usually smaller than a free draft's). The model's cache is kept lazily: while suffix drafts
carry the rounds it is not touched, and the first model round catches up on everything
accepted since its last call in one batched ``extend`` (ModelDrafter's own sync). ``reset``,
``prefill`` and ``rollback`` go to both drafters, so the model's cache always holds a prefix
of the accepted context (the loop's invariant, docs/architecture.md). Where the model's
context window is smaller than the target's, the model drafts less, and nothing once the
context fills it (suffix drafts go on), unless the model drafter has a ``window``: then it
sees only the last ``window`` tokens, slides on its own and bounds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.core.drafter import Draft
from specdec.core.model_drafter import ModelDrafter
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError


class HybridDrafter:
    """``SuffixDrafter`` first, ``ModelDrafter`` where the suffix drafter has nothing.

    Counters: ``suffix_rounds`` / ``model_rounds`` count the proposals each source made
    (a round where neither drafted counts in neither)."""

    def __init__(
        self,
        suffix: SuffixDrafter,
        model: ModelDrafter,
        *,
        model_max_k: int | None = None,
        name: str | None = None,
    ) -> None:
        if model_max_k is not None and model_max_k < 0:
            raise ConfigError(f"model_max_k must be >= 0, got {model_max_k}")
        self.suffix = suffix
        self.model = model
        self.model_max_k = model_max_k
        self.name = name or f"hybrid({suffix.name}+{model.name})"
        self.suffix_rounds = 0
        self.model_rounds = 0
        self.last_source = "none"  # "suffix" | "model" | "none", of the latest proposal

    def reset(self) -> None:
        self.suffix.reset()
        self.model.reset()
        self.suffix_rounds = 0
        self.model_rounds = 0
        self.last_source = "none"

    @property
    def window(self) -> int | None:
        """The model drafter's window (None: it sees the whole context)."""
        return self.model.window

    def report(self) -> dict[str, int]:
        """What a result records about the drafter (the model drafter's window, if any)."""
        return self.model.report()

    def _model_bounded(self) -> bool:
        """Whether the model drafter needs the whole context in its own window."""
        return self.model.window is None

    def prefill(self, context: Sequence[int]) -> None:
        self.suffix.prefill(context)
        if not self._model_bounded() or len(context) <= self.model.model.n_ctx:
            self.model.prefill(context)

    def rollback(self, context: Sequence[int]) -> None:
        self.suffix.rollback(context)
        self.model.rollback(context)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        self.last_source = "none"
        if k <= 0:
            return Draft([], None)
        draft = self.suffix.propose(context, k, sampling, generator, processor=processor)
        if len(draft):
            self.suffix_rounds += 1
            self.last_source = "suffix"
            return draft
        k_model = k if self.model_max_k is None else min(k, self.model_max_k)
        # the model's cache must hold the context and k_model - 1 drafts; the loop only
        # bounds the context by the target's window (and a plain ModelDrafter's), not by
        # a wrapped one's, so a full draft window means no model draft this round (a
        # windowed model drafter slides instead)
        if self._model_bounded():
            k_model = min(k_model, self.model.model.n_ctx - len(context) + 1)
        if k_model <= 0:
            return Draft([], None)
        draft = self.model.propose(context, k_model, sampling, generator, processor=processor)
        if len(draft):
            self.model_rounds += 1
            self.last_source = "model"
        return draft
