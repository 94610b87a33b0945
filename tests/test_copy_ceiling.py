"""The verify-curve ceiling of a copy-heavy request (theory.copy_ceiling,
bench.copy_ceiling) and issue 41's benchmark report on synthetic results (no timing)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from specdec.bench.copy_ceiling import copy_blocks, request_ceiling
from specdec.theory import copy_ceiling
from specdec.util.machine import cpu_flags, machine_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

# an Intel Xeon's curve (1.5B Q4_K_M, 2 threads; ../shared/notes), v(n) / v(1) at the
# measured n, linear between: the ceiling is ~4.4x at K = 16 and ~4.9x at K = 32
XEON = {1: 1.0, 2: 1.51, 4: 1.71, 8: 3.24, 12: 3.91, 16: 3.87, 24: 5.94, 32: 6.66}


def _curve(points: dict[int, float], n_max: int) -> list[float]:
    ns = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        lo = max(m for m in ns if m <= n)
        hi = min((m for m in ns if m >= n), default=lo)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out.append(points[lo] + w * (points[hi] - points[lo]))
    return out


def test_the_ceiling_of_an_all_accepted_copy_is_the_best_k_plus_one_over_verify() -> None:
    v = _curve(XEON, 32)
    k, speedup = copy_ceiling(1.0, v)
    assert k == 31 and speedup == pytest.approx(32 / 6.66)  # ~4.8x, drafts of 31
    k16, s16 = copy_ceiling(1.0, v[:17])
    assert k16 == 15 and s16 == pytest.approx(16 / 3.87)  # the cap of 16: ~4.1x
    assert copy_ceiling(1.0, [float(n) for n in range(1, 33)]) == (0, 1.0)  # serial
    assert copy_ceiling(0.0, v) == (0, 1.0)  # nothing kept: plain decoding
    k_flat, s_flat = copy_ceiling(0.9, [1.0] * 65)  # batch-parallel: as long as the curve
    assert k_flat == 64 and s_flat == pytest.approx((1 - 0.9**65) / 0.1)
    assert copy_ceiling(0.9, v)[0] < 31  # rejections: a shorter best K
    with pytest.raises(ValueError, match="alpha"):
        copy_ceiling(1.5, v)


def test_a_requests_ceiling_charges_new_text_a_plain_step_and_copies_the_curve() -> None:
    v = _curve(XEON, 32)
    pred = list(range(100, 400))
    same = request_ceiling(pred, pred, v)
    assert (same.copied, same.blocks) == (300, 1)
    assert same.alpha == pytest.approx(300 / 301)
    assert same.speedup == pytest.approx(copy_ceiling(300 / 301, v)[1])
    none = request_ceiling(pred, list(range(500, 560)), v)
    assert none.copied == 0 and none.speedup == 1.0
    edited = [*pred[:150], *range(900, 950), *pred[150:]]  # 50 new tokens inserted
    half = request_ceiling(pred, edited, v)
    assert (half.copied, half.blocks, half.tokens) == (300, 2, 350)
    assert half.speedup == pytest.approx(350 / (50 + 300 / copy_ceiling(300 / 302, v)[1]))
    assert 1.0 < half.speedup < same.speedup
    assert copy_blocks([1, 2, 3], [9, 2, 8]) == []  # a one-token coincidence is no copy


def test_the_machine_line_names_the_simd_flags() -> None:
    info = "processor : 0\nflags : fpu avx2 fma avx512f avx512bw amx_tile sse4_2\n"
    assert cpu_flags(info) == ["avx2", "fma", "avx512f", "avx512bw", "amx_tile"]
    assert "AVX512F" in machine_line(info) and "AMX_TILE" in machine_line(info)
    assert "no AVX2" in machine_line("flags : fpu sse2\n")


def _request(kind: str, llama: float, new: float, old: float, today: float) -> dict[str, Any]:
    ceiling = {
        "tokens": 300,
        "copied": 290,
        "blocks": 3,
        "alpha": 0.99,
        "best_k": 31,
        "copy_speedup": 2.2,
        "speedup": 2.0,
    }
    rec: dict[str, Any] = {"set": "code_predict", "kind": kind, "ceiling": ceiling}
    rec["llama-cpp-python"] = {"tps": llama, "of_ceiling": 0.5}
    for name, tps in (("K<=64", new), ("K<=16", old), ("today", today)):
        rec[name] = {
            "tps": tps,
            "of_ceiling": tps / (2.0 * llama),
            "rows_per_pass": 12.0,
            "same_as_llama": True,
        }
    return rec


def _data(requests: dict[str, dict[str, Any]], identical: int) -> dict[str, Any]:
    curve = [1.0 + 0.2 * n for n in range(65)]
    return {
        "machine_line": "a test CPU, 2 cores, AVX2",
        "curve_start": curve,
        "curve_end": curve,
        "requests": requests,
        "exact": [{"id": f"e{i}", "identical": i < identical} for i in range(10)],
    }


def test_the_benchmark_report_says_the_machine_and_applies_the_rule_fixed_in_advance(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from prediction_ceiling import report

    good = {
        "code_predict:rename_1": _request("rename", 20.0, 38.0, 35.0, 34.0),
        "code_predict:type_hints_1": _request("type_hints", 20.0, 37.0, 36.0, 36.0),
        "code_predict:control_empty_1": _request("control_empty", 20.0, 30.0, 30.0, 30.0),
    }
    assert report(_data(good, 10))  # 0.94 of the ceiling, faster than both, none below 1
    out = capsys.readouterr().out
    assert "issue 41's rule (fixed before the run): MET" in out
    assert out.count("a test CPU, 2 cores, AVX2") >= 3  # beside every table
    assert not report(_data(good, 9))  # one edit not identical under exact numerics
    slow = dict(good, **{"code_predict:rename_2": _request("rename", 20.0, 19.0, 19.0, 19.0)})
    assert not report(_data(slow, 10))  # a request slower than llama-cpp-python's loop
    capsys.readouterr()
    same = {k: _request(v["kind"], 20.0, 36.0, 36.0, 34.0) for k, v in good.items()}
    assert not report(_data(same, 10))  # K<=64 no faster than the cap of 16
    assert "NOT met" in capsys.readouterr().out
