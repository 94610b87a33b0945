"""Deliberate faults, to show that the certificate can fail (a check that cannot fail shows
nothing). Used by the tests and by ``specdec certify --inject-fault``.

Walk faults (``injected_fault(name)`` temporarily replaces one function of
``specdec.core.rejection``; the real walk then misbehaves everywhere it is used):
- ``residual-is-p``: after a rejection, sample from p instead of norm(max(0, p - q));
- ``always-accept``: every draft token is accepted;
- ``residual-is-p-after-first-round``: residual-is-p, but only from the second round of each
  sequence on (the first round is right: a test of the first tokens only cannot see it).

Backend faults (``fault_models(name, draft, target)`` wraps the loaded models; every one
must make Level 3 FAIL):
- ``wrong-rows``: multi-token passes return each row one position late (``WrongRowsLM``);
- ``stale-rollback``: truncate() keeps the first dropped entry in the cache
  (``StaleRollbackLM``);
- ``position-after-truncate``: after each partial truncate() the position ids drift by one
  (``PositionalLM(off_by_one=True)``);
- ``wrong-q``: the drafter samples from q but passes q^2 / sum(q^2) to the walk
  (``WrongQDrafter``).

Constraint faults (``injected_fault(name)`` replaces one function of the code that applies a
grammar; every one must make the constrained level FAIL):
- ``constraint-draft-only``: the round does not process the target's rows
  (``core.round.process_rows`` returns them as they are) while the draft model still masks
  its own: the target's rows keep tokens the grammar rules out;
- ``constraint-no-rollback``: the grammar processor's state is never rolled back
  (``GrammarProcessor._sync`` only consumes new tokens): after the draft model's drafts or
  rejected drafts, the masks are those of tokens the context no longer holds.

Controls (correct backends that must NOT fail against the shape-matched reference):
- ``noisy-numerics``: bf16-like logit noise that depends on the pass size, the row index and
  the position (``BatchVariantLM(row_dependent=True)``), deterministic like real kernels;
- ``constraint-target-only``: the draft model does not mask its rows
  (``core.model_drafter.process_rows`` returns them as they are), the target's rows are
  masked: lossless (the walk is exact for whatever q the drafts were sampled from; a ruled-out
  draft has p = 0 and is rejected), so the constrained level must PASS;
- ``PositionalLM(off_by_one=False)``: logits that depend on the absolute position, kept
  right across truncate().
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from specdec.constraints.processor import GrammarProcessor
from specdec.core import model_drafter, rejection
from specdec.core import round as core_round
from specdec.core.drafter import Draft, Drafter
from specdec.core.model import (
    CausalLM,
    check_extend_args,
    check_truncate_args,
    extend_last,
)
from specdec.core.model_drafter import ModelDrafter
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.errors import ConfigError
from specdec.models.wrapped import WrappedLM


def _residual_is_p(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Bug: after a rejection, sample from p instead of norm(max(0, p - q))."""
    return p / float(p.sum())


def _always_accept(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Bug: every draft token is accepted."""
    return torch.ones_like(p_x)


class _RoundClock:
    """Rounds proposed since the drafter's last reset (set by ``RoundCountingDrafter``)."""

    rounds = 0


_CLOCK = _RoundClock()
_correct_residual = rejection.residual_distribution


def _residual_is_p_after_first_round(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Bug: the residual is right in a sequence's first round, p from the second on."""
    if _CLOCK.rounds <= 1:
        return _correct_residual(p, q)
    return p / float(p.sum())


FAULTS: Mapping[str, tuple[str, Callable[..., Any]]] = MappingProxyType(
    {
        "residual-is-p": ("residual_distribution", _residual_is_p),
        "always-accept": ("acceptance_probabilities", _always_accept),
        "residual-is-p-after-first-round": (
            "residual_distribution",
            _residual_is_p_after_first_round,
        ),
    }
)


def _rows_unprocessed(
    processor: RowProcessor | None,
    context: Sequence[int],
    path: Sequence[int],
    logits: torch.Tensor,  # [len(path) + 1, V]
) -> torch.Tensor:
    """Bug (where it replaces ``process_rows``): the rows are not processed at all."""
    return logits


def _sync_without_rollback(self: GrammarProcessor, output: Sequence[int]) -> None:
    """Bug: the grammar's state only moves forward: the tokens of ``output`` past those it
    has seen are consumed, and tokens it has seen that ``output`` no longer holds (drafts,
    rejected drafts) stay in it."""
    for tok in output[len(self._seen) :]:
        self._push(int(tok))


# name -> (the object patched, its attribute, the replacement)
CONSTRAINT_PATCHES: Mapping[str, tuple[Any, str, Callable[..., Any]]] = MappingProxyType(
    {
        "constraint-draft-only": (core_round, "process_rows", _rows_unprocessed),
        "constraint-no-rollback": (GrammarProcessor, "_sync", _sync_without_rollback),
        "constraint-target-only": (model_drafter, "process_rows", _rows_unprocessed),
    }
)
BACKEND_FAULTS = ("wrong-rows", "stale-rollback", "position-after-truncate", "wrong-q")
CONSTRAINT_FAULTS = ("constraint-draft-only", "constraint-no-rollback")
CONTROLS = ("noisy-numerics", "constraint-target-only")
ALL_FAULTS = (*FAULTS, *BACKEND_FAULTS, *CONSTRAINT_FAULTS, *CONTROLS)
# what only the constrained level exercises (nothing else runs a grammar)
CONSTRAINED_ONLY = (*CONSTRAINT_FAULTS, "constraint-target-only")


def check_fault_levels(name: str | None, levels: Sequence[str]) -> None:
    """ConfigError for a constraint fault or control without the constrained level (the
    other levels run no grammar, so it would change nothing and the verdict would mislead)."""
    if name in CONSTRAINED_ONLY and "constrained" not in levels:
        raise ConfigError(
            f"the fault {name!r} acts on grammars, which only the constrained level runs: "
            "add constrained to --levels"
        )


@contextmanager
def injected_fault(name: str | None) -> Iterator[None]:
    """Within the block, the named walk fault (in ``specdec.core.rejection``) or constraint
    fault is in place (None, a backend fault or the noisy-numerics control: nothing is
    patched; ``fault_models`` wraps the models instead)."""
    if name is None or name in BACKEND_FAULTS or name == "noisy-numerics":
        yield
        return
    if name in CONSTRAINT_PATCHES:
        owner, attr, replacement = CONSTRAINT_PATCHES[name]
    elif name in FAULTS:
        owner, (attr, replacement) = rejection, FAULTS[name]
    else:
        raise ConfigError(f"unknown fault {name!r}; known: {', '.join(ALL_FAULTS)}")
    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, original)


class BatchVariantLM(WrappedLM):
    """Wraps a CausalLM; a pass over n > 1 tokens returns logits plus a deterministic
    perturbation in [-scale, scale] that depends on the pass size n and the absolute position
    (and, with row_dependent=True, also on the row's index within the pass), like kernels
    chosen by batch size. Single-token passes are unchanged; the cache is unaffected."""

    def __init__(
        self, model: CausalLM, scale: float, seed: int = 0, *, row_dependent: bool = False
    ) -> None:
        super().__init__(model)
        self.scale = float(scale)
        self.seed = int(seed)
        self.row_dependent = row_dependent

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


# ------------------------------------------------------------------ backend faults
class WrongRowsLM(WrappedLM):
    """Bug: a pass over n > 1 tokens returns row i - 1 in place of row i (row 0 twice), as an
    off-by-one in the gather of a batched kernel would. Single-token passes are right, so
    plain decoding is unaffected; every multi-token row is the previous position's."""

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        out = self.model.extend(tokens)  # [n, V]
        if len(tokens) > 1:
            out = torch.cat([out[:1], out[:-1]])  # [n, V]
        return out[-1:] if last_only else out


class StaleRollbackLM(WrappedLM):
    """Bug: truncate(n_keep) with 0 < n_keep < n_cached keeps the first dropped entry in the
    wrapped cache (an off-by-one crop), so later rows attend to a rejected token. The wrapper
    reports the positions it was asked to keep; truncate(0) is right."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__(model)
        self._ends: list[int] = []  # wrapped cache length after each of our positions

    @property
    def n_cached(self) -> int:
        return len(self._ends)

    def truncate(self, n_keep: int) -> None:
        check_truncate_args(self, n_keep)
        if n_keep == 0:
            self.model.truncate(0)
        elif n_keep < len(self._ends):
            self.model.truncate(min(self.model.n_cached, self._ends[n_keep - 1] + 1))
        del self._ends[n_keep:]

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend_args(self, tokens)
        start = self.model.n_cached
        out = extend_last(self.model, tokens) if last_only else self.model.extend(tokens)
        self._ends.extend(start + i + 1 for i in range(len(tokens)))
        return out


def _position_vector(seed: int, position: int, vocab: int, scale: float) -> torch.Tensor:
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + position * 7919) % (2**62))
    return scale * torch.randn(vocab, generator=g)  # [V]


class PositionalLM(WrappedLM):
    """Logits that depend on the absolute position: row at position t gets a fixed vector
    scale * N(0, 1)[V] seeded by t (a stand-in for position embeddings). Correct as is;
    with off_by_one=True, every partial truncate() (0 < n_keep < n_cached) makes the
    position ids of all later passes one larger (a bookkeeping bug that rollback exposes)."""

    def __init__(
        self, model: CausalLM, scale: float = 1.0, seed: int = 0, *, off_by_one: bool = False
    ) -> None:
        super().__init__(model)
        self.scale = float(scale)
        self.seed = int(seed)
        self.off_by_one = off_by_one
        self._drift = 0

    def truncate(self, n_keep: int) -> None:
        if n_keep == 0:
            self._drift = 0
        elif self.off_by_one and n_keep < self.model.n_cached:
            self._drift += 1
        self.model.truncate(n_keep)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        start = self.model.n_cached + self._drift
        out = (
            extend_last(self.model, tokens) if last_only else self.model.extend(tokens)
        )  # [n, V] or [1, V]
        n = len(tokens)
        rows = range(n - out.shape[0], n)
        add = [_position_vector(self.seed, start + i, self.vocab_size, self.scale) for i in rows]
        return out + torch.stack(add)


class WrongQDrafter(ModelDrafter):
    """Bug: samples each draft from q but hands the walk q^2 / sum(q^2) as "the" q (e.g. the
    row of another temperature than the one sampled from)."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        d = super().propose(context, k, sampling, generator, processor=processor)
        if d.probs is None:
            return d
        sq = d.probs.double() ** 2  # [K, V]
        return Draft(d.tokens, (sq / sq.sum(-1, keepdim=True)).float())


class RoundCountingDrafter:
    """A Drafter that forwards to another one and counts the rounds of the current sequence
    (for ``residual-is-p-after-first-round``)."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = getattr(inner, "model", None)

    def reset(self) -> None:
        _CLOCK.rounds = 0
        self.inner.reset()

    def prefill(self, context: Sequence[int]) -> None:
        self.inner.prefill(context)

    def rollback(self, context: Sequence[int]) -> None:
        self.inner.rollback(context)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        _CLOCK.rounds += 1
        return self.inner.propose(context, k, sampling, generator, processor=processor)


NOISY_SCALE = 0.05  # logit noise of the noisy-numerics control (the mocks' logits have sd 2)


def fault_models(
    name: str | None, draft: CausalLM | Drafter, target: CausalLM
) -> tuple[CausalLM | Drafter, CausalLM]:
    """The (draft, target) pair with the named backend fault or control applied (walk faults
    and None: unchanged, except that ``residual-is-p-after-first-round`` needs the drafter to
    count rounds)."""
    if name is None or name in ("residual-is-p", "always-accept", *CONSTRAINED_ONLY):
        return draft, target
    as_drafter: Drafter = ModelDrafter(draft) if isinstance(draft, CausalLM) else draft
    if name == "residual-is-p-after-first-round":
        return RoundCountingDrafter(as_drafter), target
    if name == "wrong-rows":
        return draft, WrongRowsLM(target)
    if name == "stale-rollback":
        return draft, StaleRollbackLM(target)
    if name == "position-after-truncate":
        return draft, PositionalLM(target, off_by_one=True)
    if name == "wrong-q":
        if not isinstance(draft, CausalLM):
            raise ConfigError("the wrong-q fault needs a draft model (it reports a wrong q)")
        return WrongQDrafter(draft), target
    if name == "noisy-numerics":
        return draft, BatchVariantLM(target, NOISY_SCALE, row_dependent=True)
    raise ConfigError(f"unknown fault {name!r}; known: {', '.join(ALL_FAULTS)}")
