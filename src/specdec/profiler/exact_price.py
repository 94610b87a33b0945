"""What exact numerics (``models.exact``) cost on this machine, and whether they are the default.

Exact numerics make speculative output plain decoding's, bit for bit, at a price that depends on
the CPU: llama.cpp's repacked and tiled kernels, which they turn off, are faster on some CPUs
than on others. ``specdec profile`` measures it: short worker processes alternate (ggml reads
GGML_CPU_TILED_MM once per process, so each numerics needs a process of its own), each timing
the target's one-token step after a 100-token context (median of ``STEPS``), a verify pass of
``VERIFY_ROWS`` tokens there (median of ``VERIFIES``) and a 128-token prefill (median of
``PREFILLS``); each price reported is the ratio of the medians over the rounds. Exact numerics
are this machine's default unless one of the three costs more than ``DEFAULT_MAX_COST`` (3 %)
in every round (two rounds, four while the "no" is within noise: ``unsure``); otherwise they
are a mode (``--exact``) whose price the profile reports. Why every round: between worker
processes on a shared 2-core machine a figure moved by 10-20 % (benchmarks/results/
exact-default-decision.json), so the medians of two rounds flipped the verdict either way.
All three count because they can part: on an exact build the plain step can cost what the
default's does while verify passes and prefill, whose rows its row-invariant kernels compute
one at a time, cost far more (patch version 1, benchmarks/studies/README.md).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError

DEFAULT_MAX_COST = 0.03  # exact numerics are the default where decode costs at most this more
STEPS = 16  # timed one-token passes per worker
VERIFY_ROWS = 8  # the verify pass timed: a typical speculative round's (K = 7)
VERIFIES = 6  # timed verify passes per worker
PREFILL = 128  # prompt tokens timed per worker
PREFILLS = 3  # timed prefills per worker (median): one alone moved 10-15 % between processes
# rounds: two, and up to MAX_ROUNDS while the verdict is "not the default" by a margin that
# process-to-process noise here reaches (UNSURE_COST): a 3 % rule read off two rounds flipped
MAX_ROUNDS = 4
UNSURE_COST = 0.10
CONTEXT = 100  # context before the timed steps
NUMERICS = ("default", "exact")


@dataclass(frozen=True)
class ExactPrice:
    """Medians over the rounds of each numerics' step and verify pass (seconds) and prefill
    (tokens/s). A profile cached before verify passes were timed has them None: exact numerics
    are then not the default (their price is not known)."""

    step_s: float
    exact_step_s: float
    prefill_tps: float
    exact_prefill_tps: float
    rounds: int
    verify_s: float | None = None
    exact_verify_s: float | None = None
    # the least each figure cost over the rounds, each round's exact worker against the
    # default worker of the same round (step, verify, prefill); None in entries cached before
    least_costs: tuple[float, float, float] | None = None

    @property
    def decode_cost(self) -> float:
        """How much slower a plain step is under exact numerics (0.05: 5 % slower)."""
        return self.exact_step_s / self.step_s - 1.0

    @property
    def verify_cost(self) -> float | None:
        """How much slower a ``VERIFY_ROWS``-token verify pass is (None: not measured)."""
        if self.verify_s is None or self.exact_verify_s is None:
            return None
        return self.exact_verify_s / self.verify_s - 1.0

    @property
    def prefill_cost(self) -> float:
        """How much longer a prefill takes under exact numerics."""
        return self.prefill_tps / self.exact_prefill_tps - 1.0

    @property
    def cost(self) -> float | None:
        """The dearest of the three (None while the verify pass is not measured)."""
        verify = self.verify_cost
        return None if verify is None else max(self.decode_cost, verify, self.prefill_cost)

    @property
    def clear_cost(self) -> float | None:
        """The dearest figure's least cost over the rounds: above ``DEFAULT_MAX_COST`` only
        where some figure cost more than that in every round (None: not known)."""
        return None if self.least_costs is None else max(self.least_costs)

    @property
    def default(self) -> bool:
        """Whether exact numerics are this machine's default: none of plain step, verify pass
        and prefill costs more than ``DEFAULT_MAX_COST`` in every round. Between processes
        here a figure moves by 10-20 %, so a few per cent cannot be resolved in a minute; a
        price that shows in every round is a price, one that shows in some is noise, and the
        error of a wrong yes costs speed, not exactness. Entries cached without per-round
        figures: the medians' dearest figure, as before."""
        if self.cost is None:
            return False
        clear = self.clear_cost
        return (clear if clear is not None else self.cost) <= DEFAULT_MAX_COST

    def sentence(self) -> str:
        verdict = (
            "the default here"
            if self.default
            else f"not the default here (more than {DEFAULT_MAX_COST:.0%} in every round); "
            "use --exact"
        )
        return (
            f"exact numerics (speculative output = plain decoding, bit for bit): plain step "
            f"{1e3 * self.exact_step_s:.1f} ms vs {1e3 * self.step_s:.1f} ms "
            f"({self.decode_cost:+.1%}), {self._verify_text()}prefill "
            f"{self.exact_prefill_tps:.0f} vs {self.prefill_tps:.0f} tok/s "
            f"({self.prefill_cost:+.1%} time) "
            f"({self.rounds} rounds): {verdict}"
        )

    def _verify_text(self) -> str:
        if self.verify_s is None or self.exact_verify_s is None:
            return "verify pass not measured, "
        return (
            f"{VERIFY_ROWS}-token verify pass {1e3 * self.exact_verify_s:.1f} vs "
            f"{1e3 * self.verify_s:.1f} ms ({self.verify_cost:+.1%}), "
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "exact_step_s": self.exact_step_s,
            "prefill_tps": self.prefill_tps,
            "exact_prefill_tps": self.exact_prefill_tps,
            "rounds": self.rounds,
            "verify_s": self.verify_s,
            "exact_verify_s": self.exact_verify_s,
            "least_costs": None if self.least_costs is None else list(self.least_costs),
            "decode_cost": self.decode_cost,
            "cost": self.cost,
            "default": self.default,
        }

    @staticmethod
    def from_dict(d: object) -> ExactPrice:
        """The price a cache entry or a profile holds; ValueError naming the first field that
        is not a finite number > 0 (``rounds``: an integer >= 0), since a damaged entry read
        as figures divided by zero or by a string far from where it was read."""
        if not isinstance(d, dict):
            raise ValueError("the price of exact numerics is not a JSON object")

        def real(name: str, optional: bool = False) -> float | None:
            x = d.get(name)
            if x is None and optional:  # absent from profiles cached before verify was timed
                return None
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise ValueError(f"{name} is {x!r}, not a number")
            if not (math.isfinite(x) and x > 0):
                raise ValueError(f"{name} is {x!r}, not a finite number > 0")
            return float(x)

        rounds = d.get("rounds")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds is {rounds!r}, not an integer >= 0")
        step, exact_step = real("step_s"), real("exact_step_s")
        prefill, exact_prefill = real("prefill_tps"), real("exact_prefill_tps")
        assert step and exact_step and prefill and exact_prefill  # not optional: never None
        least = d.get("least_costs")
        if least is not None and not (
            isinstance(least, list)
            and len(least) == 3
            and all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                for x in least
            )
        ):
            raise ValueError(f"least_costs is {least!r}, not three finite numbers")
        return ExactPrice(
            step_s=step,
            exact_step_s=exact_step,
            prefill_tps=prefill,
            exact_prefill_tps=exact_prefill,
            rounds=rounds,
            verify_s=real("verify_s", optional=True),
            exact_verify_s=real("exact_verify_s", optional=True),
            least_costs=None
            if least is None
            else (float(least[0]), float(least[1]), float(least[2])),
        )


def price_of(samples: dict[str, list[dict[str, float]]]) -> ExactPrice:
    """The price from the workers' figures, by numerics (pure: tested on fixed figures)."""

    def med(numerics: str, key: str) -> float:
        return float(statistics.median(s[key] for s in samples[numerics]))

    pairs = list(zip(samples["default"], samples["exact"], strict=False))  # by round
    least = (
        min(e["step_s"] / d["step_s"] - 1.0 for d, e in pairs),
        min(e["verify_s"] / d["verify_s"] - 1.0 for d, e in pairs),
        min(d["prefill_tps"] / e["prefill_tps"] - 1.0 for d, e in pairs),
    )

    return ExactPrice(
        step_s=med("default", "step_s"),
        exact_step_s=med("exact", "step_s"),
        prefill_tps=med("default", "prefill_tps"),
        exact_prefill_tps=med("exact", "prefill_tps"),
        rounds=min(len(samples["default"]), len(samples["exact"])),
        verify_s=med("default", "verify_s"),
        exact_verify_s=med("exact", "verify_s"),
        least_costs=least,
    )


def worker(path: str, numerics: str, n_threads: int | None) -> dict[str, float]:
    """In a worker process: one numerics' step, verify-pass and prefill figures."""
    from specdec.models.llamacpp import LlamaCppLM
    from specdec.profiler.passes import profile_context

    lm = LlamaCppLM(
        path, n_ctx=CONTEXT + PREFILL + 8, n_threads=n_threads, exact=numerics == "exact"
    )
    ids = profile_context(lm, CONTEXT + PREFILL)
    lm.extend(ids[:CONTEXT], last_only=True)
    times = []
    for i in range(STEPS + 2):  # two warm-up steps
        t0 = time.perf_counter()
        lm.extend([ids[CONTEXT + i % PREFILL]])
        times.append(time.perf_counter() - t0)
        lm.truncate(CONTEXT)
    verifies = []
    for _ in range(VERIFIES + 1):  # one warm-up pass
        t0 = time.perf_counter()
        lm.extend(ids[CONTEXT : CONTEXT + VERIFY_ROWS])
        verifies.append(time.perf_counter() - t0)
        lm.truncate(CONTEXT)
    prefills = []
    for _ in range(PREFILLS):
        lm.truncate(0)
        t0 = time.perf_counter()
        lm.extend(ids[:PREFILL], last_only=True)
        prefills.append(time.perf_counter() - t0)
    return {
        "step_s": statistics.median(times[2:]),
        "verify_s": statistics.median(verifies[1:]),
        "prefill_tps": PREFILL / statistics.median(prefills),
    }


def run_worker(path: str, numerics: str, n_threads: int | None) -> dict[str, float]:
    # each numerics sets ggml's once-per-process switches itself (exact: the tiled path off on
    # a stock build, the exact build's row-invariant mode on, which keeps the tiled path)
    switches = ("GGML_CPU_TILED_MM", "GGML_CPU_REPACK_ROW_INVARIANT")
    env = {k: v for k, v in os.environ.items() if k not in switches}
    src = str(Path(__file__).resolve().parents[2])  # this checkout's package first
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "specdec.profiler.exact_price", path, numerics]
    cmd.append(str(n_threads or 0))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SpecdecError(f"measuring {numerics} numerics failed: {last}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def unsure(price: ExactPrice) -> bool:
    """Whether more rounds could change the verdict: "not the default" by a margin within
    what process-to-process noise reaches here (pure)."""
    cost = price.clear_cost if price.clear_cost is not None else price.cost
    return not price.default and cost is not None and cost <= UNSURE_COST


def measure_exact_price(
    path: str,
    n_threads: int | None,
    rounds: int = 2,
    max_rounds: int = MAX_ROUNDS,
    worker: Callable[[str, str, int | None], dict[str, float]] | None = None,
) -> ExactPrice:
    """Workers alternating default / exact, then exact / default, ... (``rounds`` each), and
    two rounds more at a time, up to ``max_rounds``, while the verdict is ``unsure``.
    ``worker``: replaces ``run_worker`` (tests)."""
    run = worker or run_worker
    samples: dict[str, list[dict[str, float]]] = {n: [] for n in NUMERICS}
    r = 0
    while True:
        for numerics in NUMERICS if r % 2 == 0 else reversed(NUMERICS):
            samples[numerics].append(run(path, numerics, n_threads))
        r += 1
        if r < rounds:
            continue
        price = price_of(samples)
        if r >= max_rounds or (r % 2 == 0 and not unsure(price)):
            return price


if __name__ == "__main__":  # the worker: PATH NUMERICS THREADS (0: all cores)
    _path, _numerics, _threads = sys.argv[1:4]
    print(json.dumps(worker(_path, _numerics, int(_threads) or None)))
