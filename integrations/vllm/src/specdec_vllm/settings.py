"""The proposer's options. vLLM's ``custom_class`` method passes a proposer nothing but the
engine's config (its ``speculative_config`` fields are vLLM's own, and ``custom_class`` sets
the n-gram ones to 0), so the options are environment variables of the server:

SPECDEC_VLLM_NGRAM   the fallback for requests without a prediction: ``MIN,MAX,K`` (vLLM's
                     n-gram lookup: ``prompt_lookup_min``, ``prompt_lookup_max`` and at most
                     K tokens, K <= num_speculative_tokens), or ``off``; default ``2,4,4``
SPECDEC_VLLM_STEP_COSTS  ``A,B``: a step of T tokens costs A + B * (T - 1) (any unit; only
                     B / A matters), fixed instead of learned from the engine's steps
                     (``step_costs.StepClock``); default: learned
SPECDEC_VLLM_RECORD  a file: every step's inputs and drafts are appended to it as JSON lines
                     (the tests replay such a recording without vLLM)
SPECDEC_VLLM_FAULT   ``keep-drafts``: the fault fixture, vLLM's greedy rejection keeps every
                     draft token (``fault.py``); for the checks that must FAIL, never for use
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from specdec_vllm.fault import FAULT_ENV, parse_fault

NGRAM_ENV = "SPECDEC_VLLM_NGRAM"
RECORD_ENV = "SPECDEC_VLLM_RECORD"
STEP_COSTS_ENV = "SPECDEC_VLLM_STEP_COSTS"
DEFAULT_NGRAM = "2,4,4"


@dataclass(frozen=True)
class Ngram:
    min_n: int
    max_n: int
    k: int


@dataclass(frozen=True)
class Settings:
    ngram: Ngram | None
    record: str | None
    step_costs: tuple[float, float] | None = None  # (A, B); None: learned
    fault: str | None = None  # fault.FAULTS: the fixture the checks must catch

    @classmethod
    def from_env(cls, k: int, env: Mapping[str, str] | None = None) -> Settings:
        """Read the variables; ValueError (vLLM's start-up fails with it) on a bad value.
        ``k``: the engine's num_speculative_tokens."""
        env = os.environ if env is None else env
        costs = env.get(STEP_COSTS_ENV)
        return cls(
            parse_ngram(env.get(NGRAM_ENV, DEFAULT_NGRAM), k),
            env.get(RECORD_ENV) or None,
            parse_step_costs(costs) if costs else None,
            parse_fault(env.get(FAULT_ENV)),
        )


def parse_step_costs(text: str) -> tuple[float, float]:
    try:
        a, b = (float(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"{STEP_COSTS_ENV} must be A,B (two numbers), got {text!r}") from None
    if not (a > 0 and b >= 0) or a == float("inf") or b == float("inf"):
        raise ValueError(f"{STEP_COSTS_ENV}: need A > 0 and B >= 0 (finite), got {text!r}")
    return a, b


def parse_ngram(text: str, k: int) -> Ngram | None:
    if text.strip().lower() == "off":
        return None
    parts = text.split(",")
    try:
        lo, hi, n = (int(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"{NGRAM_ENV} must be MIN,MAX,K (three integers) or off, got {text!r}"
        ) from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{NGRAM_ENV}: need 1 <= MIN <= MAX, got {lo},{hi}")
    if not 1 <= n <= k:
        raise ValueError(f"{NGRAM_ENV}: K must be in 1..{k} (num_speculative_tokens), got {n}")
    return Ngram(lo, hi, n)
