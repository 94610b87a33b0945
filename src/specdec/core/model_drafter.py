"""A drafter backed by a (small) causal LM with its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.core.drafter import Draft
from specdec.core.model import CausalLM, extend_last
from specdec.core.processors import RowProcessor, process_rows
from specdec.core.sampling import SamplingConfig, logits_to_probs, sample
from specdec.core.vocab import check_vocab_sizes, fit_logits
from specdec.errors import ConfigError


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def check_window(window: object, draft_n_ctx: int | None = None) -> int | None:
    """``window`` as a draft window (None: none), or a ConfigError: an int >= 1, and below
    the draft model's context window when that is known (the drafts need room after it)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"the draft window must be an integer >= 1, got {window!r}")
    if draft_n_ctx is not None and window >= draft_n_ctx:
        raise ConfigError(
            f"the draft window ({window}) must be smaller than the draft model's context "
            f"window ({draft_n_ctx}), which also holds the drafts"
        )
    return window


class ModelDrafter:
    """Samples K tokens autoregressively from a draft model, with the same sampling
    transform as the target. The draft cache is kept equal to the accepted context: on each
    call it is truncated to the longest prefix shared with the new context (dropping rejected
    drafts) and extended with what it has not seen yet (catching up on the last accepted draft
    token and the target's correction in one batched call).

    ``vocab_size`` is the target's vocabulary size when it differs from the draft's by
    padding (``core.vocab``): rows are fitted to it (the q rows then have the target's
    width), and a context holding an id the draft model lacks gets no drafts.

    ``window`` (None: the whole context) lets the draft model see only the last ``window``
    tokens: its cache holds ``context[offset:]`` (the *view*), with ``offset`` set at prefill
    to ``max(0, len(context) - window)``, and everything above (the common-prefix sync, the
    vocabulary check) works on the view. When the view and a round's drafts would overflow
    the draft model's own ``n_ctx``, the offset is re-based so that the view is again the
    last ``window`` tokens (one re-prefill of ``window`` tokens, counted in ``rebases``).
    The target verifies every draft, so the output does not depend on the window (lossless);
    only the acceptance rate can."""

    def __init__(
        self,
        model: CausalLM,
        name: str = "model",
        vocab_size: int | None = None,
        *,
        window: int | None = None,
    ) -> None:
        self.model = model
        self.name = name
        self.vocab_size = model.vocab_size if vocab_size is None else vocab_size
        self.window = check_window(window, model.n_ctx)
        # the target's vocabulary: equal, or padding (at most MAX_VOCAB_PAD apart)
        check_vocab_sizes(model.vocab_size, self.vocab_size)
        self._fed: list[int] = []  # tokens whose keys/values are in the draft cache
        self._offset = 0  # the view is context[_offset:] (always 0 without a window)
        self.rebases = 0  # slides of the window in the current generation

    def _known(self, context: Sequence[int]) -> int:
        """How many leading context tokens the draft model can take (all of them unless the
        target's vocabulary is larger and the context holds one of its extra ids)."""
        if self.vocab_size <= self.model.vocab_size:
            return len(context)
        limit = self.model.vocab_size
        return next((i for i, t in enumerate(context) if t >= limit), len(context))

    def _view(self, context: Sequence[int]) -> Sequence[int]:
        """The part of the context the draft model caches (all of it without a window)."""
        return context[self._offset :] if self._offset else context

    @property
    def n_ctx(self) -> int | None:
        """How many tokens a generation may hold as far as this drafter is concerned: the
        draft model's context window, or None (no bound) with a window, which slides."""
        return self.model.n_ctx if self.window is None else None

    @property
    def offset(self) -> int:
        """Where the view starts in the context (0 without a window)."""
        return self._offset

    def report(self) -> dict[str, int]:
        """What a result records about this drafter: the window and the generation's
        re-bases when there is a window, nothing otherwise."""
        if self.window is None:
            return {}
        return {"draft_window": self.window, "draft_rebases": self.rebases}

    def reset(self) -> None:
        """Start a new generation. Cached positions the model reports (``cached_tokens``) are
        kept so that a prompt sharing a prefix with the last one is not processed again."""
        self._offset = 0
        self.rebases = 0
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

    def _slide(self, context: Sequence[int], k: int) -> int:
        """With a window: re-base the view when it and k more tokens (the drafts, one to
        spare) would overflow the draft model; return the drafts that fit after the view."""
        assert self.window is not None
        n_ctx = self.model.n_ctx
        if len(context) - self._offset + k + 1 > n_ctx:
            keep = max(1, min(self.window, n_ctx - k - 1))
            self._offset = len(context) - keep
            self.rebases += 1
        # the cache takes the view and the first k - 1 drafts
        return min(k, n_ctx - (len(context) - self._offset) + 1)

    def prefill(self, context: Sequence[int]) -> None:
        if self.window is not None:
            self._offset = max(0, len(context) - self.window)
        view = self._view(context)
        view = view[: self._known(view)]
        if view:
            self._sync(view, keep_last=False)

    def rollback(self, context: Sequence[int]) -> None:
        common = _common_prefix(self._fed, self._view(context))
        if common < len(self._fed):
            self.model.truncate(common)
            del self._fed[common:]

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        if k > 0 and self.window is not None:
            k = self._slide(context, k)
        view = self._view(context)
        if k <= 0 or self._known(view) < len(view):
            return Draft([], None)  # nothing asked, or an id the draft model cannot take
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        logits = self._sync(view, keep_last=True)
        assert logits is not None
        for i in range(k):
            row = fit_logits(logits, self.vocab_size)[None]  # [1, V target]
            if processor is not None:  # the row after context + the drafts so far
                row = process_rows(processor, [*context, *tokens], [], row)
            q = logits_to_probs(row[0], sampling)  # [V target]
            tok = sample(q, generator)
            tokens.append(tok)
            rows.append(q)
            if i + 1 < k:
                logits = self.model.extend([tok])[-1]
                self._fed.append(tok)
        return Draft(tokens, torch.stack(rows))  # probs [K, V]
