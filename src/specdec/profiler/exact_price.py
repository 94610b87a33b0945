"""What exact numerics (``models.exact``) cost on this machine, and whether they are the default.

Exact numerics make speculative output plain decoding's, bit for bit, at a price that depends on
the CPU: llama.cpp's repacked and tiled kernels, which they turn off, are faster on some CPUs
than on others. ``specdec profile`` measures it: short worker processes alternate (ggml reads
GGML_CPU_TILED_MM once per process, so each numerics needs a process of its own), each timing
the target's one-token step after a 100-token context (median of ``STEPS``), a verify pass of
``VERIFY_ROWS`` tokens there (median of ``VERIFIES``) and a 128-token prefill; each price is
the ratio of the medians over the rounds. Exact numerics become this machine's default when
every one of the three costs at most ``DEFAULT_MAX_COST`` (3 %); otherwise they are a mode
(``--exact``) whose price the profile reports. All three count because they can part: on the
exact build (``make install``) the plain step can cost what the default's does while
verify passes and prefill, whose rows its row-invariant kernels compute one at a time, cost
far more (benchmarks/README.md).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError

DEFAULT_MAX_COST = 0.03  # exact numerics are the default where decode costs at most this more
STEPS = 16  # timed one-token passes per worker
VERIFY_ROWS = 8  # the verify pass timed: a typical speculative round's (K = 7)
VERIFIES = 6  # timed verify passes per worker
PREFILL = 128  # prompt tokens timed per worker
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
    def default(self) -> bool:
        """Whether exact numerics are this machine's default: plain step, verify pass and
        prefill each cost at most ``DEFAULT_MAX_COST``."""
        return self.cost is not None and self.cost <= DEFAULT_MAX_COST

    def sentence(self) -> str:
        verdict = (
            "the default here"
            if self.default
            else f"not the default here (more than {DEFAULT_MAX_COST:.0%}); use --exact"
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
        return ExactPrice(
            step_s=step,
            exact_step_s=exact_step,
            prefill_tps=prefill,
            exact_prefill_tps=exact_prefill,
            rounds=rounds,
            verify_s=real("verify_s", optional=True),
            exact_verify_s=real("exact_verify_s", optional=True),
        )


def price_of(samples: dict[str, list[dict[str, float]]]) -> ExactPrice:
    """The price from the workers' figures, by numerics (pure: tested on fixed figures)."""

    def med(numerics: str, key: str) -> float:
        return float(statistics.median(s[key] for s in samples[numerics]))

    return ExactPrice(
        step_s=med("default", "step_s"),
        exact_step_s=med("exact", "step_s"),
        prefill_tps=med("default", "prefill_tps"),
        exact_prefill_tps=med("exact", "prefill_tps"),
        rounds=min(len(samples["default"]), len(samples["exact"])),
        verify_s=med("default", "verify_s"),
        exact_verify_s=med("exact", "verify_s"),
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
    lm.truncate(0)
    t0 = time.perf_counter()
    lm.extend(ids[:PREFILL], last_only=True)
    prefill = time.perf_counter() - t0
    return {
        "step_s": statistics.median(times[2:]),
        "verify_s": statistics.median(verifies[1:]),
        "prefill_tps": PREFILL / prefill,
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


def measure_exact_price(path: str, n_threads: int | None, rounds: int = 2) -> ExactPrice:
    """Workers alternating default / exact, then exact / default, ... (``rounds`` each)."""
    samples: dict[str, list[dict[str, float]]] = {n: [] for n in NUMERICS}
    for r in range(rounds):
        for numerics in NUMERICS if r % 2 == 0 else reversed(NUMERICS):
            samples[numerics].append(run_worker(path, numerics, n_threads))
    return price_of(samples)


if __name__ == "__main__":  # the worker: PATH NUMERICS THREADS (0: all cores)
    _path, _numerics, _threads = sys.argv[1:4]
    print(json.dumps(worker(_path, _numerics, int(_threads) or None)))
