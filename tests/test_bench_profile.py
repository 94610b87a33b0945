"""The micro-profiler on mock models: the arithmetic exactly (with a fake clock), and shapes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from specdec.bench.profile import profile_config
from specdec.core.model import extend_last
from specdec.drafters import NgramDrafter
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, MockSpec, mock_pair
from specdec.profiler.measure import curve_from_ratios, curve_ratios
from specdec.profiler.passes import (
    drafter_latency,
    flops_cost_ratio,
    param_count,
    profile_context,
    step_latency,
    verify_scaling,
    verify_times,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedMock(MockLM):
    """A mock whose extend over n tokens 'takes' base + per_token * (n - 1) fake seconds,
    and which records every cache length it was extended at."""

    def __init__(self, clock: FakeClock, base: float, per_token: float) -> None:
        super().__init__(MockSpec(vocab_size=16, n_ctx=512))
        self.clock = clock
        self.base = base
        self.per_token = per_token
        self.extended_at: list[tuple[int, int]] = []

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        self.extended_at.append((self.n_cached, len(tokens)))
        self.clock.now += self.base + self.per_token * (len(tokens) - 1)
        return super().extend(tokens)


def test_verify_scaling_is_exact_with_a_fake_clock() -> None:
    clock = FakeClock()
    model = TimedMock(clock, base=0.02, per_token=0.005)
    ctx = profile_context(model, 100)
    assert len(ctx) == 100
    ratios = verify_scaling(model, ctx, n_max=16, repeats=3, clock=clock)
    assert len(ratios) == 16
    for n, r in enumerate(ratios, 1):
        assert r == pytest.approx((0.02 + 0.005 * (n - 1)) / 0.02)
    # every timed pass ran right after the full context (truncate restored it each time)
    timed = [(at, n) for at, n in model.extended_at if at != 0]
    assert all(at == 100 for at, _ in timed)
    assert sorted(n for _, n in timed) == sorted([*range(1, 17)] * 3 + [16, 1])  # + warm-up
    assert model.n_cached == 0  # the profiler leaves the cache empty


def test_serial_backend_scales_linearly() -> None:
    clock = FakeClock()
    model = TimedMock(clock, base=0.01, per_token=0.01)
    ratios = verify_scaling(model, profile_context(model, 50), n_max=8, repeats=2, clock=clock)
    assert ratios == pytest.approx([float(n) for n in range(1, 9)])


def test_step_latency_and_drafter_latency_with_fake_clock() -> None:
    clock = FakeClock()
    model = TimedMock(clock, base=0.03, per_token=0.0)
    ctx = profile_context(model, 40)
    assert step_latency(model, ctx, repeats=4, clock=clock) == pytest.approx(0.03)
    # a drafter's cost is whatever happens between the clock reads
    assert drafter_latency(NgramDrafter(3), ctx, repeats=3, clock=clock) == 0.0


def test_profiler_on_a_real_clock_returns_sane_shapes() -> None:
    draft, target = mock_pair("close", vocab_size=16)
    ctx = profile_context(target, 100)
    times = verify_times(target, ctx, n_max=6, repeats=2)
    assert len(times) == 6 and all(t > 0 for t in times)
    ratios = verify_scaling(target, ctx, n_max=6, repeats=2)
    assert ratios[0] == 1.0 and all(math.isfinite(r) and r > 0 for r in ratios)
    assert step_latency(draft, ctx, repeats=2) > 0
    prof = profile_config("x", target, draft, context_tokens=60, n_max=5, repeats=2)
    assert prof.verify_n == [1, 2, 3, 4, 5] and prof.verify_ratio[0] == 1.0
    assert prof.c == pytest.approx(prof.draft_step_s / prof.target_step_s)
    assert prof.draft_kind == "model" and prof.c_flops is None  # mocks have no param count
    ng = profile_config("y", target, NgramDrafter(3), context_tokens=60, n_max=3, repeats=2)
    assert ng.draft_kind == "model_free"
    assert target.n_cached == 0 and draft.n_cached == 0


def test_profiler_rejects_impossible_requests() -> None:
    model = MockLM(MockSpec(vocab_size=16, n_ctx=64))
    ctx = profile_context(model, 60)
    with pytest.raises(ConfigError, match="positions"):
        verify_times(model, ctx, n_max=16, repeats=1)
    with pytest.raises(ConfigError):
        verify_times(model, [], n_max=2, repeats=1)
    with pytest.raises(ConfigError):
        verify_times(model, ctx[:10], n_max=0, repeats=1)


def test_param_count_and_flops_ratio() -> None:
    class WithCount:
        n_params = 500

    class Wrapped:
        model = type("M", (), {"num_parameters": lambda self: 1500})()

    assert param_count(WithCount()) == 500
    assert param_count(Wrapped()) == 1500
    assert param_count(MockLM()) is None
    assert flops_cost_ratio(500, 1500) == pytest.approx(1 / 3)
    assert flops_cost_ratio(None, 1500) is None


class DriftingMock(TimedMock):
    """A TimedMock whose passes take ``factors[m]`` times as long while the cache holds m
    tokens (a machine that is slower for a while), and whose pass of
    ``dip`` rows (if any) is as fast as a pass of one row."""

    def __init__(self, clock: FakeClock, factors: dict[int, float], dip: int | None = None) -> None:
        super().__init__(clock, base=0.02, per_token=0.01)
        self.factors = factors
        self.dip = dip

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        n = 1 if self.dip is not None and len(tokens) == self.dip else len(tokens)
        f = self.factors.get(self.n_cached, 1.0)
        self.clock.now += f * (self.base + self.per_token * (n - 1)) - (
            self.base + self.per_token * (len(tokens) - 1)
        )
        return super().extend(tokens)


def context_curve(model: MockLM, samples: Any, *, n_max: int, **kw: Any) -> list[float]:
    """The curve as the profile builds it: ``curve_from_ratios`` of ``curve_ratios``."""
    return curve_from_ratios(curve_ratios(model, samples, n_max=n_max, **kw), n_max)


def _contexts(model: MockLM, lengths: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    ctx = profile_context(model, max(lengths) + 20)
    return [(ctx[:m], ctx[m : m + 20]) for m in lengths]


def test_context_curve_is_the_shape_of_passes_at_each_context() -> None:
    clock = FakeClock()
    model = TimedMock(clock, base=0.02, per_token=0.005)
    shape = context_curve(model, _contexts(model, [30, 60]), n_max=8, ns=(2, 4), clock=clock)
    # timed at 2, 4 and 8, the others interpolated (linear here, so exact)
    assert shape == pytest.approx([(0.02 + 0.005 * (n - 1)) / 0.02 for n in range(1, 9)])
    timed = [(at, n) for at, n in model.extended_at if n <= 8]
    assert sorted(timed) == sorted([(m, n) for m in (30, 60) for n in (1, 1, 1, 2, 4, 8)])
    # the second context extends the first: its cache is extended, not prefilled again
    assert [(at, n) for at, n in model.extended_at if n > 8] == [(0, 30), (30, 30)]
    assert model.n_cached == 60  # left holding the last context


def test_context_curve_pairs_each_context_with_its_own_plain_passes() -> None:
    # the machine is 3x slower while the second context is timed: each context's passes are
    # divided by that context's own 1-row passes, so the shape is still exact (against the
    # first context's 1-row time the slow context would read 4.5 at n = 2, the median 3.0)
    clock = FakeClock()
    model = DriftingMock(clock, {60: 3.0})
    shape = context_curve(model, _contexts(model, [30, 60]), n_max=4, ns=(2, 3), clock=clock)
    assert shape == pytest.approx([1.0, 1.5, 2.0, 2.5])


def test_context_curve_never_decreases() -> None:
    clock = FakeClock()
    model = DriftingMock(clock, {}, dip=3)  # a pass of 3 rows as fast as one of 1
    shape = context_curve(model, _contexts(model, [30]), n_max=4, ns=(2, 3), clock=clock)
    assert shape == pytest.approx([1.0, 1.5, 1.5, 2.5])
    with pytest.raises(ConfigError):
        curve_ratios(model, [], n_max=4)
    with pytest.raises(ConfigError):
        curve_ratios(model, _contexts(model, [500]), n_max=16)  # no room in n_ctx 512


def test_curve_ratios_truncates_a_cache_that_holds_a_longer_run() -> None:
    clock = FakeClock()
    model = TimedMock(clock, base=0.02, per_token=0.005)
    samples = _contexts(model, [60, 30])
    extend_last(model, samples[0][0] + samples[0][1])  # a run's cache: all of it
    model.extended_at.clear()
    ratios = curve_ratios(model, samples, n_max=4, ns=(2,), clock=clock)
    assert ratios[2] == pytest.approx([1.25, 1.25]) and ratios[4] == pytest.approx([1.75] * 2)
    assert all(n <= 4 for _, n in model.extended_at)  # no prefill: only timed passes
    assert model.n_cached == 30  # left holding the last context
