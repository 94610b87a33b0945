"""Incremental detokenization: text pieces as tokens arrive, never a split character.

Decoding token by token is wrong for byte-level vocabularies (one character may span several
tokens, and a tokenizer may merge spaces across a token boundary), and re-decoding the whole
output every round costs O(n) per round. ``IncrementalDecoder`` decodes a short window: the
text of ids[prefix:] minus the text of ids[prefix:read] is what the new tokens added, held
back while it ends in an incomplete character (U+FFFD); then the window slides forward.

Tokenizers that offer a streaming decoder of their own (``stream_decoder()``: the transformers
backend's fast tokenizers give the ``tokenizers`` library's ``DecodeStream``) use it instead;
the window above is the fallback (llama.cpp tokenizers, mocks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdec.core.model import Tokenizer

StepDecoder = Callable[[int], "str | None"]
"""One token id in, the text it completes out (None while a character is incomplete)."""

_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Feed token ids with ``push``; it returns the new text that is safe to show."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # window start: ids before it are never decoded again
        self._read = 0  # ids up to here have had their text returned
        make = getattr(tokenizer, "stream_decoder", None)
        self._step: StepDecoder | None = make() if callable(make) else None
        self._shown: list[str] = []  # what the step decoder returned (to flush the rest)

    def push(self, tokens: Sequence[int]) -> str:
        """New text after appending ``tokens`` ("" while a character is incomplete)."""
        new = [int(t) for t in tokens]
        self.ids.extend(new)
        if self._step is not None:
            pieces = [p for p in map(self._step, new) if p]
            self._shown.extend(pieces)
            return "".join(pieces)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character is shown as U+FFFD)."""
        if self._step is not None:
            shown, full = "".join(self._shown), self.text  # one full decode, at the end
            rest = full[len(shown) :] if full.startswith(shown) else ""
            self._shown.append(rest)
            return rest
        return self._advance(final=True)

    @property
    def text(self) -> str:
        """The whole text so far (decoded from scratch: for checks, not the hot path)."""
        return self.tokenizer.decode(self.ids)

    def _advance(self, *, final: bool) -> str:
        if len(self.ids) == self._read:
            return ""
        before = self.tokenizer.decode(self.ids[self._prefix : self._read])
        after = self.tokenizer.decode(self.ids[self._prefix :])
        if not final and after.endswith(_REPLACEMENT):
            return ""  # wait for the rest of the character
        if not after.startswith(before):
            # the tokenizer re-rendered the window's start (rare): fall back to the full text
            # difference, which is always right
            full_before = self.tokenizer.decode(self.ids[: self._read])
            full_after = self.tokenizer.decode(self.ids)
            new = full_after[len(full_before) :]
        else:
            new = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        return new
