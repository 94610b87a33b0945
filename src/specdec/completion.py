"""What a generation gives back as text: ``TextStream`` (text pieces as rounds are accepted,
stop strings applied, cancellable), the ``Completion`` it ends with (the text and the full
``GenerationResult``), and ``Comparison`` (one request decoded plainly and speculatively).

``specdec.api.Pair`` makes them; ``specdec.core.loop`` makes the rounds they read.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from specdec.core.detokenize import IncrementalDecoder
from specdec.core.loop import Generation
from specdec.core.result import GenerationResult, Round
from specdec.core.stops import StopMatcher


@dataclasses.dataclass
class Completion:
    """What ``Pair.generate`` returns: the text, and the full ``GenerationResult`` (token ids,
    rounds, acceptance by position, time split) as ``result``. ``str(c)`` is the text.

    The text ends right before the first stop string (``finish_reason`` "stop"); the
    end-of-sequence token ends the generation but adds no text. ``tokens`` are all the tokens
    generated, including those a stop string cut from the text."""

    text: str
    result: GenerationResult

    @property
    def tokens(self) -> list[int]:
        return self.result.tokens

    @property
    def finish_reason(self) -> str:
        """ "eos", "length", "context", "stop" (a stop string) or "cancelled"."""
        return self.result.finish_reason

    @property
    def stats(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (``GenerationResult.to_dict``)."""
        return self.result.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """``stats`` with the text."""
        return {**self.stats, "text": self.text}

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class Comparison:
    """What ``Pair.compare`` returns: one request decoded plainly (k=0) and as configured, on
    the same loaded models, one after the other; ``greedy``: the request was greedy (so
    the outputs must be identical where the numerics are exact)."""

    plain: Completion
    speculative: Completion
    greedy: bool = True

    @property
    def speedup(self) -> float:
        """Wall clock including prefill, per generated token: speculative / plain."""
        s, p = self.speculative.result, self.plain.result
        return s.e2e_tokens_per_second / p.e2e_tokens_per_second

    @property
    def decode_speedup(self) -> float:
        """Decode tokens/s (prefill excluded): speculative / plain."""
        return self.speculative.result.tokens_per_second / self.plain.result.tokens_per_second

    @property
    def identical(self) -> bool:
        """The same output: the same tokens, or the same text where both ended at a stop
        string (the tokens after a stop string are not output)."""
        s, p = self.speculative, self.plain
        if s.finish_reason == p.finish_reason == "stop":
            return s.text == p.text
        return s.tokens == p.tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "plain": self.plain.stats,
            "speculative": self.speculative.stats,
            "speedup": self.speedup,
            "decode_speedup": self.decode_speedup,
            "identical_output": self.identical,
            "text": self.speculative.text,
        }

    def report(self, label: str) -> list[str]:
        """For people: the stats line of each run (the speculative one under ``label``), then
        the speedups and whether the outputs are identical, with why where greedy ones differ."""
        p, s = self.plain.result, self.speculative.result
        why = ""
        if not self.identical and self.greedy:
            why = (
                " (a bug: exact numerics must give plain decoding's tokens)"
                if s.extra.get("exact")
                else " (a near-tie that llama.cpp's batched kernels flip: --exact makes "
                "speculative output plain decoding's, bit for bit)"
            )
        return [
            p.summary("plain"),
            s.summary(label),
            f"[specdec] speedup {self.speedup:.2f}x wall clock ({p.e2e_tokens_per_second:.2f} -> "
            f"{s.e2e_tokens_per_second:.2f} tok/s incl. prefill), decode {self.decode_speedup:.2f}x"
            f" ({p.tokens_per_second:.1f} -> {s.tokens_per_second:.1f} tok/s), on the same loaded "
            f"model; outputs identical: {'yes' if self.identical else 'no'}{why}",
        ]


@dataclasses.dataclass
class TextDelta:
    """The text one round added (possibly "": a character or a stop string is incomplete) and
    the round (None for the text released when the generation ends)."""

    text: str
    round: Round | None


class TextStream:
    """Iterate for text pieces as rounds are accepted (``deltas()`` for one entry per round);
    ``completion`` is set at the end (``run()`` drains the stream and returns it); ``cancel()``
    ends it between rounds. With stop strings, no text at or after the first stop string is
    ever yielded, and the generation ends at the round that completes it.

    ``on_end`` (``Pair``'s hold on its models) is called once, when the generation has ended
    (the last round, a stop string, ``cancel()``, an error) or the stream is garbage."""

    def __init__(
        self,
        generation: Generation,
        decoder: IncrementalDecoder,
        stops: Sequence[str] = (),
        hidden: frozenset[int] = frozenset(),
        on_end: Callable[[], object] | None = None,
    ) -> None:
        self.generation = generation
        # called at most once, whichever comes first: the end, or the stream's collection
        self._end = weakref.finalize(self, on_end) if on_end is not None else None
        self._decoder = decoder
        self._stops = StopMatcher(stops)
        self._hidden = hidden  # token ids that add no text (end-of-sequence)
        self._text: list[str] = []
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        for delta in self.deltas():
            if delta.text:
                yield delta.text

    def deltas(self) -> Iterator[TextDelta]:
        try:
            for rnd in self.generation:
                shown = [t for t in rnd.tokens if t not in self._hidden]
                piece = self._shown(self._stops.push(self._decoder.push(shown)))
                if self._stops.stopped:
                    self.generation.stop("stop")  # no further round runs
                yield TextDelta(piece, rnd)
        except GeneratorExit:  # the reader stopped reading: the generation may go on later
            raise
        except BaseException:  # the generation failed: it cannot go on
            self._ended()
            raise
        self._ended()  # every round has run: the models are free
        tail = "" if self._stops.stopped else self._stops.push(self._decoder.flush())
        tail = self._shown(tail + self._stops.flush())
        if tail:
            yield TextDelta(tail, None)
        result = self.generation.result
        assert result is not None
        if self._stops.stopped and result.finish_reason != "stop":  # found in the last text
            result = dataclasses.replace(result, finish_reason="stop")
        self.completion = Completion("".join(self._text), result)

    def _ended(self) -> None:
        if self._end is not None:
            self._end()

    def _shown(self, piece: str) -> str:
        self._text.append(piece)
        return piece

    def cancel(self) -> GenerationResult:
        """End the generation after the round in progress (finish_reason "cancelled"); the
        models are free for another generation then."""
        try:
            return self.generation.stop("cancelled")
        finally:
            self._ended()

    def run(self, on_text: Callable[[str], None] | None = None) -> Completion:
        """Drain the stream (each piece to ``on_text`` when given) and return the completion."""
        for piece in self:
            if on_text is not None:
                on_text(piece)
        assert self.completion is not None
        return self.completion
