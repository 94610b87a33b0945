"""How many tokens to draft next round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from specdec.errors import ConfigError


class KPolicy(Protocol):
    """Chooses K for the next round and learns from what happened."""

    def next_k(self) -> int: ...

    def observe(self, k: int, n_accepted: int) -> None: ...


@dataclass
class FixedK:
    """Always draft k tokens (k = 0 is plain decoding)."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ConfigError(f"K must be >= 0, got {self.k}")

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, n_accepted: int) -> None:
        pass


@dataclass
class AdaptiveK:
    """Pick K each round to maximise predicted tokens per unit time.

    Keeps exponentially weighted estimates of the per-position acceptance
    a_i = P(accept i | reached i) and, with the cost model of ``specdec.theory``
    (a round with K drafts costs K * c + verify(K + 1) in target-step units), picks the K in
    0..k_max with the best expected tokens / cost. K = 0 (plain decoding) wins when
    speculation would lose, which is the fallback.
    """

    k_max: int
    c: float  # draft step time / target step time
    verify_cost: list[float] | None = None  # verify(n) / verify(1) for n = 1..k_max+1
    decay: float = 0.9
    prior: float = 0.6
    accept: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ConfigError(f"K must be >= 0, got {self.k_max}")
        if not self.accept:
            self.accept = [self.prior] * self.k_max

    def next_k(self) -> int:
        from specdec.theory import best_k

        return best_k(self.accept, self.c, self.verify_cost, self.k_max)

    def observe(self, k: int, n_accepted: int) -> None:
        # position i (0-based) was reached when i <= n_accepted and i < k
        for i in range(min(k, n_accepted + 1)):
            hit = 1.0 if i < n_accepted else 0.0
            self.accept[i] = self.decay * self.accept[i] + (1 - self.decay) * hit
