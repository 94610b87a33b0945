"""What exact numerics (``models.exact``) cost on this machine, and whether they are the default.

Exact numerics make speculative output plain decoding's, bit for bit, at a price that depends on
the CPU: llama.cpp's repacked and tiled kernels, which they turn off, are faster on some CPUs
than on others. ``specdec profile`` measures it: short worker processes alternate (ggml reads
GGML_CPU_TILED_MM once per process, so each numerics needs a process of its own), each timing
the target's one-token step after a 100-token context (median of ``STEPS``) and a 128-token
prefill; the decode price is the ratio of the medians over the rounds. Exact numerics become
this machine's default when that price is at most ``DEFAULT_MAX_COST`` (3 % of plain decode
speed); otherwise they are a mode (``--exact``) whose price the profile reports.
"""

from __future__ import annotations

import json
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
PREFILL = 128  # prompt tokens timed per worker
CONTEXT = 100  # context before the timed steps
NUMERICS = ("default", "exact")


@dataclass(frozen=True)
class ExactPrice:
    """Medians over the rounds of each numerics' step (seconds) and prefill (tokens/s)."""

    step_s: float
    exact_step_s: float
    prefill_tps: float
    exact_prefill_tps: float
    rounds: int

    @property
    def decode_cost(self) -> float:
        """How much slower a plain step is under exact numerics (0.05: 5 % slower)."""
        return self.exact_step_s / self.step_s - 1.0

    @property
    def prefill_cost(self) -> float:
        return self.prefill_tps / self.exact_prefill_tps - 1.0

    @property
    def default(self) -> bool:
        """Whether exact numerics are this machine's default (``DEFAULT_MAX_COST``)."""
        return self.decode_cost <= DEFAULT_MAX_COST

    def sentence(self) -> str:
        verdict = (
            "the default here"
            if self.default
            else f"not the default here (more than {DEFAULT_MAX_COST:.0%}); use --exact"
        )
        return (
            f"exact numerics (speculative output = plain decoding, bit for bit): plain step "
            f"{1e3 * self.exact_step_s:.1f} ms vs {1e3 * self.step_s:.1f} ms "
            f"({self.decode_cost:+.1%}), prefill {self.exact_prefill_tps:.0f} vs "
            f"{self.prefill_tps:.0f} tok/s ({self.rounds} rounds): {verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "exact_step_s": self.exact_step_s,
            "prefill_tps": self.prefill_tps,
            "exact_prefill_tps": self.exact_prefill_tps,
            "rounds": self.rounds,
            "decode_cost": self.decode_cost,
            "default": self.default,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ExactPrice:
        keys = ("step_s", "exact_step_s", "prefill_tps", "exact_prefill_tps", "rounds")
        return ExactPrice(**{k: d[k] for k in keys})


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
    )


def worker(path: str, numerics: str, n_threads: int | None) -> dict[str, float]:
    """In a worker process: one numerics' step and prefill figures."""
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
    lm.truncate(0)
    t0 = time.perf_counter()
    lm.extend(ids[:PREFILL], last_only=True)
    prefill = time.perf_counter() - t0
    return {"step_s": statistics.median(times[2:]), "prefill_tps": PREFILL / prefill}


def run_worker(path: str, numerics: str, n_threads: int | None) -> dict[str, float]:
    # each numerics sets ggml's once-per-process switches itself (exact: tiled path off, and
    # the exact build's row-invariant repacked kernels on)
    switches = ("GGML_CPU_TILED_MM", "GGML_CPU_REPACK_ROW_INVARIANT")
    env = {k: v for k, v in os.environ.items() if k not in switches}
    if numerics == "exact":
        env["GGML_CPU_TILED_MM"] = "0"
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
