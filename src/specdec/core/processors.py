"""Row processors: what a request changes in a model's logits before the sampling transform
(a logit bias, repetition penalties, a grammar's mask of the tokens it allows), applied by
one function to the target's rows and to a draft model's rows alike.

A processor is a function of the context: the row for the position after ``c`` becomes
``P(c, logits(c))``. Plain decoding with a processor samples ``x_t`` from
``sampling(P(c_<t, logits(c_<t)))``; speculative decoding keeps exactly that distribution
when the target's K + 1 rows of a round are processed along the draft's path, row ``i`` with
the context ``context + path[:i]`` (not all of them with the round's starting context), and
the accept/reject walk then runs on those rows. The draft model's rows are processed the
same way as it drafts, which only raises acceptance: the walk is lossless for any draft
distribution the drafts were really sampled from.

The contract, which the round and the drafters rely on:
- ``rows(context, path, logits)`` with ``logits`` [len(path) + 1, V] returns the processed
  rows [len(path) + 1, V], row ``i`` for the context ``context + path[:i]``. It is a function
  of its arguments: calls may come in any order (the draft model's steps, then the target's
  rows of the same round, then the next round after a rollback); an implementation may keep
  state to make the next call cheap (a grammar matcher synced by common prefix) but never
  lets it change a result. Rows after the first ``path`` token that ``legal_prefix`` cuts
  are never used (their context cannot occur), and may hold anything finite.
- ``legal_prefix(context, path)`` is how many leading tokens of ``path`` are possible at all
  (a grammar's mask allows them; len(path) for processors that forbid nothing), so that a
  drafter without probabilities (suffix, prediction, n-gram) has its impossible drafts cut
  before the target pass instead of paying to verify them.
- Every processed row keeps at least one finite logit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from specdec.errors import ConfigError


class RowProcessor(Protocol):
    """Changes logit rows as a function of the context before each (module docstring)."""

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        """logits [len(path) + 1, V] -> processed rows [len(path) + 1, V]."""
        ...

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        """How many leading tokens of ``path`` may follow ``context`` at all."""
        ...


def process_rows(
    processor: RowProcessor | None,
    context: Sequence[int],
    path: Sequence[int],
    logits: torch.Tensor,  # [len(path) + 1, V]
) -> torch.Tensor:
    """The rows as ``processor`` makes them (the same tensor without one)."""
    if processor is None:
        return logits
    assert logits.shape[0] == len(path) + 1, "one row per path prefix"
    return processor.rows(context, path, logits)


def legal_prefix(
    processor: RowProcessor | None, context: Sequence[int], path: Sequence[int]
) -> int:
    """How many leading tokens of ``path`` the processor allows (all without one)."""
    return len(path) if processor is None else processor.legal_prefix(context, path)


class ProcessorChain:
    """Several processors applied in order (each to the rows the one before it made); a
    path is legal as far as every processor allows it."""

    def __init__(self, processors: Sequence[RowProcessor]) -> None:
        self.processors = tuple(processors)

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        for p in self.processors:
            logits = p.rows(context, path, logits)
        return logits

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        n = len(path)
        for p in self.processors:
            n = min(n, p.legal_prefix(context, path[:n]))
        return n


def chain(processors: Sequence[RowProcessor | None]) -> RowProcessor | None:
    """One processor doing what ``processors`` do in order (None when there is none)."""
    present = [p for p in processors if p is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else ProcessorChain(present)


# OpenAI's bound on a logit bias value
MAX_BIAS = 100.0


class LogitBias:
    """OpenAI's ``logit_bias``: a fixed value added to the logits of given token ids, the
    same in every row (it does not depend on the context). Values in [-100, 100]; -100
    makes a token practically impossible without forbidding it (it stays a legal draft)."""

    def __init__(self, bias: Mapping[int, float], vocab_size: int) -> None:
        ids: list[int] = []
        values: list[float] = []
        for tok, value in bias.items():
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
                raise ConfigError(f"logit_bias: token id {tok!r} is outside 0..{vocab_size - 1}")
            v = float(value)
            if not -MAX_BIAS <= v <= MAX_BIAS:  # NaN fails too
                raise ConfigError(
                    f"logit_bias: value {value!r} for token {tok} is outside [-100, 100]"
                )
            ids.append(tok)
            values.append(v)
        self.ids = torch.tensor(ids, dtype=torch.long)  # [B]
        self.values = torch.tensor(values, dtype=torch.float32)  # [B]

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        if self.ids.numel() == 0:
            return logits
        out = logits.to(torch.float32).clone()  # [n, V]
        out[:, self.ids] += self.values
        return out

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        return len(path)


# OpenAI's bounds on presence_penalty / frequency_penalty, and ours on repetition_penalty
MAX_PENALTY = 2.0
MAX_REPETITION = 2.0


def check_penalties(presence: float, frequency: float, repetition: float) -> None:
    """The penalties' ranges (ConfigError naming the bad one): presence and frequency in
    [-2, 2] as OpenAI takes them, repetition in (0, 2] (1 disables it)."""
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if not -MAX_PENALTY <= value <= MAX_PENALTY:  # NaN fails too
            raise ConfigError(f"{name} must be in [-2, 2], got {value}")
    if not 0.0 < repetition <= MAX_REPETITION:
        raise ConfigError(f"repetition_penalty must be in (0, 2], got {repetition}")


class Penalties:
    """Repetition penalties as vLLM applies them: ``presence`` (subtracted once from the
    logit of every token the output holds so far) and ``frequency`` (subtracted once per
    occurrence) count the generated tokens only (``context[prompt_len:]``);
    ``repetition`` (a logit > 0 divided by it, one <= 0 multiplied) applies to every token
    of the prompt or the output. Row ``i`` counts ``context + path[:i]``, so the rows of a
    round are penalised as plain decoding would penalise each position.

    The counts of the last context seen are kept and moved to the next one by the tokens
    that differ (a rollback subtracts, new tokens add), so a call costs the rows, not the
    context's length."""

    def __init__(
        self,
        prompt_len: int,
        vocab_size: int,
        *,
        presence: float = 0.0,
        frequency: float = 0.0,
        repetition: float = 1.0,
    ) -> None:
        check_penalties(presence, frequency, repetition)
        self.prompt_len = int(prompt_len)
        self.vocab_size = int(vocab_size)
        self.presence = float(presence)
        self.frequency = float(frequency)
        self.repetition = float(repetition)
        self._seen: list[int] = []  # the context the counts below are of
        self._out = torch.zeros(vocab_size, dtype=torch.float32)  # [V] generated counts
        self._all = torch.zeros(vocab_size, dtype=torch.float32)  # [V] prompt + generated

    @property
    def active(self) -> bool:
        return self.presence != 0.0 or self.frequency != 0.0 or self.repetition != 1.0

    def _move(self, tokens: Sequence[int], position: int, sign: float) -> None:
        """Add (sign 1) or remove (sign -1) ``tokens`` found at ``position`` onwards."""
        if not tokens:
            return
        ids = torch.tensor([int(t) for t in tokens], dtype=torch.long)  # [n]
        ones = torch.full((len(tokens),), sign, dtype=torch.float32)
        self._all.index_add_(0, ids, ones)
        first_out = max(0, self.prompt_len - position)  # the tokens past the prompt
        if first_out < len(tokens):
            self._out.index_add_(0, ids[first_out:], ones[first_out:])

    def _sync(self, context: Sequence[int]) -> None:
        """Make the counts those of ``context``."""
        seen = self._seen
        n = min(len(seen), len(context))
        common = 0
        if n:
            a = torch.tensor(seen[:n], dtype=torch.long)
            b = torch.tensor([int(t) for t in context[:n]], dtype=torch.long)
            diff = torch.nonzero(a != b)
            common = int(diff[0]) if diff.numel() else n
        self._move(seen[common:], common, -1.0)
        del seen[common:]
        new = [int(t) for t in context[common:]]
        self._move(new, common, 1.0)
        seen.extend(new)

    def _penalise(self, row: torch.Tensor, out: torch.Tensor, seen: torch.Tensor) -> None:
        """Penalise one row [V] in place, given the output counts and the seen counts [V]."""
        if self.repetition != 1.0:
            hit = seen > 0
            row.copy_(
                torch.where(
                    hit & (row > 0),
                    row / self.repetition,
                    torch.where(hit, row * self.repetition, row),
                )
            )
        if self.frequency != 0.0:
            row.sub_(self.frequency * out)
        if self.presence != 0.0:
            row.sub_(self.presence * (out > 0).to(torch.float32))

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        if not self.active:
            return logits
        self._sync(context)
        out_rows = logits.to(torch.float32).clone()  # [n, V]
        out, seen = self._out.clone(), self._all.clone()
        position = len(context)
        for i in range(out_rows.shape[0]):
            self._penalise(out_rows[i], out, seen)
            if i < len(path):
                tok = int(path[i])
                seen[tok] += 1.0
                if position + i >= self.prompt_len:
                    out[tok] += 1.0
        return out_rows

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        return len(path)
