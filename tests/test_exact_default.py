"""Exact numerics by default (profiler.exact_default): decided once per machine, build, model
and thread count, cached, and only where the patched build's price is at most 3 %; a build
without the row-invariant mode keeps llama.cpp's numerics with one line saying why."""

from __future__ import annotations

import json

import pytest

from specdec.profiler import cache
from specdec.profiler.exact_default import (
    FORMAT,
    NO_MODE,
    ExactDefault,
    decide,
    exact_default,
)
from specdec.profiler.exact_price import ExactPrice


def price(step: float = 1.0, verify: float = 1.0, prefill: float = 1.0) -> ExactPrice:
    """Exact numerics' figures at the given ratios over the default's."""
    return ExactPrice(
        step_s=0.040,
        exact_step_s=0.040 * step,
        prefill_tps=100.0,
        exact_prefill_tps=100.0 / prefill,
        rounds=2,
        verify_s=0.200,
        exact_verify_s=0.200 * verify,
    )


def test_the_decision_follows_the_dearest_figure() -> None:
    assert decide(price(1.02, 1.01, 1.025)).exact
    for dear in (price(step=1.05), price(verify=1.04), price(prefill=1.2)):
        d = decide(dear)
        assert not d.exact and "more than 3%" in d.reason


@pytest.mark.parametrize(
    ("exact_costs", "rounds", "default"),
    [
        ([1.00, 1.01], 2, True),  # clear yes: two rounds
        ([1.30, 1.30], 2, False),  # clear no (30 %): two rounds
        ([1.00, 1.08], 2, True),  # dearer in one round only: noise, not a price
        ([1.08, 1.06, 1.00, 1.00], 4, True),  # dearer in both, within noise: two more
        ([1.06, 1.06, 1.05, 1.07], 4, False),  # unsure each time: at most four
    ],
)
def test_an_unsure_no_is_measured_again_before_it_is_the_verdict(
    exact_costs: list[float], rounds: int, default: bool
) -> None:
    """A figure dearer than 3 % in every round is a price; a "no" within what noise reaches
    (at most UNSURE_COST in its cheapest round) gets two more rounds, up to MAX_ROUNDS (four);
    clear verdicts stop at two (fixed worker figures: the i-th exact
    worker's figures are the i-th cost times the default's)."""
    from specdec.profiler.exact_price import MAX_ROUNDS, measure_exact_price

    seen = {"default": 0, "exact": 0}

    def worker(path: str, numerics: str, threads: int | None) -> dict[str, float]:
        i = seen[numerics]
        seen[numerics] += 1
        c = exact_costs[i] if numerics == "exact" else 1.0
        return {"step_s": 0.04 * c, "verify_s": 0.2 * c, "prefill_tps": 100.0 / c}

    got = measure_exact_price("m.gguf", 2, worker=worker)
    assert got.rounds == rounds == seen["exact"] == seen["default"] <= MAX_ROUNDS
    assert got.default is default
    assert ExactPrice.from_dict(got.to_dict()) == got


def test_a_cached_price_with_damaged_per_round_figures_is_refused() -> None:
    good = {**price().to_dict(), "least_costs": [0.0, 0.01, 0.02]}
    assert ExactPrice.from_dict(good).least_costs == (0.0, 0.01, 0.02)
    for bad in ([0.0, 0.01], "x", [0.0, float("nan"), 0.0], [True, 0.0, 0.0]):
        with pytest.raises(ValueError, match="least_costs"):
            ExactPrice.from_dict({**good, "least_costs": bad})


class Counter:
    def __init__(self, result: ExactPrice) -> None:
        self.calls = 0
        self.result = result

    def __call__(self, path: str, n_threads: int | None) -> ExactPrice:
        self.calls += 1
        return self.result


def test_measured_once_then_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    measure, lines = Counter(price(1.01, 0.99, 1.0)), []
    first = exact_default("m.gguf", "/x/m.gguf", 2, log=lines.append, measure=measure,
                          identity=("a" * 64, 6))  # fmt: skip
    assert first.exact and measure.calls == 1
    assert len(lines) == 2 and "measuring" in lines[0] and "the default here" in lines[1]
    again = exact_default("m.gguf", "/x/m.gguf", 2, log=lines.append, measure=measure,
                          identity=("a" * 64, 6))  # fmt: skip
    assert again == first and measure.calls == 1 and len(lines) == 2  # silent from the cache
    # another build (library), thread count or model: decided again
    exact_default("m.gguf", "/x/m.gguf", 2, measure=measure, identity=("b" * 64, 6))
    exact_default("m.gguf", "/x/m.gguf", 1, measure=measure, identity=("a" * 64, 6))
    exact_default("n.gguf", "/x/n.gguf", 2, measure=measure, identity=("a" * 64, 6))
    assert measure.calls == 4
    # no thread count is every core's: the decision of that count, not a second one
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    exact_default("m.gguf", "/x/m.gguf", None, measure=measure, identity=("a" * 64, 6))
    assert measure.calls == 4


def test_a_dear_price_keeps_llama_cpps_numerics(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    d = exact_default("m.gguf", "/x", None, measure=Counter(price(verify=1.09)),
                      identity=("a" * 64, 6))  # fmt: skip
    assert not d.exact and d.price is not None


def test_a_build_without_the_mode_is_not_measured(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    measure, lines = Counter(price()), []
    d = exact_default("m.gguf", "/x", 2, log=lines.append, measure=measure,
                      identity=("c" * 64, 0))  # fmt: skip
    assert not d.exact and d.reason == NO_MODE and measure.calls == 0
    assert lines == [NO_MODE]  # one line, once
    exact_default("m.gguf", "/x", 2, log=lines.append, measure=measure, identity=("c" * 64, 0))
    assert lines == [NO_MODE]


@pytest.mark.parametrize(
    "entry",
    [
        [],
        {"format": FORMAT, "exact": "yes", "reason": "r", "price": None},
        {"format": FORMAT, "exact": True, "reason": 3, "price": None},
        {"format": FORMAT, "exact": True, "reason": "r", "price": {"step_s": "fast"}},
        {"format": FORMAT, "exact": True, "reason": "r", "price": price(verify=1.5).to_dict()},
        {"format": 99, "exact": True, "reason": "r", "price": None},
        {"format": 1, "exact": False, "reason": "r", "price": None},  # the medians' rule
    ],
)
def test_a_damaged_cache_entry_is_decided_again(tmp_path, monkeypatch, entry) -> None:
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    measure = Counter(price(1.0, 1.0, 1.0))
    ident = ("d" * 64, 6)
    exact_default("m.gguf", "/x", 2, measure=measure, identity=ident)
    (path,) = list(tmp_path.glob("*.json"))
    key = json.loads(path.read_text())["key"]
    data = {"key": key, **entry} if isinstance(entry, dict) else entry
    path.write_text(json.dumps(data))
    assert ExactDefault.from_dict(cache.load_cached(key)) is None
    again = exact_default("m.gguf", "/x", 2, measure=measure, identity=ident)
    assert again.exact and measure.calls == 2


def test_resolve_decides_only_for_llama_cpp_targets(monkeypatch) -> None:
    from specdec import configuration
    from specdec.pairs import ModelOptions

    asked: list[str] = []

    def fake(model, path, n_threads, *, log):
        asked.append(model)
        return ExactDefault(True, "cheap here")

    monkeypatch.setattr("specdec.profiler.exact_default.exact_default", fake)
    mock = configuration.resolve("mock:vocab=16", "none", ModelOptions(target_backend="mock"))
    assert not mock.target.exact and asked == []
    # a GGUF file that does not exist is left to the load to report: no decision
    missing = configuration.resolve("/nowhere/x.gguf", "none", ModelOptions())
    assert not missing.target.exact and asked == []
    # said either way: nothing decided
    said = configuration.resolve("/nowhere/x.gguf", "none", ModelOptions(exact=False))
    assert not said.target.exact and asked == []


def test_resolve_takes_the_decision_for_an_existing_gguf(tmp_path, monkeypatch) -> None:
    from specdec import configuration
    from specdec.pairs import ModelOptions
    from test_hostile_inputs_round3 import write_gguf

    gguf = write_gguf(tmp_path / "t.gguf")  # a valid header, never loaded here
    lines: list[str] = []

    def fake(model, path, n_threads, *, log):
        log("decided")
        return ExactDefault(True, "cheap here")

    monkeypatch.setattr("specdec.profiler.exact_default.exact_default", fake)
    fits = ModelOptions(n_ctx=2048)  # the file's context length
    cfg = configuration.resolve(str(gguf), "none", fits, log=lines.append)
    assert cfg.target.exact and lines == ["decided"]
    off = configuration.resolve(str(gguf), "none", ModelOptions(n_ctx=2048, exact=False))
    assert not off.target.exact
    # a window the load will refuse (4096 > 2048) is not measured either
    lines.clear()
    too_long = configuration.resolve(str(gguf), "none", ModelOptions(), log=lines.append)
    assert not too_long.target.exact and lines == []
    # a file the load will refuse is not measured: the load's one-line error comes first
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF")
    lines.clear()
    assert not configuration.resolve(
        str(bad), "none", ModelOptions(), log=lines.append
    ).target.exact
    assert lines == []


def test_a_default_exact_load_refused_by_its_self_check_runs_plain_numerics(
    monkeypatch,
) -> None:
    """Exact numerics decided by default, then refused at the load (in a process where a
    model on default numerics already ran, ggml's once-per-process switches are set: CI's
    `demo` test met it): `specdec.load` loads llama.cpp's numerics with one line saying
    why; exact numerics the caller asked for stay a refusal."""
    import specdec.api as api
    from specdec.models.exact import NotExactError

    loads: list[bool] = []
    real = api.load_pair

    def load_pair(draft, target, **kw):
        loads.append(target.exact)
        if target.exact:
            raise NotExactError("t.gguf is not batch-invariant on this build and machine")
        return real(draft, replace(target, model="mock:target:16", backend="mock"), **kw)

    from dataclasses import replace

    monkeypatch.setattr(api, "load_pair", load_pair)
    monkeypatch.setattr("specdec.configuration.default_numerics", lambda *a, **k: True)
    lines: list[str] = []
    pair = api.load("/x/t.gguf", "none", log=lines.append)
    assert loads == [True, False] and not pair.config.target.exact
    assert "refused their self-check" in pair.config.numerics_note
    assert any("exact numerics refused their self-check" in x and "t.gguf" in x for x in lines)
    loads.clear()
    with pytest.raises(NotExactError, match="batch-invariant"):
        api.load("/x/t.gguf", "none", exact=True)
    assert loads == [True]


def test_exact_numerics_that_fail_to_run_are_not_the_default(tmp_path, monkeypatch) -> None:
    """A build whose kernels the patch does not cover fails the load-time check (or the
    measuring workers fail): llama.cpp's numerics stay, with the reason, and no traceback."""
    from specdec.errors import SpecdecError

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))

    def failing(path: str, n_threads: int | None) -> ExactPrice:
        raise SpecdecError("measuring exact numerics failed: NotExactError: row 1 differs")

    lines: list[str] = []
    d = exact_default("m.gguf", "/x", 2, log=lines.append, measure=failing,
                      identity=("e" * 64, 6))  # fmt: skip
    assert not d.exact and "row 1 differs" in d.reason and lines[-1] == d.reason


def test_the_summary_line_says_on_or_off_and_the_measured_cost() -> None:
    from specdec.profiler.exact_default import summary

    on = summary(True, decide(price(1.009, 0.99, 1.02)))
    assert on.startswith("exact numerics on") and "plain step +0.9%" in on and "cached" in on
    off = summary(False, decide(price(verify=1.2)))
    assert off.startswith("exact numerics off") and "+20.0%" in off
    forced = summary(True, decide(price(verify=1.2)))
    assert "as asked" in forced
    assert "stock library" in summary(False, ExactDefault(False, NO_MODE))
    assert summary(False, None).endswith("(as asked)")


class Machine:
    """``cpuload.sample`` of a machine on which other processes use ``others`` of the CPUs
    and this process (its measurement workers included) ``own`` of them."""

    def __init__(self) -> None:
        self.others, self.own, self.n = 0.0, 0.0, 0

    def sample(self) -> object:
        from specdec.util.cpuload import CpuSample

        self.n += 1  # 10 s and 20 CPU-seconds (2 cores) per reading
        busy = self.n * 20 * (self.others + self.own)
        return CpuSample(self.n * 10.0, busy, self.n * 20.0, self.n * 20 * self.own)


def test_a_no_measured_on_a_busy_machine_is_measured_again(tmp_path, monkeypatch) -> None:
    """One rule with ``util.cpuload``'s (merge of issues 61 and 62): a "no" measured while
    other processes used more than ``$SPECDEC_BUSY_SHARE`` of the CPUs is not cached; a
    "yes" is; the measurement's own CPU time is not other load."""
    from specdec.util import cpuload

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    monkeypatch.setenv("SPECDEC_BUSY_SHARE", "0.25")  # conftest turns the check off
    machine = Machine()
    monkeypatch.setattr(cpuload, "sample", machine.sample)
    dear, lines = Counter(price(1.10, 1.0, 1.0)), []
    args = ("m.gguf", "/x/m.gguf", 2)
    machine.others = 0.6
    for _ in range(2):  # busy: others used 60 %, decided each time, never cached
        got = exact_default(*args, log=lines.append, measure=dear, identity=("a" * 64, 6))
        assert not got.exact
    assert dear.calls == 2 and any("busy" in ln and "60%" in ln for ln in lines), lines
    machine.others, machine.own = 0.05, 0.9  # the measurement's own workers: not other load
    quiet = exact_default(*args, measure=dear, identity=("a" * 64, 6))
    assert not quiet.exact and dear.calls == 3
    machine.others, machine.own = 0.6, 0.0
    exact_default(*args, measure=dear, identity=("a" * 64, 6))
    assert dear.calls == 3  # the quiet machine's no is cached
    # a yes is cached however busy the machine was (its error costs speed, not exactness)
    cheap = Counter(price(1.0, 1.0, 1.0))
    exact_default("n.gguf", "/x/n.gguf", 2, measure=cheap, identity=("a" * 64, 6))
    exact_default("n.gguf", "/x/n.gguf", 2, measure=cheap, identity=("a" * 64, 6))
    assert cheap.calls == 1


def test_demo_and_serve_start_with_the_numerics_line(tmp_path, monkeypatch) -> None:
    from types import SimpleNamespace

    from specdec.cli.common import numerics_line

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    on = numerics_line(SimpleNamespace(target=SimpleNamespace(exact=True)), "m.gguf", 2)
    off = numerics_line(SimpleNamespace(target=SimpleNamespace(exact=False)), "m.gguf", 2)
    assert on.startswith("exact numerics on") and off.startswith("exact numerics off")
    mock = numerics_line(SimpleNamespace(target=object()), "mock", 2)
    assert "not a llama.cpp target" in mock
