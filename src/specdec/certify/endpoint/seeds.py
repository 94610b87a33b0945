"""Every random stream of ``certify --endpoint``, made once from the plan's seed: the requests'
seeds (disjoint between the sides), the per-token test's auxiliary uniforms, the pilot's
seeds, the power simulations' generators and the client's retry jitter. Each stream is a
function of the seed and its own labels only, so a resumed run draws the same ones."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

SEED_RANGE = 2**31 - 1  # request seeds are in [0, 2^31 - 1)


@dataclass(frozen=True)
class EndpointSeedPlan:
    base: int

    def greedy_seed(self, prompt_index: int) -> int:
        """The seed of greedy prompt i (the same on both sides)."""
        return self.base + prompt_index

    def request_seeds(self, prompt_index: int, n: int) -> tuple[list[int], list[int]]:
        """n seeds per side for one sampled prompt, disjoint between the sides."""
        rng = np.random.default_rng([self.base, prompt_index])
        seeds = rng.choice(SEED_RANGE, size=2 * n, replace=False)
        return [int(s) for s in seeds[:n]], [int(s) for s in seeds[n:]]

    def pit_uniforms(self, prompt_index: int, sample: int, n: int) -> np.ndarray:
        """The per-token test's auxiliary uniforms [n] of one completion."""
        return np.random.default_rng([self.base, 7, prompt_index, sample]).random(n)

    def pilot_seeds(self, n: int) -> list[int]:
        """n request seeds of the time budget's pilot (never used by the tests)."""
        rng = np.random.default_rng([self.base, 99])
        return [int(x) for x in rng.integers(0, SEED_RANGE, size=n)]

    def sampled_power_rng(self) -> np.random.Generator:
        """The simulations that re-check the sampled statistics' power."""
        return np.random.default_rng(self.base + 12345)

    def pertoken_power_rng(self) -> np.random.Generator:
        """The simulations of the per-token test's power."""
        return np.random.default_rng(self.base + 777)

    def client_rng(self) -> random.Random:
        """The HTTP clients' retry jitter."""
        return random.Random(self.base)
