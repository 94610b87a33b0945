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

Controls (correct backends that must NOT fail against the shape-matched reference):
- ``noisy-numerics``: bf16-like logit noise that depends on the pass size, the row index and
  the position (``BatchVariantLM(row_dependent=True)``), deterministic like real kernels;
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

from specdec.core import rejection
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
BACKEND_FAULTS = ("wrong-rows", "stale-rollback", "position-after-truncate", "wrong-q")
CONTROLS = ("noisy-numerics",)
ALL_FAULTS = (*FAULTS, *BACKEND_FAULTS, *CONTROLS)


@contextmanager
def injected_fault(name: str | None) -> Iterator[None]:
    """Within the block, ``specdec.core.rejection`` has the named walk fault (None, a backend
    fault or a control: nothing is patched; ``fault_models`` wraps the models instead)."""
    if name is None or name in BACKEND_FAULTS or name in CONTROLS:
        yield
        return
    if name not in FAULTS:
        raise ConfigError(f"unknown fault {name!r}; known: {', '.join(ALL_FAULTS)}")
    attr, replacement = FAULTS[name]
    original = getattr(rejection, attr)
    setattr(rejection, attr, replacement)
    try:
        yield
    finally:
        setattr(rejection, attr, original)


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
    if name is None or name in ("residual-is-p", "always-accept"):
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
