"""Values for strict JSON: undefined or unbounded figures (NaN, inf) become null."""

from __future__ import annotations

import math
from typing import Any


def finite(x: float) -> float | None:
    """x, or None for NaN / inf."""
    return x if math.isfinite(x) else None


def json_ready(x: Any) -> Any:
    """``x`` with every float that is not finite replaced by None, recursively through dicts
    (keys made strings), lists and tuples."""
    if isinstance(x, float):
        return finite(x)
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_ready(v) for v in x]
    return x
