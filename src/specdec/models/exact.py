"""Exact (batch-invariant) numerics: a token's logits must not depend on how many tokens share
its forward pass.

Speculative decoding scores K + 1 tokens in one pass where plain decoding scores one. The
accept/reject rule keeps the output distribution the one the verify passes compute; the output
is the *plain* decoder's, bit for bit, only when every row of a K + 1-token pass equals the row
a one-token pass gives for the same context. ``check_rows_exact`` tests exactly that on a
loaded model: one pass over ``n`` tokens against ``n`` one-token passes from the same cached
prefix, compared bitwise (no tolerance). Backends that claim exact numerics run it at load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.core.model import CausalLM, extend_last
from specdec.errors import SpecdecError

# Enough rows to reach every batched kernel that ggml's CPU backend switches to by row count
# (llamafile sgemm from 2 rows, the repack gemm from 4, the tiled K-quant path from 8), and
# a pass as long as the loop's longest (a draft of 64: 65 rows; flash attention's tiled path
# starts at 64 query rows); and an even size, which ARM's i8mm kernels multiply in row pairs
# (two-row vec_dot, summing in another order than one row), so that pairing is seen too.
SELF_CHECK_ROWS = (8, 9, 65)


class NotExactError(SpecdecError):
    """A model asked to run exact numerics scores a token differently inside a batch."""


@dataclass(frozen=True)
class RowCheck:
    """One pass over ``n`` tokens against ``n`` one-token passes (same cached prefix)."""

    n: int
    context: int  # tokens cached before the compared tokens
    max_abs: float  # max |logit difference| over rows x vocabulary (0.0 when exact)
    first_row: int | None  # the first row that differs (None when every row is identical)

    @property
    def exact(self) -> bool:
        return self.first_row is None


def compare_rows(batched: torch.Tensor, single: torch.Tensor, *, context: int) -> RowCheck:
    """Bitwise comparison of a pass's rows [n, V] with the one-token rows [n, V]."""
    assert batched.shape == single.shape, (batched.shape, single.shape)
    same = torch.eq(batched, single).all(dim=-1)  # [n]
    differing = (~same).nonzero().flatten().tolist()
    diff = (batched.double() - single.double()).abs()
    return RowCheck(
        n=int(batched.shape[0]),
        context=context,
        max_abs=float(diff.max()) if diff.numel() else 0.0,
        first_row=int(differing[0]) if differing else None,
    )


def check_rows_exact(
    model: CausalLM,
    context: Sequence[int],
    tokens: Sequence[int],
    ns: Sequence[int] | None = None,
) -> list[RowCheck]:
    """Prefill ``context`` once, score ``tokens`` one per pass, then, for each n in ``ns``
    (default: all of them at once), roll back and score the first n tokens in one pass; each
    pass's rows are compared bitwise with the one-token rows. The cache is emptied afterwards.
    """
    ns = [len(tokens)] if ns is None else [int(n) for n in ns]
    if not context or not ns or min(ns) < 1 or max(ns) > len(tokens):
        raise ValueError("the row check needs a context and pass sizes within the tokens")
    if model.n_cached:
        model.truncate(0)
    extend_last(model, list(context))
    base = model.n_cached
    toks = [int(t) for t in tokens[: max(ns)]]
    single = torch.cat([model.extend([t]) for t in toks])  # [max n, V]
    checks = []
    for n in ns:
        model.truncate(base)
        batched = model.extend(toks[:n])  # [n, V]
        checks.append(compare_rows(batched, single[:n], context=base))
    model.truncate(0)
    return checks


def self_check(model: CausalLM, label: str) -> RowCheck:
    """The load-time check of a model that claims exact numerics: passes of each size in
    ``SELF_CHECK_ROWS`` against one-token passes after a short context; ``NotExactError`` on
    any bit of difference (the first pass that differs is reported)."""
    ids = model.tokenizer.encode(
        "Exact numerics: the same logits whatever the pass size. 0 1 2 3 4 5 6 7 8 9",
        add_special_tokens=False,
    )
    need = 3 + max(SELF_CHECK_ROWS)
    ids = [i % model.vocab_size for i in (ids * (need // max(1, len(ids)) + 1))[:need]]
    checks = check_rows_exact(model, ids[:3], ids[3:], ns=SELF_CHECK_ROWS)
    check = next((c for c in checks if not c.exact), checks[-1])
    if not check.exact:
        raise NotExactError(
            f"{label} is not batch-invariant on this build and machine: row {check.first_row} "
            f"of a {check.n}-token pass differs from a one-token pass by up to "
            f"{check.max_abs:.3g} (run without exact numerics, or see docs/exact-numerics.md; "
            "ggml reads its switches once per process, so a model on default numerics that ran "
            "earlier in this process has the same effect: load exact models first)"
        )
    return check
