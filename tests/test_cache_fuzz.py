"""Caches and records are untrusted input (issue 62, item 8): every cache and record specdec
reads back is fed random JSON (every type, nesting, size; mutations of a valid entry, field by
field) and things that are not regular files (a FIFO, a link to /dev/zero, a directory, a
file over the bound, 2,000 levels of nesting). The reader gives a clean answer (the entry, or
nothing: measured again) or one clear line, never a traceback, never a hang (a 60 s alarm
guards each test); what a reader prints carries no control character.

Readers: the kernel check's verdicts, the exact-numerics check's verdicts, the profile cache
(``profiles/<key>.json``: the profile itself and the target's measured costs), and the record
``make install`` leaves (``llama-build.json``, as doctor and the results files read it).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specdec.errors import SpecdecError

SEED = 20262  # fixed: the same cases every run
CASES = 300  # random values per reader
GUARD_S = 60


@pytest.fixture(autouse=True)
def _bounded_in_time() -> Iterator[None]:
    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"a reader ran for more than {GUARD_S} s (a hang)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(GUARD_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# -- the values ---------------------------------------------------------------------------------

NASTY_TEXT = [
    "",
    "\x1b[2K\x1b[31mPASS\x1b[0m",
    "\x1b]8;;http://x\x07link\x1b]8;;\x07",
    "line\nbreak",
    "\u202egnp.exe",
    "<img src=x onerror=alert(1)>",
    "x" * 100_000,
    "all",
    "none",
    "avoid:CPU_REPACK",
]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """One JSON value of any type, nested up to 4 deep, small or large."""
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**70), rng.randrange(-1000, 1000)])
    if kind == 3:
        return rng.choice([0.0, -1.5, 1e308, -1e-308, math.inf, -math.inf, math.nan, rng.random()])
    if kind in (4, 5):
        return rng.choice(NASTY_TEXT)
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    keys = ["choice", "listed", "trials", "key", "verify_s", "costs", "k", "candidate", "x"]
    return {
        rng.choice(keys + NASTY_TEXT[:4]): random_json(rng, depth + 1)
        for _ in range(rng.randrange(0, 6))
    }


def mutations(valid: dict[str, Any], rng: random.Random, n: int) -> Iterator[Any]:
    """Random values, then the valid entry with one field (at any depth) replaced or removed."""
    for i in range(n):
        if i % 3 == 0:
            yield random_json(rng)
            continue
        entry = json.loads(json.dumps(valid))
        node: Any = entry
        path = []
        while isinstance(node, dict | list) and node and rng.random() < 0.6:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append(key)
            if isinstance(node[key], dict | list) and node[key]:
                node = node[key]
            else:
                break
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
            if rng.random() < 0.2:
                del node[key]
            else:
                node[key] = random_json(rng)
        elif isinstance(node, list) and node:
            node[rng.randrange(len(node))] = random_json(rng)
        yield entry


def write_value(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for other in (path,):
        if other.is_dir() and not other.is_symlink():
            other.rmdir()
        elif other.exists() or other.is_symlink():
            other.unlink()
    path.write_text(json.dumps(value, allow_nan=True))


def plant(path: Path, kind: str) -> None:
    """Something that is not a regular JSON file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "deep":
        path.write_text("[" * 2000 + "]" * 2000)
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(80 << 20)  # sparse: larger than every bound
    elif kind == "not-utf8":
        path.write_bytes(b'{"choice": "\xff\xfe"}')
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        raise AssertionError(kind)


PLANTED = ["fifo", "dev-zero", "directory", "deep", "huge", "not-utf8", "empty"]


class Outcomes:
    """What the cases came to: 'entry' (read and used), 'nothing' (ignored: measured again),
    'one line' (a SpecdecError); anything else fails the test at once."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def run(self, read: Callable[[], Any]) -> Any:
        try:
            got = read()
        except SpecdecError as e:
            assert "\n" not in str(e)
            self.counts["one line"] = self.counts.get("one line", 0) + 1
            return None
        kind = "nothing" if got is None or got == [] else "entry"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return got


def assert_printable(line: str | None) -> None:
    if line is not None:
        assert line.isprintable(), repr(line[:200])


# -- the kernel check's and the exact check's verdicts ------------------------------------------

KERNEL_VALID = {
    "listed": ["CPU_REPACK"],
    "choice": "avoid:CPU_REPACK",
    "trials": [{"choice": "all", "outcome": "signal", "detail": "SIGSEGV", "seconds": 1.5}],
    "key": "k1",
    "model": "m.gguf",
    "weights": ["q4_K"],
    "created": "2026-01-01T00:00:00+00:00",
}
EXACT_VALID = {
    "choice": "all",
    "groups": ["CPU_REPACK:q4_K"],
    "avoid": ["CPU_REPACK:q4_K"],
    "trials": [{"kept": ["CPU_REPACK:q4_K"], "exact": False, "detail": "row 3", "seconds": 2.0}],
    "key": "k1",
    "model": "m.gguf",
    "created": "2026-01-01T00:00:00+00:00",
}


@pytest.mark.parametrize("which", ["kernel", "exact"])
def test_verdict_caches_take_any_json_and_anything_that_is_no_file(
    which: str, tmp_path: Path
) -> None:
    if which == "kernel":
        from specdec.llama_trust import kernel_check as mod

        valid = KERNEL_VALID
    else:
        from specdec.llama_trust import exact_kernels as mod  # type: ignore[no-redef]

        valid = EXACT_VALID
    entry = tmp_path / "k1.json"
    outcomes = Outcomes()
    rng = random.Random(SEED)
    for value in [valid, *mutations(valid, rng, CASES)]:
        write_value(entry, value)
        for verdict in outcomes.run(lambda: mod.cached_verdicts(tmp_path)) or []:
            assert_printable(verdict.notice())
    for kind in PLANTED:
        plant(entry, kind)
        assert outcomes.run(lambda: mod.cached_verdicts(tmp_path)) in (None, [])
    print(f"{which} verdicts: {outcomes.counts}")  # the closing note's table (pytest -s)
    assert outcomes.counts.get("entry", 0) >= 1  # the valid one, at least, is read
    assert set(outcomes.counts) <= {"entry", "nothing"}


def test_a_cached_verdict_cannot_write_to_the_terminal(tmp_path: Path) -> None:
    """The kernel-check notice printed a cached verdict's strings raw to stderr (ANSI / OSC
    escapes repainted the terminal)."""
    from specdec.llama_trust.kernel_check import cached_verdicts

    forged = dict(KERNEL_VALID)
    forged["trials"] = [
        {
            "choice": "all",
            "outcome": "\x1b[2K\x1b[32mok",
            "detail": "\x1b]0;pwned\x07",
            "seconds": 1,
        }
    ]
    write_value(tmp_path / "k1.json", forged)
    (verdict,) = cached_verdicts(tmp_path)
    line = verdict.notice()
    assert line is not None and "\x1b" not in line and line.isprintable()
    assert "\\x1b" in line  # shown, escaped


# -- the profile cache: the target's costs and a whole profile ----------------------------------


def _costs_entry(n: int = 65) -> dict[str, Any]:
    return {
        "costs": {
            "verify_s": [0.01 * (1 + i / 8) for i in range(n)],
            "prefill_tps": 250.0,
            "draft_token_s": 0.0,
            "draft_round_s": 0.0,
            "draft_prefill_tps": math.inf,
            "row_s": 1e-4,
            "round_s": 1e-4,
        },
        "model": "mock:target",
    }


def test_cost_entries_take_any_json() -> None:
    """Non-numeric verify_s or row_s were a traceback (or costs that planned with nonsense)."""
    from specdec.profiler.target_costs import cached_costs
    from specdec.theory import Costs

    outcomes = Outcomes()
    rng = random.Random(SEED)
    for value in [_costs_entry(), *mutations(_costs_entry(), rng, CASES)]:
        got = outcomes.run(lambda v=value: cached_costs(v if isinstance(v, dict) else None))
        if got is not None:
            assert isinstance(got, Costs)
            assert all(math.isfinite(v) and v > 0 for v in got.verify_s)
            got.round_seconds(4)  # usable by the planner
    print(f"cost entries: {outcomes.counts}")
    assert set(outcomes.counts) <= {"entry", "nothing"} and outcomes.counts["entry"] >= 1


def _mock_target() -> Any:
    from specdec.models.mock import MockLM, MockSpec

    return MockLM(MockSpec(vocab_size=32, n_ctx=512))


def _cfg() -> Any:
    from specdec.models.loader import ModelConfig

    return ModelConfig("mock:target", "mock", n_ctx=512)


@pytest.mark.parametrize("kind", ["garbage", *PLANTED])
def test_a_damaged_cost_entry_is_measured_again_with_one_line(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec.profiler import cache
    from specdec.profiler.target_costs import cached_target_costs, costs_key

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    path = cache.profile_dir() / f"{costs_key(_cfg())}.json"
    if kind == "garbage":
        entry = _costs_entry()
        entry["key"] = costs_key(_cfg())
        entry["costs"]["verify_s"][3] = "fast"
        write_value(path, entry)
    else:
        plant(path, kind)
    lines: list[str] = []
    costs = cached_target_costs(_cfg(), _mock_target(), log=lines.append)
    assert len(costs.verify_s) >= 16
    damaged = [ln for ln in lines if " are damaged " in ln or ln.startswith("ignoring the damaged")]
    assert len(damaged) == 1, lines
    assert all(ln.isprintable() for ln in lines)


def test_an_unwritable_cost_cache_costs_a_line_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It measured, then failed with nothing generated, every run, leaving 0-byte .tmp files."""
    from specdec.profiler import cache
    from specdec.profiler.target_costs import cached_target_costs, costs_key

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    (cache.profile_dir() / f"{costs_key(_cfg())}.json").mkdir(parents=True)  # no file there
    lines: list[str] = []
    costs = cached_target_costs(_cfg(), _mock_target(), log=lines.append)
    assert costs.verify_s and any("could not cache" in ln for ln in lines), lines
    assert not list(tmp_path.rglob("*.tmp"))
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("SPECDEC_PROFILES", str(blocked / "profiles"))  # a file on the way
    lines.clear()
    assert cached_target_costs(_cfg(), _mock_target(), log=lines.append).verify_s
    assert any("could not cache" in ln for ln in lines), lines


def test_costs_measured_under_load_are_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Costs measured on a busy machine were cached for good (prefill 21.7 vs 244 tok/s)."""
    from specdec.profiler import cache
    from specdec.profiler.target_costs import cached_target_costs, costs_key
    from specdec.util import cpuload

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    monkeypatch.setenv("SPECDEC_BUSY_SHARE", "0.25")
    samples = iter(
        [
            cpuload.CpuSample(wall_s=0, busy_s=0, total_s=0, own_s=0),
            cpuload.CpuSample(wall_s=10, busy_s=16, total_s=20, own_s=8),  # others: 40 %
            cpuload.CpuSample(wall_s=0, busy_s=0, total_s=0, own_s=0),
            cpuload.CpuSample(wall_s=10, busy_s=9, total_s=20, own_s=8),  # others: 5 %
        ]
    )
    monkeypatch.setattr(cpuload, "sample", lambda: next(samples))
    path = cache.profile_dir() / f"{costs_key(_cfg())}.json"
    lines: list[str] = []
    cached_target_costs(_cfg(), _mock_target(), log=lines.append)
    assert not path.exists() and any("40% of the CPUs" in ln for ln in lines), lines
    cached_target_costs(_cfg(), _mock_target(), log=lines.append)  # quiet now: cached
    assert path.is_file()


def test_the_load_criterion_sees_a_process_that_spins() -> None:
    """The criterion on the real kernel counts: two spinning processes while this one sleeps
    make the others' share of a 2-core machine well above the limit (threshold 0.3 here;
    each spinner alone is half of it)."""
    import subprocess
    import time

    from specdec.util import cpuload

    if cpuload.sample() is None:
        pytest.skip("no /proc/stat here")
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 3: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        before = cpuload.sample()
        time.sleep(1.5)
        share = cpuload.others_share(before, cpuload.sample())
    finally:
        for p in procs:
            p.wait(10)
    assert share is not None and share > 0.3, share


def test_a_bad_busy_share_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.util import cpuload

    for bad in ("nan", "0", "2", "lots"):
        monkeypatch.setenv("SPECDEC_BUSY_SHARE", bad)
        with pytest.raises(SpecdecError, match="SPECDEC_BUSY_SHARE"):
            cpuload.busy_limit()


PROMPTS = ["def f(x):\n    return x + 1\n" * 3]


def _profile_spec() -> Any:
    from specdec.profiler.run import ProfileSpec

    return ProfileSpec(
        target="mock:target",
        target_backends=("mock",),
        drafts=("ngram",),
        draft_backend="mock",
        n_new=8,
        k_model=(1, 2),
        k_free=(2, 4),
        check_top=0,
        n_ctx=512,
    )


@pytest.fixture(scope="module")
def profile_entry(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real profile of mock models, as the cache holds it."""
    from specdec.profiler.run import run_profile

    old = os.environ.get("SPECDEC_PROFILES")
    os.environ["SPECDEC_PROFILES"] = str(tmp_path_factory.mktemp("profile"))
    try:
        result = run_profile(_profile_spec(), PROMPTS)
    finally:
        if old is None:
            os.environ.pop("SPECDEC_PROFILES", None)
        else:
            os.environ["SPECDEC_PROFILES"] = old
    entry: dict[str, Any] = json.loads(json.dumps(result.to_dict()))
    return entry


def test_profiles_take_any_json(profile_entry: dict[str, Any]) -> None:
    from specdec.profiler.run import ProfileResult

    ProfileResult.from_dict(profile_entry)  # the real one is read
    outcomes = Outcomes()
    rng = random.Random(SEED)
    for value in mutations(profile_entry, rng, CASES):

        def read(v: Any = value) -> Any:
            try:
                return ProfileResult.from_dict(v)
            except ValueError:
                return None

        outcomes.run(read)
    print(f"profiles: {outcomes.counts}")
    assert set(outcomes.counts) <= {"entry", "nothing"}
    assert outcomes.counts.get("nothing", 0) > CASES // 4


@pytest.mark.parametrize("kind", ["garbage", "fifo", "deep", "directory"])
def test_a_damaged_profile_is_profiled_again_with_one_line(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile_entry: dict[str, Any]
) -> None:
    from specdec.profiler import cache
    from specdec.profiler.run import profile_cache_key, run_profile

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    key = profile_cache_key(_profile_spec(), PROMPTS)
    path = cache.profile_dir() / f"{key}.json"
    if kind == "garbage":
        damaged = json.loads(json.dumps(profile_entry))
        damaged["key"] = key
        label = next(iter(damaged["costs"]))
        damaged["costs"][label]["row_s"] = "\x1b[31mslow"
        write_value(path, damaged)
    else:
        plant(path, kind)
    lines: list[str] = []
    result = run_profile(_profile_spec(), PROMPTS, log=lines.append)
    assert result.recommendation
    assert sum(ln.startswith("ignoring the damaged") for ln in lines) == 1, lines
    assert all(ln.isprintable() for ln in lines)


# -- the record `make install` leaves ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["garbage", *PLANTED])
def test_the_make_install_record_is_read_safely(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-build.json as a FIFO hung doctor, as /dev/zero filled memory, 2,000 levels deep
    was a RecursionError, and wrong types were a traceback in doctor's lines; `make install`
    reads it too (build_flags.installed_record, whether its build is already in place)."""
    from specdec.doctor import format_report, gather
    from specdec.llama_trust.build_flags import RECORD, installed_record
    from specdec.llama_trust.kernel_check import make_install_record

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    path = tmp_path / RECORD
    if kind == "garbage":
        write_value(path, {"reason": "\x1b[31mred", "cmake_args": 5})
    else:
        plant(path, kind)
    record = make_install_record()
    assert record is None or isinstance(record, dict)
    assert installed_record(str(tmp_path)) == record  # the build's own reader agrees
    report = gather()  # doctor itself, reading the record where it lies
    assert report["llama_cpp"].get("built_by_make_install") == record
    text = format_report(report)
    assert "\x1b" not in text and "Traceback" not in text


def test_make_install_record_fuzz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.llama_trust.build_flags import RECORD
    from specdec.llama_trust.kernel_check import make_install_record

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    rng = random.Random(SEED)
    outcomes = Outcomes()
    for _ in range(CASES):
        write_value(tmp_path / RECORD, random_json(rng))
        got = outcomes.run(make_install_record)
        assert got is None or isinstance(got, dict)
    print(f"make install records: {outcomes.counts}")
    assert set(outcomes.counts) <= {"entry", "nothing"}


# -- exact numerics by default: the cached decision (profiler.exact_default) ---------------------


def _price_dict() -> dict[str, Any]:
    from specdec.profiler.exact_price import ExactPrice

    return ExactPrice(0.04, 0.0404, 100.0, 99.0, 2, 0.2, 0.201).to_dict()


def _exact_default_entry() -> dict[str, Any]:
    from specdec.profiler.exact_default import decide
    from specdec.profiler.exact_price import ExactPrice

    return decide(ExactPrice.from_dict(_price_dict())).to_dict()


IDENT = ("a" * 64, 6)


class _Measure:
    """A measurement returning ``_price_dict``'s figures (exact numerics the default), or with
    exact numerics' step ``cost`` times plain's (1.10: not the default)."""

    def __init__(self, cost: float | None = None) -> None:
        self.calls, self.cost = 0, cost

    def __call__(self, path: str, n_threads: int | None) -> Any:
        from specdec.profiler.exact_price import ExactPrice

        self.calls += 1
        figures = _price_dict()
        if self.cost is not None:
            figures["exact_step_s"] = figures["step_s"] * self.cost
        return ExactPrice.from_dict(figures)


def test_exact_default_entries_take_any_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached decision whose price held a string or a zero divided far from where it was
    read (a TypeError or ZeroDivisionError out of `specdec generate`); its reason was printed
    raw. Each case is read (cached: nothing measured) or decided again with one line."""
    from specdec.profiler import cache
    from specdec.profiler.exact_default import default_key, exact_default

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    key = default_key("m.gguf", 2, *IDENT)
    path = cache.profile_dir() / f"{key}.json"
    valid = {**_exact_default_entry(), "key": key}
    outcomes = Outcomes()
    rng = random.Random(SEED)
    cases: list[Any] = [valid, *mutations(valid, rng, CASES)]
    for value in cases + PLANTED:
        if isinstance(value, str) and value in PLANTED:
            plant(path, value)
        else:
            write_value(path, value)
        measure, lines = _Measure(), []

        def read(m: _Measure = measure, out: list[str] = lines) -> Any:
            d = exact_default("m.gguf", "/x", 2, log=out.append, measure=m, identity=IDENT)
            return d if m.calls == 0 else None  # measured again: the entry was not used

        got = outcomes.run(read)
        assert all(ln.isprintable() for ln in lines), lines
        if got is None:
            assert sum("damaged" in ln for ln in lines) == 1, lines
        elif got.price is not None:
            got.price.sentence()  # usable by the lines that print it
    print(f"exact-default entries: {outcomes.counts}")
    assert set(outcomes.counts) <= {"entry", "nothing"}
    assert outcomes.counts.get("entry", 0) >= 1 and outcomes.counts.get("nothing", 0) >= 1


def test_a_price_of_another_shape_is_a_value_error() -> None:
    from specdec.profiler.exact_price import ExactPrice

    bad_fields: list[tuple[str, Any]] = [
        ("step_s", "1"),
        ("exact_step_s", 0),
        ("prefill_tps", math.nan),
        ("exact_prefill_tps", True),
        ("rounds", 1.5),
        ("verify_s", -1.0),
    ]
    for field, bad in bad_fields:
        with pytest.raises(ValueError, match=field):
            ExactPrice.from_dict({**_price_dict(), field: bad})
    with pytest.raises(ValueError):
        ExactPrice.from_dict([1, 2])
    assert ExactPrice.from_dict({**_price_dict(), "verify_s": None}).verify_s is None


def test_an_unwritable_cache_or_a_busy_machine_leaves_the_exact_decision_uncached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unwritable cache made the first load of every llama.cpp target fail after its
    half-minute measurement; a price measured beside another job was cached for good."""
    from specdec.profiler import cache
    from specdec.profiler.exact_default import default_key, exact_default
    from specdec.util import cpuload

    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path))
    path = cache.profile_dir() / f"{default_key('m.gguf', 2, *IDENT)}.json"
    path.mkdir(parents=True)  # a directory where the entry goes
    lines: list[str] = []
    d = exact_default("m.gguf", "/x", 2, log=lines.append, measure=_Measure(), identity=IDENT)
    assert d.exact and any("could not cache" in ln for ln in lines), lines
    assert not list(tmp_path.rglob("*.tmp"))
    path.rmdir()
    monkeypatch.setenv("SPECDEC_BUSY_SHARE", "0.25")
    busy = iter([cpuload.CpuSample(0, 0, 0, 0), cpuload.CpuSample(10, 16, 20, 8)] * 2)  # 40 %
    monkeypatch.setattr(cpuload, "sample", lambda: next(busy))
    lines.clear()
    # a "no" (here every figure 10 % dearer) measured under load is not cached; a "yes" is
    # (main's rule from issue 61, kept at the merge: a wrong yes costs speed, not exactness)
    dear = _Measure(1.10)
    exact_default("m.gguf", "/x", 2, log=lines.append, measure=dear, identity=IDENT)
    assert not path.exists() and any("40% of the CPUs" in ln for ln in lines), lines
    exact_default("m.gguf", "/x", 2, log=lines.append, measure=_Measure(), identity=IDENT)
    assert path.exists()


def test_a_measurements_own_worker_processes_are_not_other_load() -> None:
    """Exact numerics are priced in worker processes (profile, exact default): their CPU time
    was counted as other processes' load, so such a measurement was never cached."""
    import subprocess

    from specdec.util import cpuload

    before = cpuload.sample()
    if before is None:
        pytest.skip("no /proc/stat here")
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
    subprocess.run([sys.executable, "-c", spin], check=True, timeout=120)
    after = cpuload.sample()
    assert after is not None and after.own_s - before.own_s >= 0.5  # the worker's time counted


def test_a_profile_with_a_damaged_exact_price_or_build_is_profiled_again(
    profile_entry: dict[str, Any],
) -> None:
    """A profile's exact-numerics price and build summary are read by `specdec profile`'s and
    `demo`'s lines: any value there is read or refused, and the lines never fail."""
    from specdec.llama_trust.kernel_check import build_line
    from specdec.profiler.exact_price import ExactPrice
    from specdec.profiler.run import ProfileResult

    valid = json.loads(json.dumps(profile_entry))
    valid["exact"] = _price_dict()
    valid["build"] = {
        "llama_cpp_python": "0.3",
        "make_install": {"reason": "native"},
        "exact_build": True,
        "kernels": {"listed": ["CPU_REPACK"], "disabled": []},
    }
    outcomes = Outcomes()
    rng = random.Random(SEED)
    for part in ("exact", "build"):
        for value in mutations(valid[part], rng, CASES // 3):

            def read(v: Any = value, p: str = part) -> Any:
                try:
                    result = ProfileResult.from_dict({**valid, p: v})
                except ValueError:
                    return None
                if result.exact:
                    ExactPrice.from_dict(result.exact).sentence()
                if result.build:
                    assert_printable(build_line(result.build))
                return result

            outcomes.run(read)
    print(f"profiles' exact and build: {outcomes.counts}")
    assert set(outcomes.counts) <= {"entry", "nothing"}
