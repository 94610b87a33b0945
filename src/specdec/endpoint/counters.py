"""Speculative counters as servers report them.

Per response (the first one found wins):
    ``timings.draft_n`` / ``timings.draft_n_accepted``    llama.cpp's llama-server, specdec serve
    ``usage.drafted_tokens`` / ``usage.accepted_tokens``  specdec serve
    ``metrics.speculative_decoding.num_draft_tokens`` / ``num_accepted_draft_tokens``
                                                          vLLM's opt-in per-request block
Per server, as Prometheus counters on ``/metrics`` (summed over label sets):
    ``vllm:spec_decode_num_draft_tokens_total`` / ``vllm:spec_decode_num_accepted_tokens_total``
    ``specdec_drafted_tokens_total`` / ``specdec_accepted_tokens_total``
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdec.endpoint.schema import ShapeError, count

METRIC_PAIRS: tuple[tuple[str, str], ...] = (
    ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"),
    ("specdec_drafted_tokens_total", "specdec_accepted_tokens_total"),
)


@dataclass(frozen=True)
class SpecCounters:
    """Draft tokens proposed and accepted, and where the figures came from."""

    drafted: int
    accepted: int
    source: str  # "timings" | "usage" | "vllm-metrics" | "metrics-endpoint"

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else math.nan


def _pair(block: Mapping[str, Any], names: tuple[str, str], path: str, source: str) -> SpecCounters:
    """The checked counts ``block[names[0]]`` (drafted, present) and ``block[names[1]]``
    (accepted, 0 when absent): integers >= 0, accepted <= drafted."""
    d = count(block.get(names[0]), f"{path}.{names[0]}") or 0
    a = count(block.get(names[1]), f"{path}.{names[1]}") or 0
    if a > d:
        raise ShapeError(f"{path}.{names[1]}", f"is {a}, more than the {d} drafted tokens")
    return SpecCounters(d, a, source)


def counters_from_body(body: Mapping[str, Any]) -> SpecCounters | None:
    """The speculative counters of one response (or final stream chunk), None when absent;
    a ShapeError when present with the wrong type (a count that is not an integer >= 0)."""
    timings = body.get("timings")
    if isinstance(timings, Mapping) and timings.get("draft_n") is not None:
        return _pair(timings, ("draft_n", "draft_n_accepted"), "timings", "timings")
    usage = body.get("usage")
    if isinstance(usage, Mapping) and usage.get("drafted_tokens") is not None:
        return _pair(usage, ("drafted_tokens", "accepted_tokens"), "usage", "usage")
    metrics = body.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if isinstance(spec, Mapping) and spec.get("num_draft_tokens") is not None:
        names = ("num_draft_tokens", "num_accepted_draft_tokens")
        return _pair(spec, names, "metrics.speculative_decoding", "vllm-metrics")
    return None


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (comments and bad lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ") if "{" not in line else line.partition("}")
        name = name_part.split("{", 1)[0].strip()
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


def metrics_counters(
    before: Mapping[str, float], after: Mapping[str, float]
) -> SpecCounters | None:
    """Counters accumulated between two scrapes of ``/metrics`` (None: no known series)."""
    for drafted_name, accepted_name in METRIC_PAIRS:
        if drafted_name in after:
            drafted = after[drafted_name] - before.get(drafted_name, 0.0)
            accepted = after.get(accepted_name, 0.0) - before.get(accepted_name, 0.0)
            if not 0 <= accepted <= drafted:  # a counter reset (a restart), or nonsense
                return None
            return SpecCounters(round(drafted), round(accepted), "metrics-endpoint")
    return None


def has_known_series(metrics: Mapping[str, float]) -> bool:
    return any(d in metrics for d, _ in METRIC_PAIRS)
