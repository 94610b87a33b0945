"""benchmarks/exact_cost.py writes its JSON after every round and resumes from it: a stopped
run loses at most the round it was in. The workers are replaced by the samples of a saved
run (no model, no timing)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "benchmarks" / "results" / "exact-cost-v2.json"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "exact_cost", ROOT / "benchmarks" / "exact_cost.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stopped_run_keeps_its_rounds_and_resumes_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("llama_cpp")
    ec = _script()
    saved = json.loads(SAVED.read_text())["rounds"]
    calls: list[str] = []

    def worker_then_stop(setting: str, args: Any) -> dict[str, Any]:
        if len(calls) == 2:  # the second round's first worker: the run is stopped
            raise KeyboardInterrupt
        calls.append(setting)
        return saved[0][setting]

    out = tmp_path / "cost.json"
    monkeypatch.setattr(ec, "run_worker", worker_then_stop)
    with pytest.raises(KeyboardInterrupt):
        ec.main(["--rounds", "2", "--only", "exact", "--json", str(out)])
    first = json.loads(out.read_text())
    assert len(first["rounds"]) == 1 and first["complete"] is False
    assert sorted(first["settings"]) == ["default", "exact"]

    calls.clear()
    monkeypatch.setattr(ec, "run_worker", lambda s, a: calls.append(s) or saved[1][s])
    assert ec.main(["--rounds", "2", "--only", "exact", "--json", str(out), "--resume"]) == 0
    done = json.loads(out.read_text())
    assert len(calls) == 2  # only the missing round ran
    assert done["complete"] is True and done["rounds"][0] == first["rounds"][0]
    assert done["rounds"][1]["exact"] == saved[1]["exact"]

    with pytest.raises(SystemExit, match="other settings"):  # another run's file
        ec.main(["--rounds", "3", "--json", str(out), "--resume", "--with-none"])
