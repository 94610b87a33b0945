"""Small shared pieces of the certificates: statuses, a NaN-keeping maximum, where two outputs
first differ, number formatting, torch threads."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

PASS, FAIL, WARN, SKIPPED = "pass", "fail", "warn", "skipped"


def worst_status(statuses: Sequence[str]) -> str:
    """fail > warn > pass; skipped only when nothing else ran."""
    order = [FAIL, WARN, PASS]
    for s in order:
        if s in statuses:
            return s
    return SKIPPED


def worst(values: Sequence[float]) -> float:
    """The largest of ``values`` (0 for none), NaN when any is NaN: an aggregate of errors
    that must not lose one (Python's ``max`` drops a NaN that is not first)."""
    out = 0.0
    for v in values:
        if math.isnan(v):
            return math.nan
        out = max(out, v)
    return out


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where two sequences differ (the shorter length when one is a prefix
    of the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with n torch intra-op threads, restoring the previous number after.

    Levels 1-2 work on tiny tensors, where a second thread only adds synchronisation (20x
    slower on a busy 2-core machine, measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
