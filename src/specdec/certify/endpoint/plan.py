"""The plan of ``certify --endpoint``: how many prompts, requests and tokens, the sampling,
the thresholds fixed before the run, and the quick plan's time budget."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.endpoint.capacity import MAX_CONCURRENCY
from specdec.errors import ConfigError
from specdec.stats.thresholds import ALPHA, POWER, TIE_GAP_NATS
from specdec.util.bounds import check_range, check_scale

from .pertoken import DEFAULT_TOP

QUICK_SAMPLES = 150  # per prompt and side, at most (the time budget may lower it)
QUICK_SECONDS = 300.0


@dataclass(frozen=True)
class EndpointCertifyPlan:
    prompts: tuple[str, ...]
    # OpenAI's ``prediction`` of each prompt (None: that prompt has none), sent with each of
    # its generation requests to both sides; None: no prompt has one
    predictions: tuple[str | None, ...] | None = None
    greedy_prompts: int = 8
    greedy_tokens: int = 64
    sampled_prompts: int = 4
    samples: int = 250  # independent requests per prompt and side
    sample_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    alpha: float = ALPHA
    tie_gap: float = TIE_GAP_NATS  # nats
    top_logprobs: int = 5
    seed: int = 0
    power: float = POWER
    power_trials: int = 200
    concurrency: int = 1  # requests in flight per server
    pertoken: bool = True  # where the servers allow it (and the sampling is T = 1, no cut-off)
    pertoken_top: int = DEFAULT_TOP
    # a time budget for the whole run: a pilot (not part of the tests) times the requests,
    # then ``samples`` is lowered to what fits, but not below ``min_samples``
    max_seconds: float | None = None
    min_samples: int = 30

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ConfigError("no prompts")
        if self.predictions is not None and len(self.predictions) != len(self.prompts):
            raise ConfigError("one prediction (or none) per prompt")
        if self.greedy_prompts < 0 or self.sampled_prompts < 0:
            raise ConfigError("prompt counts must be >= 0")
        if self.greedy_prompts == 0 and self.sampled_prompts == 0:
            raise ConfigError("nothing to test: no greedy and no sampled prompts")
        if self.sampled_prompts and self.samples < 2:
            raise ConfigError(f"samples must be >= 2 per prompt and side, got {self.samples}")
        if self.greedy_tokens < 1 or self.sample_tokens < 1:
            raise ConfigError("token counts must be >= 1")
        if not self.temperature > 0:
            raise ConfigError("the sampled tests need a temperature > 0")
        if not 0 < self.alpha < 0.5:
            raise ConfigError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if not (math.isfinite(self.tie_gap) and self.tie_gap >= 0):
            raise ConfigError(f"tie gap must be finite and >= 0, got {self.tie_gap}")
        check_range(self.concurrency, "concurrency", 1, MAX_CONCURRENCY)
        if not 1 <= self.top_logprobs <= 20:
            raise ConfigError(f"top logprobs must be in 1..20, got {self.top_logprobs}")
        if self.pertoken_top < 1:
            raise ConfigError(f"per-token top N must be >= 1, got {self.pertoken_top}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"the time budget must be > 0 seconds, got {self.max_seconds}")
        if self.min_samples < 2:
            raise ConfigError(f"min samples must be >= 2, got {self.min_samples}")

    @property
    def pertoken_sampling(self) -> bool:
        """Whether the sampling is the model's raw distribution (what the rows describe)."""
        return self.temperature == 1.0 and self.top_p >= 1.0 and self.top_k <= 0

    def greedy_texts(self) -> list[str]:
        return [self.prompts[i % len(self.prompts)] for i in range(self.greedy_prompts)]

    def sampled_texts(self) -> list[str]:
        return [self.prompts[i % len(self.prompts)] for i in range(self.sampled_prompts)]

    def prediction_body(self, i: int) -> dict[str, Any]:
        """The request fields of the i-th greedy or sampled prompt's prediction ({}: none)."""
        if self.predictions is None:
            return {}
        p = self.predictions[i % len(self.prompts)]
        return {} if p is None else {"prediction": {"type": "content", "content": p}}


def make_plan(
    prompts: Sequence[str], *, quick: bool, scale: float = 1.0, **overrides: Any
) -> EndpointCertifyPlan:
    """The quick or the full plan; ``overrides`` that are not None replace plan fields;
    ``scale`` multiplies the sample count. Quick is a 5-minute certificate: as many sampled
    requests (up to 150 per prompt and side, at least 30) as a pilot says fit in 5 minutes."""
    base: dict[str, Any] = (
        {
            "greedy_prompts": 2,
            "greedy_tokens": 32,
            "sampled_prompts": 2,
            "samples": QUICK_SAMPLES,
            "sample_tokens": 8,
            "max_seconds": QUICK_SECONDS,
        }
        if quick
        else {}
    )
    base.update({k: v for k, v in overrides.items() if v is not None})
    check_scale(scale)  # finite: inf or 1e300 would overflow the sample count
    if base.get("max_seconds") == 0:  # no time budget
        base["max_seconds"] = None
    if scale != 1.0:
        n = base.get("samples", EndpointCertifyPlan.samples)
        base["samples"] = max(2, round(n * scale))
    return EndpointCertifyPlan(prompts=tuple(prompts), **base)
