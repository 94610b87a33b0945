"""A drafter backed by a (small) causal LM with its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import Draft
from specdec.models.base import CausalLM, extend_last
from specdec.models.vocab import fit_logits
from specdec.sampling import SamplingConfig, logits_to_probs, sample
from specdec.timing import Stopwatch


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelDrafter:
    """Samples K tokens autoregressively from a draft model, with the same sampling
    transform as the target. The draft cache is kept equal to the accepted context: on each
    call it is truncated to the longest prefix shared with the new context (dropping rejected
    drafts) and extended with what it has not seen yet (catching up on the last accepted draft
    token and the target's correction in one batched call).

    ``vocab_size`` is the target's vocabulary size when it differs from the draft's by
    padding (``models.vocab``): rows are fitted to it (the q rows then have the target's
    width), and a context holding an id the draft model lacks gets no drafts."""

    def __init__(self, model: CausalLM, name: str = "model", vocab_size: int | None = None) -> None:
        self.model = model
        self.name = name
        self.vocab_size = model.vocab_size if vocab_size is None else vocab_size
        self._fed: list[int] = []  # tokens whose keys/values are in the draft cache

    def _known(self, context: Sequence[int]) -> int:
        """How many leading context tokens the draft model can take (all of them unless the
        target's vocabulary is larger and the context holds one of its extra ids)."""
        if self.vocab_size <= self.model.vocab_size:
            return len(context)
        limit = self.model.vocab_size
        return next((i for i, t in enumerate(context) if t >= limit), len(context))

    @property
    def n_ctx(self) -> int:
        """The draft model's context window (a generation must fit in it too)."""
        return self.model.n_ctx

    def reset(self) -> None:
        """Start a new generation. Cached positions the model reports (``cached_tokens``) are
        kept so that a prompt sharing a prefix with the last one is not processed again."""
        cached = getattr(self.model, "cached_tokens", None)
        if cached is None:
            if self.model.n_cached:
                self.model.truncate(0)
            self._fed = []
        else:
            self._fed = list(cached)

    def _sync(self, context: Sequence[int], keep_last: bool) -> torch.Tensor | None:
        """Make the cache hold context (minus its last token if keep_last); return the logits
        row after the last fed token when something was fed."""
        limit = len(context) - 1 if keep_last else len(context)
        common = min(_common_prefix(self._fed, context), limit)
        if common < len(self._fed):
            self.model.truncate(common)
            del self._fed[common:]
        todo = list(context[common:])
        if not todo:
            return None
        logits = extend_last(self.model, todo)  # [1, V]
        self._fed.extend(int(t) for t in todo)
        return logits[-1]

    def prefill(self, context: Sequence[int]) -> None:
        context = context[: self._known(context)]
        if context:
            self._sync(context, keep_last=False)

    def rollback(self, context: Sequence[int]) -> None:
        common = _common_prefix(self._fed, context)
        if common < len(self._fed):
            self.model.truncate(common)
            del self._fed[common:]

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        stopwatch: Stopwatch,
    ) -> Draft:
        if k <= 0 or self._known(context) < len(context):
            return Draft([], None)  # nothing asked, or an id the draft model cannot take
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        with stopwatch.section("draft"):
            logits = self._sync(context, keep_last=True)
        assert logits is not None
        for i in range(k):
            with stopwatch.section("sampling"):
                q = logits_to_probs(fit_logits(logits, self.vocab_size), sampling)  # [V target]
                tok = sample(q, generator)
            tokens.append(tok)
            rows.append(q)
            if i + 1 < k:
                with stopwatch.section("draft"):
                    logits = self.model.extend([tok])[-1]
                self._fed.append(tok)
        return Draft(tokens, torch.stack(rows))  # probs [K, V]
