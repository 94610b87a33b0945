"""Server-wide counters, rendered in the Prometheus text format for ``GET /metrics``.

One ``ServerMetrics`` per app (no module state); its methods are called from the event loop
and from the generation thread, so they take a lock. Names follow Prometheus conventions
(``_total`` counters, ``_seconds`` units) and the field names of docs/metrics.md.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field

from specdec.core.result import GenerationResult

_PREFIX = "specdec"


@dataclass
class _Totals:
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)
    generations: Counter[str] = field(default_factory=Counter)  # by finish reason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: list[int] = field(default_factory=list)  # by draft position
    kept: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # time split, plus queue wait


class ServerMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t = _Totals()

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self._t.requests[(endpoint, status)] += 1

    def generation(self, result: GenerationResult, queue_seconds: float) -> None:
        reached, kept = result.acceptance_counts()
        with self._lock:
            t = self._t
            t.generations[result.finish_reason] += 1
            t.prompt_tokens += len(result.prompt_ids)
            t.completion_tokens += len(result.tokens)
            t.rounds += result.n_rounds
            t.drafted += result.drafted_tokens
            t.accepted += result.accepted_tokens
            for mine, new in ((t.reached, reached), (t.kept, kept)):
                mine.extend([0] * (len(new) - len(mine)))
                for i, n in enumerate(new):
                    mine[i] += n
            parts = {**result.time_split(), "queue": queue_seconds}
            for part, s in parts.items():
                t.seconds[part] = t.seconds.get(part, 0.0) + max(0.0, s)

    def render(self, *, queued: int, running: int) -> str:
        """The Prometheus text exposition of everything counted so far."""
        with self._lock:
            t = self._t
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                full = f"{_PREFIX}_{name}"
                lines.append(f"# HELP {full} {help_}")
                lines.append(f"# TYPE {full} {kind}")
                for labels, value in samples:
                    lines.append(f"{full}{labels} {_num(value)}")

            metric(
                "requests_total",
                "counter",
                "HTTP requests answered, by endpoint and status.",
                [
                    (f'{{endpoint="{e}",status="{s}"}}', n)
                    for (e, s), n in sorted(t.requests.items())
                ],
            )
            metric(
                "generations_total",
                "counter",
                "Generations finished, by finish reason.",
                [(f'{{finish_reason="{r}"}}', n) for r, n in sorted(t.generations.items())],
            )
            metric("prompt_tokens_total", "counter", "Prompt tokens.", [("", t.prompt_tokens)])
            metric(
                "completion_tokens_total",
                "counter",
                "Tokens generated.",
                [("", t.completion_tokens)],
            )
            metric("verification_rounds_total", "counter", "Target passes.", [("", t.rounds)])
            metric("drafted_tokens_total", "counter", "Draft tokens proposed.", [("", t.drafted)])
            metric("accepted_tokens_total", "counter", "Draft tokens kept.", [("", t.accepted)])
            metric(
                "mean_acceptance_length",
                "gauge",
                "(accepted + rounds) / rounds since start, the bonus token included.",
                [("", (t.accepted + t.rounds) / t.rounds if t.rounds else math.nan)],
            )
            metric(
                "acceptance_by_position",
                "gauge",
                "P(draft i kept | drafts 1..i-1 kept), since start.",
                [
                    (f'{{position="{i + 1}"}}', k / n if n else math.nan)
                    for i, (n, k) in enumerate(zip(t.reached, t.kept, strict=True))
                ],
            )
            metric(
                "position_reached_total",
                "counter",
                "Rounds that reached draft position i.",
                [(f'{{position="{i + 1}"}}', n) for i, n in enumerate(t.reached)],
            )
            metric(
                "position_accepted_total",
                "counter",
                "Rounds that kept draft position i.",
                [(f'{{position="{i + 1}"}}', n) for i, n in enumerate(t.kept)],
            )
            metric(
                "time_seconds_total",
                "counter",
                "Seconds spent, by part (queue wait, prefill, draft, verify, sampling, other).",
                [(f'{{part="{p}"}}', s) for p, s in sorted(t.seconds.items())],
            )
            metric("queue_waiting", "gauge", "Requests waiting for the model.", [("", queued)])
            metric("queue_running", "gauge", "Requests generating now (0 or 1).", [("", running)])
        return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    return repr(float(x)) if isinstance(x, float) else str(x)
