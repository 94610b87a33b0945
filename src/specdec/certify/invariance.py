"""Batch-invariance probe: how much do a model's logits depend on how many positions are
scored in one pass?

For each prompt the model is prefilled once; a continuation c_1..c_N (the model's own greedy
tokens, i.e. realistic positions) is then scored one token per pass, and, after truncate()
back to the same cached prefix, n tokens in ONE pass for each n (``core.rows.probe_rows``:
the model work; the numbers are made here from the rows it returns). Row i of the batched pass and
the i-th one-at-a-time row have the same context, so any difference is the backend's batch
(shape) dependence. Also measured: whether truncate() itself is exact (rescoring c_1 alone
after the rollback), argmax flips, and the TV distance between the two softmax rows (T = 1).

A flip of the greedy token needs a top-2 logit gap below twice the largest logit difference,
so ``tie_threshold`` = 2 * max |diff| (``TIE_FACTOR``) is what Level 3 uses to call a
divergence a near-tie.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from specdec.core.model import CausalLM
from specdec.core.rows import probe_rows
from specdec.errors import ConfigError
from specdec.stats.thresholds import TIE_FACTOR

from .common import worst

DEFAULT_NS: tuple[int, ...] = (2, 5, 9)


@dataclass
class InvarianceRow:
    """Batched (n positions per pass) vs one-at-a-time scoring, over all prompts."""

    n: int
    rows: int  # positions compared
    max_abs: float  # max |logit difference| over rows x vocabulary
    median_abs: float
    p99_abs: float
    argmax_flips: int
    flip_rate: float
    tv_max: float  # max TV(softmax(batched row), softmax(single row))
    tv_mean: float
    row_offset_max_abs: float  # same pass size and context, different row index in the pass


@dataclass
class InvarianceResult:
    model: str
    n_prompts: int
    ns: list[int]
    per_n: list[InvarianceRow]
    rollback_max_abs: float  # rescoring after truncate() vs the first scoring, same shape
    seconds: float
    prompt_tokens: list[int] = field(default_factory=list)

    @property
    def max_abs(self) -> float:
        return worst([r.max_abs for r in self.per_n])

    @property
    def row_offset_max_abs(self) -> float:
        return worst([r.row_offset_max_abs for r in self.per_n])

    @property
    def argmax_flips(self) -> int:
        return sum(r.argmax_flips for r in self.per_n)

    @property
    def tie_threshold(self) -> float:
        """Top-2 gaps at or below this can flip between batched and sequential scoring; 0
        (no near-ties: every flip is a bug) when the probe measured no finite difference
        (a backend with inf or NaN logits would otherwise excuse every flip)."""
        eps = self.max_abs
        return TIE_FACTOR * eps if math.isfinite(eps) else 0.0

    @property
    def batch_invariant(self) -> bool:
        return self.max_abs == 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            max_abs=self.max_abs,
            row_offset_max_abs=self.row_offset_max_abs,
            argmax_flips=self.argmax_flips,
            tie_threshold=self.tie_threshold,
            batch_invariant=self.batch_invariant,
        )
        return d

    def to_markdown(self) -> str:
        lines = [
            f"Batch invariance of `{self.model}` ({self.n_prompts} prompts; one pass of n "
            "tokens vs n passes of 1 token from the same cached prefix):",
            "",
            "| n | rows | max abs diff | median | p99 | argmax flips | max TV | mean TV "
            "| row-index max diff |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.per_n:
            lines.append(
                f"| {r.n} | {r.rows} | {r.max_abs:.3g} | {r.median_abs:.3g} | {r.p99_abs:.3g} "
                f"| {r.argmax_flips} ({r.flip_rate:.1%}) | {r.tv_max:.3g} | {r.tv_mean:.3g} "
                f"| {r.row_offset_max_abs:.3g} |"
            )
        lines += [
            "",
            f"Rollback (truncate then rescore, same shape): max abs diff "
            f"{self.rollback_max_abs:.3g}. Near-tie threshold (2 x max diff): "
            f"{self.tie_threshold:.3g}.",
        ]
        return "\n".join(lines)


def _softmax64(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.double(), dim=-1)


def batch_invariance(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    *,
    ns: Sequence[int] = DEFAULT_NS,
    label: str = "model",
) -> InvarianceResult:
    """Run the probe on every prompt (token ids) for every n in ns (each n >= 2)."""
    ns = sorted({int(n) for n in ns})
    if not ns or ns[0] < 2:
        raise ConfigError(f"probe sizes must be >= 2, got {list(ns)}")
    if not prompts:
        raise ConfigError("the batch-invariance probe needs at least one prompt")
    t0 = time.perf_counter()
    diffs: dict[int, list[np.ndarray]] = {n: [] for n in ns}
    flips = dict.fromkeys(ns, 0)
    tvs: dict[int, list[float]] = {n: [] for n in ns}
    offsets = dict.fromkeys(ns, 0.0)
    rollback = 0.0
    probed = []  # the model work first, then the numbers
    for ids in prompts:
        probed.append(probe_rows(model, ids, ns))
    for scored, rb in probed:
        rollback = worst([rollback, rb])
        for n, (b, s, sh) in scored.items():
            offsets[n] = worst([offsets[n], float((b[1:] - sh[:-1]).abs().max())])
            diffs[n].append((b - s).abs().flatten().numpy())
            flips[n] += int((b.argmax(-1) != s.argmax(-1)).sum())
            tv = 0.5 * (_softmax64(b) - _softmax64(s)).abs().sum(-1)  # [n]
            tvs[n].extend(float(x) for x in tv)
    per_n = []
    for n in ns:
        d = np.concatenate(diffs[n])
        rows = len(tvs[n])
        per_n.append(
            InvarianceRow(
                n=n,
                rows=rows,
                max_abs=float(d.max()),
                median_abs=float(np.median(d)),
                p99_abs=float(np.quantile(d, 0.99)),
                argmax_flips=flips[n],
                flip_rate=flips[n] / rows,
                tv_max=max(tvs[n]),
                tv_mean=float(np.mean(tvs[n])),
                row_offset_max_abs=offsets[n],
            )
        )
    return InvarianceResult(
        model=label,
        n_prompts=len(prompts),
        ns=list(ns),
        per_n=per_n,
        rollback_max_abs=rollback,
        seconds=time.perf_counter() - t0,
        prompt_tokens=[len(p) for p in prompts],
    )
