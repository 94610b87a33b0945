"""The power of ``certify --endpoint`` per request budget, on paper (no server needed): for
P sampled prompts and s requests per prompt and side, the smallest difference each test
finds with 80 % probability at the level of Holm's first step (alpha 0.01 over 5 tests).

- Sampled statistics (any server): the combined chi-square over P prompts; the smallest TV
  on the pooled categories, present in every prompt (``min_detectable_tv_combined`` of
  ``specdec.stats.power``),
  for 4 and for 10 degrees of freedom per prompt (what pooling leaves depends on the data:
  the llama-server certificates under benchmarks/results/engines have 1-4 per prompt, their
  summed dof over the prompts, at 55-120 requests).
- Per-token test (servers with token ids and prompt logprobs, e.g. vLLM): P * s * L tokens
  (L = 8 tokens per request), the simulated smallest per-token TV for the three stated
  shapes (``min_detectable_tv`` of ``specdec.stats.alternatives``, 200 trials).

Requests: 2 P s sampled, plus P s scoring requests with the per-token test.

    .venv/bin/python benchmarks/engines/power_budget.py > benchmarks/results/engines/power-budget.md
"""

from __future__ import annotations

import numpy as np

from specdec.certify.endpoint.pertoken import ALTERNATIVES
from specdec.stats.alternatives import alternatives, common_uniforms, min_detectable_tv
from specdec.stats.power import min_detectable_tv_combined

ALPHA = 0.01
FAMILY = 5
POWER = 0.8
TOKENS = 8
# (16, 2000) was dropped: its per-token simulation needs GBs of memory
PLANS = [(2, 60), (2, 150), (4, 250), (8, 250), (8, 1000)]


def main() -> int:
    level = ALPHA / FAMILY
    alts = {a.name: a for a in alternatives()}
    print(
        "| prompts x requests per side | sampled requests (+ scoring) | sampled statistics: "
        "TV found (dof 4 / 10 per prompt) | per-token tokens | per-token TV found "
        "(" + " / ".join(ALTERNATIVES) + ") |"
    )
    print("|---|---|---|---|---|")
    for p, s in PLANS:
        n_eff = [s / 2] * p
        tv4 = min_detectable_tv_combined(n_eff, 4 * p, level, POWER)
        tv10 = min_detectable_tv_combined(n_eff, 10 * p, level, POWER)
        tokens = p * s * TOKENS
        base = common_uniforms(200, tokens, np.random.default_rng(0))  # [200, tokens]
        per = [min_detectable_tv(alts[a], base, level, POWER) for a in ALTERNATIVES]
        print(
            f"| {p} x {s} | {2 * p * s} (+ {p * s}) | {tv4:.3f} / {tv10:.3f} | {tokens} | "
            + " / ".join(f"{x:.3f}" for x in per)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
