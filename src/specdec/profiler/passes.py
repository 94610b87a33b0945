"""Timed passes of a backend: the verify-batch scaling curve and single-step latencies.

These numbers decide whether speculation can pay before any acceptance is measured: a round
drafting K tokens costs K * c + verify(K + 1) / verify(1) target steps (``specdec.theory``).

All functions work on any ``CausalLM`` through ``extend`` / ``truncate`` only. They leave the
model's cache empty. ``clock`` is injectable so the arithmetic can be tested exactly.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from specdec.core.drafter import Drafter
from specdec.core.model import CausalLM
from specdec.core.sampling import GREEDY, make_generator
from specdec.errors import ConfigError

Clock = Callable[[], float]

# Ordinary English prose for the profiling context (content does not change the cost of a
# dense forward pass, only its length does).
PROFILE_TEXT = (
    "Speculative decoding lets a small draft model propose several tokens that a larger target "
    "model then checks in a single forward pass. When the draft agrees with the target often "
    "and the batched check costs about as much as one ordinary step, the output is produced "
    "faster and is still exactly what the target alone would have written. On some hardware, "
    "however, checking several positions at once costs nearly as much as running them one by "
    "one, and then the extra work of drafting is pure overhead."
)


def profile_context(model: CausalLM, n_tokens: int = 100, text: str = PROFILE_TEXT) -> list[int]:
    """A realistic context of exactly n_tokens ids (the text encoded, repeated as needed)."""
    ids = model.tokenizer.encode(text, add_special_tokens=True)
    body = model.tokenizer.encode(" " + text, add_special_tokens=False)
    if not ids or not body:
        raise ConfigError("the profiling text encodes to zero tokens")
    while len(ids) < n_tokens:
        ids.extend(body)
    return ids[:n_tokens]


def _reset(model: CausalLM) -> None:
    if model.n_cached:
        model.truncate(0)


def verify_times(
    model: CausalLM,
    context_ids: Sequence[int],
    n_max: int = 16,
    repeats: int = 5,
    *,
    warmup: bool = True,
    clock: Clock = time.perf_counter,
    ns: Sequence[int] | None = None,
) -> list[float]:
    """Median seconds of one ``extend`` over n = 1..n_max new tokens after ``context_ids``.

    Each timed pass is undone with ``truncate`` so every n sees the same context. Repeats
    alternate ascending and descending n so slow drift does not tilt the curve. ``ns``: time
    only these n (1 and n_max are always included) and interpolate the others linearly.
    """
    if n_max < 1 or repeats < 1:
        raise ConfigError(f"n_max and repeats must be >= 1, got {n_max}, {repeats}")
    if not context_ids:
        raise ConfigError("the profiling context is empty")
    if len(context_ids) + n_max > model.n_ctx:
        raise ConfigError(
            f"profiling needs {len(context_ids)} + {n_max} positions, the model has {model.n_ctx}"
        )
    base = len(context_ids)
    pool = list(context_ids[1:]) or list(context_ids)
    fill = [pool[i % len(pool)] for i in range(n_max)]  # tokens fed after the context
    _reset(model)
    model.extend(list(context_ids))
    if warmup:
        for n in (n_max, 1):
            model.extend(fill[:n])
            model.truncate(base)
    timed = sorted({1, n_max, *(n for n in (ns or range(1, n_max + 1)) if 1 <= n <= n_max)})
    samples: dict[int, list[float]] = {n: [] for n in timed}
    for r in range(repeats):
        for n in timed if r % 2 == 0 else timed[::-1]:
            t0 = clock()
            model.extend(fill[:n])
            samples[n].append(clock() - t0)
            model.truncate(base)
    _reset(model)
    med = {n: float(statistics.median(v)) for n, v in samples.items()}
    return [interpolated(med, n) for n in range(1, n_max + 1)]


def interpolated(points: dict[int, float], n: int) -> float:
    """The value at n, linear between the nearest measured points around it."""
    if n in points:
        return points[n]
    lo = max(m for m in points if m < n)
    hi = min(m for m in points if m > n)
    return points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo)


def verify_scaling(
    model: CausalLM,
    context_ids: Sequence[int],
    n_max: int = 16,
    repeats: int = 5,
    *,
    clock: Clock = time.perf_counter,
) -> list[float]:
    """verify(n) / verify(1) for n = 1..n_max (element 0 is 1.0): 1 everywhere means perfectly
    batch-parallel verification, n means serial."""
    times = verify_times(model, context_ids, n_max, repeats, clock=clock)
    return scaling_from_times(times)


def scaling_from_times(times: Sequence[float]) -> list[float]:
    if not times or times[0] <= 0:
        return [float("nan")] * len(times)
    return [t / times[0] for t in times]


def step_latency(
    model: CausalLM,
    context_ids: Sequence[int],
    repeats: int = 5,
    *,
    clock: Clock = time.perf_counter,
) -> float:
    """Median seconds of one single-token ``extend`` after ``context_ids`` (one decode step)."""
    return verify_times(model, context_ids, 1, repeats, clock=clock)[0]


def drafter_latency(
    drafter: Drafter,
    context_ids: Sequence[int],
    repeats: int = 5,
    *,
    clock: Clock = time.perf_counter,
) -> float:
    """Median seconds for a (model-free) drafter to propose one token after ``context_ids``."""
    gen = make_generator(0)
    samples = []
    for _ in range(repeats + 1):  # the first call is a warm-up
        drafter.reset()
        t0 = clock()
        drafter.propose(list(context_ids), 1, GREEDY, gen)
        samples.append(clock() - t0)
    drafter.reset()
    return float(statistics.median(samples[1:]))


def param_count(model: object) -> int | None:
    """The model's parameter count when the backend exposes one: an ``n_params`` attribute or
    method, or transformers' ``num_parameters()``, on the model, on the object it wraps
    (``.model`` / ``.llm`` / ``._model``), or one level further (llama-cpp-python keeps
    ``n_params()`` on ``Llama._model``)."""
    wrapped = [getattr(model, a, None) for a in ("model", "llm", "_model")]
    deeper = [getattr(w, "_model", None) for w in wrapped if w is not None]
    for obj in (model, *wrapped, *deeper):
        if obj is None:
            continue
        for name in ("n_params", "num_parameters"):
            value = getattr(obj, name, None)
            try:
                value = value() if callable(value) else value
            except Exception:  # a backend's accessor failing only loses an optional number
                value = None
            if isinstance(value, int) and value > 0:
                return value
    return None


def flops_cost_ratio(draft_params: int | None, target_params: int | None) -> float | None:
    """FLOPs-based c: (2 x draft params) / (2 x target params) per token, when both known."""
    if not draft_params or not target_params:
        return None
    return draft_params / target_params
