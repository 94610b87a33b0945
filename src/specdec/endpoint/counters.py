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


def _int(x: Any) -> int | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return int(x)


def counters_from_body(body: Mapping[str, Any]) -> SpecCounters | None:
    """The speculative counters of one response (or final stream chunk), None when absent."""
    timings = body.get("timings")
    if isinstance(timings, Mapping) and _int(timings.get("draft_n")) is not None:
        drafted = _int(timings.get("draft_n")) or 0
        return SpecCounters(drafted, _int(timings.get("draft_n_accepted")) or 0, "timings")
    usage = body.get("usage")
    if isinstance(usage, Mapping) and _int(usage.get("drafted_tokens")) is not None:
        drafted = _int(usage.get("drafted_tokens")) or 0
        return SpecCounters(drafted, _int(usage.get("accepted_tokens")) or 0, "usage")
    metrics = body.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if isinstance(spec, Mapping) and _int(spec.get("num_draft_tokens")) is not None:
        drafted = _int(spec.get("num_draft_tokens")) or 0
        accepted = _int(spec.get("num_accepted_draft_tokens")) or 0
        return SpecCounters(drafted, accepted, "vllm-metrics")
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
            return SpecCounters(round(drafted), round(accepted), "metrics-endpoint")
    return None


def has_known_series(metrics: Mapping[str, float]) -> bool:
    return any(d in metrics for d, _ in METRIC_PAIRS)
