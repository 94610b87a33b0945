"""The certificate's numbers for fixed seeds are the ones recorded in
``tests/certificate_numbers.json``: a small certificate on mock models (Levels 1-2 scaled
down, Level 3 on a mock pair at T = 0.8, and a self-test with an injected fault that must
FAIL), every statistic, threshold, verdict and sample size of certificate.json, recorded by
the code before the statistics moved into one package and the seed plans were introduced.
A change that moves a number fails here; one that is meant to must record the file again
(``SPECDEC_RECORD_NUMBERS=1``) and say why. Floats compare to 1e-9 relative (the same
arithmetic gives the same bits; the margin is for a BLAS that sums in another order)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from specdec.cli import main

RECORD = Path(__file__).with_name("certificate_numbers.json")
MOCKS = [
    "--draft", "mock:close:8", "--target", "mock:target:8",
    "--draft-backend", "mock", "--target-backend", "mock",
]  # fmt: skip
RUNS = {
    "levels-1-2": ["--levels", "1,2", "--quick", "--scale", "0.1", "--seed", "3"],
    "level-3": ["--levels", "3", "--quick", "--seeds", "4", "--n-prompts", "2", "--seed", "3",
                "--temperature", "0.8", *MOCKS],
    "fault": ["--levels", "1", "--quick", "--scale", "0.1", "--inject-fault", "residual-is-p"],
}  # fmt: skip
RUN_DEPENDENT = {"seconds", "created_utc", "command"}  # times, and the --out path


def numbers(x: Any) -> Any:
    """certificate.json without what depends on the run rather than on the seeds."""
    if isinstance(x, dict):
        return {k: numbers(v) for k, v in x.items() if k not in RUN_DEPENDENT}
    if isinstance(x, list):
        return [numbers(v) for v in x]
    return x


def differences(want: Any, got: Any, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}: keys {sorted(want)} vs {sorted(got)}"] if list(want) != list(got) else []
        return out + [
            d for k in want if k in got for d in differences(want[k], got[k], f"{path}/{k}")
        ]
    if isinstance(want, list) and isinstance(got, list):
        out = [f"{path}: {len(want)} items vs {len(got)}"] if len(want) != len(got) else []
        return out + [
            d
            for i, (a, b) in enumerate(zip(want, got, strict=False))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    both_float = isinstance(want, float) and isinstance(got, float)
    if both_float and math.isclose(want, got, rel_tol=1e-9, abs_tol=0.0):
        return []
    return [] if want == got and type(want) is type(got) else [f"{path}: {want!r} vs {got!r}"]


def certificate(tmp_path: Path, name: str) -> Any:
    out = tmp_path / name
    main(["certify", *RUNS[name], "--out", str(out)])
    return numbers(json.loads((out / "certificate.json").read_text()))


def test_the_differences_check_sees_a_moved_number() -> None:
    """The comparison itself: a changed float, a changed count, a lost key are found."""
    want = {"a": 0.125, "n": [3, 4], "s": "pass"}
    assert differences(want, {"a": 0.125, "n": [3, 4], "s": "pass"}) == []
    assert differences(want, {"a": 0.1250001, "n": [3, 4], "s": "pass"}) != []
    assert differences(want, {"a": 0.125, "n": [3, 5], "s": "pass"}) != []
    assert differences(want, {"a": 0.125, "n": [3, 4]}) != []


def test_the_certificate_numbers_are_the_recorded_ones(tmp_path: Path) -> None:
    got = {name: certificate(tmp_path, name) for name in RUNS}
    assert got["fault"]["verdict"]["status"] == "fail"  # the self-test must FAIL
    if os.environ.get("SPECDEC_RECORD_NUMBERS") == "1":
        RECORD.write_text(json.dumps(got, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        pytest.skip(f"recorded {RECORD}")
    want = json.loads(RECORD.read_text(encoding="utf-8"))
    found = differences(want, got)
    assert found == [], "\n".join(found[:20])
