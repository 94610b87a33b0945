"""Log-probabilities of tokens, taken from logit rows a pass already computed (no extra pass).

Which distribution (``LogprobSpec.mode``):
- ``raw`` (the default, as vLLM's default ``logprobs_mode="raw_logprobs"``): the model's own
  next-token distribution, ``log_softmax`` of the target's logits before anything a request
  changes (logit bias, penalties, a grammar, temperature, top-k, top-p). It does not depend
  on the sampling settings, so it is what a likelihood evaluation and a near-tie analysis
  need.
- ``processed`` (vLLM's ``processed_logprobs``): the log of the distribution the token was
  drawn from: the processed rows (``core.processors``) after temperature, top-k and top-p; a
  greedy request's row is one-hot (0 for the argmax, -inf elsewhere). Tokens the row rules out
  have -inf, written ``NEG_INF_LOGPROB`` where a number must be finite (JSON).

Each row is computed on its own, the same way whatever the pass it came from (``row_logprob``
on a 1-D row), so that, so that with exact numerics, where
a row's logits are bit-identical whatever the number of tokens in its pass, a speculative
run's log-probabilities are bit-identical to plain decoding's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.errors import ConfigError

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
MODES = ("raw", "processed")
# what -inf is written as where a number must be finite (vLLM writes -9999.0 too)
NEG_INF_LOGPROB = -9999.0


@dataclass(frozen=True)
class LogprobSpec:
    """What to compute for each generated token: its log-probability, its rank, and the
    ``top`` most probable alternatives (0..20), under ``mode`` (module docstring)."""

    top: int = 0
    mode: str = "raw"

    def __post_init__(self) -> None:
        check_top(self.top, "top_logprobs")
        if self.mode not in MODES:
            raise ConfigError(f"logprobs_mode must be one of {', '.join(MODES)}, got {self.mode!r}")


def check_top(top: int, name: str) -> None:
    """``top`` is an int in 0..20, or a ConfigError naming ``name``."""
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ConfigError(f"{name} must be an integer in 0..{MAX_TOP_LOGPROBS}, got {top!r}")


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability under its row, its rank there (1 = most probable; ties
    share the better rank; 0 when not computed) and the row's ``top`` alternatives as (id,
    logprob), most probable first (ties by lower id)."""

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


def row_logprob(
    row: torch.Tensor, token: int, top: int, *, with_rank: bool = False
) -> TokenLogprob:
    """The log-probability of ``token`` under ``log_softmax(row)`` for one row [V] of
    logits (float32; -inf entries allowed, at least one finite), the top ``top`` alternatives
    and, ``with_rank``, its rank (else 0). The normaliser is ``m + log(sum(exp(x - m)))``
    with ``m`` the row's maximum, the exponentials in float32 and their sum in float64."""
    assert row.ndim == 1, "one row of logits"
    x = row.to(torch.float32)
    values, ids = torch.topk(x, max(1, min(top, x.shape[0])))  # [top] (no full sort)
    m = float(values[0])
    lse = m + math.log(float(torch.exp(x - m).sum(dtype=torch.float64)))
    rank = 1 + int(torch.count_nonzero(x > x[token])) if with_rank else 0
    alternatives: tuple[tuple[int, float], ...] = ()
    if top:
        pairs = sorted(zip(values.tolist(), ids.tolist(), strict=True), key=lambda p: (-p[0], p[1]))
        alternatives = tuple((int(i), v - lse) for v, i in pairs)
    return TokenLogprob(int(token), float(x[token]) - lse, rank, alternatives)


def rows_logprobs(
    rows: torch.Tensor, tokens: Sequence[int], top: int, *, with_rank: bool = False
) -> tuple[TokenLogprob, ...]:
    """``row_logprob`` of tokens[i] under rows[i], for each i (rows [n >= len(tokens), V])."""
    assert rows.shape[0] >= len(tokens), "a row per token"
    return tuple(
        row_logprob(rows[i], int(t), top, with_rank=with_rank) for i, t in enumerate(tokens)
    )


def finite(logprob: float) -> float:
    """``logprob`` as a finite number (-inf as ``NEG_INF_LOGPROB``)."""
    return logprob if logprob > NEG_INF_LOGPROB else NEG_INF_LOGPROB
