"""The side-by-side table of benchmarks/engines (the report of a results file, no servers):
each engine's spec/plain ratio and its plain tok/s against llama-server's, from paired items."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ENGINES = Path(__file__).resolve().parents[1] / "benchmarks" / "engines"


@pytest.fixture
def side_by_side(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(ENGINES))
    module = importlib.import_module("side_by_side")
    yield module
    sys.modules.pop("side_by_side", None)
    sys.modules.pop("servers", None)


def _results(path: Path, tps: dict[str, float]) -> Path:
    machine = {"cpu": "test CPU", "cores": 2, "avx512": [], "uptime": "load average: 0.1"}
    recs = [{"type": "header", "time": "t", "machine": machine, "prompts": ["a", "b", "c"],
             "rounds": 2, "max_tokens": 64}]  # fmt: skip
    for r in range(2):
        for first in range(3):
            for variant, value in tps.items():
                recs.append({"type": "item", "round": r, "concurrency": 1, "first": first,
                             "variant": variant, "tps": value * (1 + 0.01 * first)})  # fmt: skip
    recs.append({"type": "footer", "machine": machine})
    path.write_text("".join(json.dumps(x) + "\n" for x in recs))
    return path


def test_table_gives_each_ratio_within_the_run(side_by_side: ModuleType, tmp_path: Path) -> None:
    tps = {
        "llama-server/plain": 20.0,
        "llama-server/spec": 10.0,
        "vllm/plain": 5.0,
        "vllm/spec": 7.5,
    }
    table = side_by_side.report(_results(tmp_path / "r.jsonl", tps))
    rows = {
        line.split(" | ")[0].strip("| "): line for line in table.splitlines() if "| 1 |" in line
    }
    assert "0.50x" in rows["llama-server"] and "1 (reference)" in rows["llama-server"]
    assert "1.50x" in rows["vllm"] and "0.25x" in rows["vllm"]  # spec/plain; plain vs reference
    assert "test CPU" in table and "(unfinished)" not in table


def test_a_faster_speculative_side_reads_above_one(
    side_by_side: ModuleType, tmp_path: Path
) -> None:
    tps = {"llama-server/plain": 10.0, "llama-server/spec": 20.0}
    table = side_by_side.report(_results(tmp_path / "r.jsonl", tps))
    assert "2.00x" in table and "0.50x" not in table
