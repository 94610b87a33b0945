"""How many tokens to draft next round: fixed, or adapted online from what rounds cost and
how many drafts they accepted (falling back to plain decoding when speculation loses)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specdec.core.result import Round
from specdec.errors import ConfigError
from specdec.theory import Costs, expected_tokens_per_round


class KPolicy(Protocol):
    """Chooses K for the next round and learns from what happened."""

    def next_k(self) -> int: ...

    def observe(self, obs: Round) -> None: ...


@dataclass
class FixedK:
    """Always draft k tokens (k = 0 is plain decoding)."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ConfigError(f"K must be >= 0, got {self.k}")

    def next_k(self) -> int:
        return self.k

    def observe(self, obs: Round) -> None:
        pass


def _ew(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1 - decay) * new


@dataclass
class AdaptiveK:
    """Pick K in 0..k_max each round to maximise expected tokens per second.

    Learned online, with exponential forgetting (``decay``):
      a_i          P(accept draft i | drafts 1..i-1 accepted), per position
      t_draft      seconds per drafted token
      t_verify[n]  seconds of a target pass over n positions (n = K + 1)
      t_other      seconds per round outside draft and verify (sampling, bookkeeping)
    Expected tokens per round come from the positional acceptance (not the constant-rate
    formula). Unmeasured verify sizes are extrapolated linearly from the measured ones, and
    every ``probe_every`` rounds a neighbouring K (or K = 1 when plain decoding is winning) is
    tried so that estimates stay current. K = 0 wins whenever speculation would lose, which is
    the fallback to plain decoding.
    """

    k_max: int
    decay: float = 0.9
    prior_accept: float = 0.7
    probe_every: int = 16
    accept: list[float] = field(default_factory=list)
    t_draft: float | None = None
    t_verify: dict[int, float] = field(default_factory=dict)
    t_other: float | None = None
    rounds: int = 0

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ConfigError(f"K must be >= 0, got {self.k_max}")
        if not 0.0 < self.decay < 1.0:
            raise ConfigError(f"decay must be in (0, 1), got {self.decay}")
        if not self.accept:
            self.accept = [self.prior_accept] * self.k_max

    def verify_time(self, n: int) -> float | None:
        """Measured or linearly extrapolated time of a target pass over n positions."""
        if n in self.t_verify:
            return self.t_verify[n]
        known = sorted(self.t_verify)
        if not known:
            return None
        if len(known) == 1:
            return self.t_verify[known[0]]  # no slope known yet: assume flat (optimistic)
        lo = max((m for m in known if m < n), default=known[0])
        hi = min((m for m in known if m > n), default=known[-1])
        if lo == hi:
            lo, hi = known[-2], known[-1]
        slope = (self.t_verify[hi] - self.t_verify[lo]) / (hi - lo)
        return max(0.0, self.t_verify[lo] + slope * (n - lo))

    def expected_rate(self, k: int) -> float | None:
        """Expected tokens per second with K = k, or None while the costs are unknown."""
        tv = self.verify_time(k + 1)
        if tv is None or (k > 0 and self.t_draft is None):
            return None
        cost = tv + (k * (self.t_draft or 0.0)) + (self.t_other or 0.0)
        return expected_tokens_per_round(self.accept, k) / cost if cost > 0 else None

    def next_k(self) -> int:
        if self.k_max == 0:
            return 0
        if self.rounds < 2:  # measure plain-ish and full-K costs first
            choice = self.k_max if self.rounds == 0 else 1
        else:
            rates = {k: self.expected_rate(k) for k in range(self.k_max + 1)}
            known = {k: r for k, r in rates.items() if r is not None}
            choice = max(known, key=lambda k: (known[k], -k)) if known else self.k_max
            if self.rounds % self.probe_every == 0:
                choice = 1 if choice == 0 else min(self.k_max, choice + 1)
        return choice

    def observe(self, obs: Round) -> None:
        self.rounds += 1
        d = self.decay
        for i in range(min(obs.k, obs.n_accepted + 1)):
            self.accept[i] = _ew(self.accept[i], 1.0 if i < obs.n_accepted else 0.0, d)
        if obs.k > 0:
            self.t_draft = _ew(self.t_draft, obs.t_draft / obs.k, d)
        n = obs.k + 1
        self.t_verify[n] = _ew(self.t_verify.get(n), obs.t_verify, d)
        self.t_other = _ew(self.t_other, max(0.0, obs.t_round - obs.t_draft - obs.t_verify), d)


@dataclass
class ProfileK:
    """Reproducible adaptive K: each round picks the K in 0..k_max that maximises expected
    tokens per second, with the costs taken from a measured profile (``theory.Costs``, e.g.
    cached by ``specdec profile``) and the acceptance by draft position learned from this
    generation's rounds. Nothing depends on live timings, so a fixed seed gives a fixed output
    and a fixed K trace. K = 0 (plain decoding) wins whenever speculation is expected to lose;
    every ``probe_every`` rounds a neighbouring K (K = 1 after plain rounds) is tried so the
    acceptance estimate stays current.

    prior_accept: the acceptance by position before any round (one value, or one per
    position, e.g. from the profile's probe).
    """

    costs: Costs
    k_max: int
    decay: float = 0.9
    prior_accept: float | Sequence[float] = 0.7
    probe_every: int = 16
    accept: list[float] = field(default_factory=list)
    rounds: int = 0
    trace: list[int] = field(default_factory=list)  # the K chosen each round

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ConfigError(f"K must be >= 0, got {self.k_max}")
        if not 0.0 < self.decay < 1.0:
            raise ConfigError(f"decay must be in (0, 1), got {self.decay}")
        if self.probe_every < 1:
            raise ConfigError(f"probe_every must be >= 1, got {self.probe_every}")
        if not self.accept:
            prior = self.prior_accept
            if isinstance(prior, int | float):
                self.accept = [float(prior)] * self.k_max
            else:
                values = [float(a) for a in prior] or [0.7]
                self.accept = [values[min(i, len(values) - 1)] for i in range(self.k_max)]

    def expected_rate(self, k: int) -> float:
        return expected_tokens_per_round(self.accept, k) / self.costs.round_seconds(k)

    def next_k(self) -> int:
        if self.k_max == 0:
            choice = 0
        else:
            rates = [self.expected_rate(k) for k in range(self.k_max + 1)]
            choice = max(range(self.k_max + 1), key=lambda k: (rates[k], -k))
            if self.rounds and self.rounds % self.probe_every == 0:
                choice = 1 if choice == 0 else min(self.k_max, choice + 1)
        self.trace.append(choice)
        return choice

    def observe(self, obs: Round) -> None:
        self.rounds += 1
        for i in range(min(obs.k, obs.n_accepted + 1)):
            self.accept[i] = _ew(self.accept[i], 1.0 if i < obs.n_accepted else 0.0, self.decay)


def capped_adaptive_k(k_max: int, max_new_tokens: int, n_ctx: int) -> AdaptiveK:
    """An ``AdaptiveK`` whose K never exceeds what a round can use (the tokens wanted and the
    context window): its per-round work is O(k_max^2), so an absurd -k must not reach it."""
    return AdaptiveK(k_max=max(0, min(k_max, max_new_tokens, n_ctx)))
