"""Verifiers: how one round turns the target's rows and the drafts into emitted tokens.

A verifier is a pure function of (target probability rows p [K+1, V], draft rows q [K, V] or
None for one-hot drafts, draft tokens x [K], generator) returning (n, y): the first n drafts
are kept and y is the token that follows them (a correction after a rejection, or the bonus
token from row K when all K drafts are kept). The round in ``core.round.speculative_round``
calls exactly one of them; everything else (drafting, the target pass, EOS / length cuts,
rollback) is shared.

- ``rejection_verifier``: the accept/reject rule (Leviathan et al. 2022; Chen et al. 2023).
  Lossless: the emitted tokens have the target's distribution whatever q is.
- ``greedy_verify``: the greedy case of both, straight from the logits: the drafts kept are
  the leading ones equal to their row's argmax (first index among ties, as
  ``sampling.logits_to_probs`` breaks them), then the argmax of the next row. It is what the
  rejection walk and exact matching give on one-hot rows, without building any row of
  probabilities (on a 151,936-token vocabulary that is ~2 ms a round here).
- ``exact_match_verifier``: ordinary sampling from the target's rows in the order they are
  reached: y_1 ~ p_1; while y_j equals draft x_j the next row belongs to y's context too, so
  y_{j+1} ~ p_{j+1}; it stops at the first mismatch (or after row K). No accept/reject walk is
  involved, so it is plain sampling scored in the speculative path's batch shapes (the
  certificate's shape-matched baseline). With greedy rows it keeps exactly what the rejection
  verifier keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from specdec.core.rejection import accept_reject
from specdec.core.sampling import sample


class Verifier(Protocol):
    """(p [K+1, V], q [K, V] | None, drafts [K], generator) -> (n_kept, next_token)."""

    def __call__(
        self,
        p: torch.Tensor,
        q: torch.Tensor | None,
        drafts: torch.Tensor,
        generator: torch.Generator,
        /,
    ) -> tuple[int, int]: ...


# The lossless accept/reject walk itself: (p [K+1, V], q [K, V] | None, drafts [K],
# generator) -> (n_kept, next_token) (``rejection.accept_reject``, no hop in between).
rejection_verifier: Verifier = accept_reject


def greedy_verify(logits: torch.Tensor, drafts: Sequence[int]) -> tuple[int, int]:
    """(n_kept, next_token) for greedy decoding, from logits [K+1, V] and drafts [K]."""
    best = torch.argmax(logits, dim=-1).tolist()  # [K+1] first maximal index per row
    n = 0
    while n < len(drafts) and int(drafts[n]) == best[n]:
        n += 1
    return n, int(best[n])


def keeps_argmax_when_greedy(verifier: Verifier) -> bool:
    """Whether ``greedy_verify`` is exactly what ``verifier`` does on greedy (one-hot) rows:
    true for the built-in verifiers (tested); a plugged-in verifier always gets its rows."""
    return verifier in (rejection_verifier, exact_match_verifier)


def exact_match_verifier(
    p: torch.Tensor,  # [K+1, V] target rows
    q: torch.Tensor | None,  # unused: plain sampling does not look at the draft's rows
    drafts: torch.Tensor,  # [K] long
    generator: torch.Generator,
) -> tuple[int, int]:
    """Plain sampling row by row, kept while the samples equal the drafts."""
    k = int(drafts.numel())
    assert p.shape[0] == k + 1, "the target must score K + 1 positions"
    for j in range(k + 1):
        y = sample(p[j], generator)
        if j == k or y != int(drafts[j]):
            return j, y
    raise AssertionError("unreachable")  # pragma: no cover
