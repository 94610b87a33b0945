"""benchmarks/verify_curve.py --rounds: the per-round ratios to the first setting (pure
arithmetic on fixed medians; nothing is timed here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from verify_curve import format_vs, pooled, vs_first


def _run(ms: dict[int, list[float]]) -> dict[str, object]:
    """One setting's result in one round: samples in seconds, their medians in ms."""
    return {
        "samples_s": {str(n): [x / 1e3 for x in xs] for n, xs in ms.items()},
        "median_ms": {str(n): sorted(xs)[len(xs) // 2] for n, xs in ms.items()},
        "wall_s": 1.0,
    }


def test_each_round_is_compared_with_the_first_setting_of_the_same_round() -> None:
    # round 2 runs 2x slower for both (drift): the ratio stays 1.1, pooled medians would not
    base = pooled([_run({1: [10.0], 2: [20.0]}), _run({1: [20.0], 2: [40.0]})])
    other = pooled([_run({1: [10.0], 2: [22.0]}), _run({1: [20.0], 2: [44.0]})])
    table = vs_first({"a": base, "b": other}, "a", [1, 2])
    assert list(table) == ["b"]
    assert table["b"]["1"]["median"] == pytest.approx(1.0)
    assert table["b"]["2"]["per_round"] == pytest.approx([1.1, 1.1])
    assert table["b"]["2"]["min"] == pytest.approx(1.1) == table["b"]["2"]["max"]
    assert "1.100 [1.10, 1.10]" in format_vs({"a": base, "b": other}, "a", [1, 2])


def test_pooled_keeps_every_sample_and_each_rounds_medians() -> None:
    p = pooled([_run({1: [1.0, 3.0, 2.0]}), _run({1: [5.0, 4.0, 6.0]})])
    assert len(p["samples_s"]["1"]) == 6
    assert p["round_median_ms"] == [{"1": 2.0}, {"1": 5.0}]
    assert p["median_ms"]["1"] == pytest.approx(3.5)
    assert p["wall_s"] == 2.0
