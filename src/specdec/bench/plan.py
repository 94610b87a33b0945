"""What a bench measures and in which order.

Within one configuration the measurements are interleaved so that slow drift (thermal state,
other processes) hits plain and speculative decoding alike: for each repeat, each prompt and
each mode, plain decoding (K = 0) runs first and then every K of the sweep in an order
shuffled with a seed derived from (seed, prompt, repeat, mode). Every measurement of one
(prompt, repeat) uses the same sampling seed, so plain and speculative runs are seed-paired.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specdec.bench.configs import BenchConfig, default_matrix, quick_matrix
from specdec.core.sampling import SamplingConfig
from specdec.errors import ConfigError
from specdec.prompt_sets import SPEC_BENCH_CATEGORIES, Prompt
from specdec.util.bounds import check_range, check_seed

MODES: dict[str, SamplingConfig] = {
    "greedy": SamplingConfig(temperature=0.0),
    "sampled": SamplingConfig(temperature=1.0),
}
CHAT_CHOICES = ("auto", "on", "off")


MAX_K = 1024  # drafts per round in a sweep
MAX_COUNT = 100_000  # repeats, profiler repeats and sizes
MAX_GENERATIONS = 1_000_000  # per configuration: years of work on any machine


@dataclass(frozen=True)
class BenchPlan:
    """Everything that decides what a bench run measures (the CLI builds one of these)."""

    configs: tuple[BenchConfig, ...] = field(default_factory=lambda: tuple(default_matrix()))
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    modes: tuple[str, ...] = ("greedy",)
    prompt_source: str | None = None  # None: the packaged Spec-Bench set
    categories: tuple[str, ...] | None = SPEC_BENCH_CATEGORIES
    prompts_per_category: int = 1
    max_new_tokens: int = 32
    repeats: int = 1
    seed: int = 0
    chat: str = "auto"  # apply the target's chat template: auto (when it has one) | on | off
    stop_on_eos: bool = True
    # every generation prefills its own prompt, as a user's request does (with reuse, the
    # runs after the first on a prompt would skip the target's prefill and their TTFT and
    # end-to-end time would not compare)
    reuse_prefix: bool = False
    profile_repeats: int = 3
    verify_max: int = 16
    profile_context_tokens: int = 100
    warmup: bool = True
    # load every configuration at once and run, for each repeat and prompt, every
    # configuration's measurements of that prompt before the next prompt, in an order rotated
    # per prompt (the runner module): slow drift then falls on all configurations alike
    interleave: bool = False

    def __post_init__(self) -> None:
        if not self.configs:
            raise ConfigError("no configurations to benchmark")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ConfigError(f"the K sweep needs values >= 1 (K = 0 always runs), got {self.ks}")
        if max(self.ks) > MAX_K:
            raise ConfigError(f"K must be at most {MAX_K} in a sweep, got {max(self.ks)}")
        if len(set(self.ks)) != len(self.ks):
            raise ConfigError(f"duplicate K values in {self.ks}")
        bad = [m for m in self.modes if m not in MODES]
        if not self.modes or bad:
            raise ConfigError(f"modes must be among {', '.join(MODES)}, got {self.modes}")
        for name, value, low in (
            ("max_new_tokens", self.max_new_tokens, 1),
            ("repeats", self.repeats, 1),
            ("profile_repeats", self.profile_repeats, 1),
            ("verify_max", self.verify_max, 1),
            ("profile_context_tokens", self.profile_context_tokens, 1),
            ("prompts_per_category (0 = all)", self.prompts_per_category, 0),
        ):
            if value < low:
                raise ConfigError(f"{name} must be >= {low}, got {value}")
        check_seed(self.seed)
        for name, value in (
            ("repeats", self.repeats),
            ("profile_repeats", self.profile_repeats),
            ("verify_max", self.verify_max),
            ("profile_context_tokens", self.profile_context_tokens),
        ):
            check_range(value, name, 1, MAX_COUNT)
        if self.chat not in CHAT_CHOICES:
            raise ConfigError(f"chat must be one of {', '.join(CHAT_CHOICES)}, got {self.chat!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "configs": [c.to_dict() for c in self.configs],
            "ks": list(self.ks),
            "modes": list(self.modes),
            "prompt_source": self.prompt_source,
            "categories": list(self.categories) if self.categories is not None else None,
            "prompts_per_category": self.prompts_per_category,
            "max_new_tokens": self.max_new_tokens,
            "repeats": self.repeats,
            "seed": self.seed,
            "chat": self.chat,
            "stop_on_eos": self.stop_on_eos,
            "reuse_prefix": self.reuse_prefix,
            "profile_repeats": self.profile_repeats,
            "verify_max": self.verify_max,
            "profile_context_tokens": self.profile_context_tokens,
            "interleave": self.interleave,
        }


def full_plan() -> BenchPlan:
    """The default run: five configurations, K = 1..8, greedy, one prompt from each of the six
    Spec-Bench categories, 32 new tokens, one repeat (sized in benchmarks/studies/README.md,
    "The runs committed here")."""
    return BenchPlan()


def quick_plan() -> BenchPlan:
    """``--quick``: configurations (a) and (b), K in {2, 4}, greedy, one prompt from each of
    three categories, 32 new tokens, one repeat (a few minutes on a 2-core CPU)."""
    return replace(
        BenchPlan(),
        configs=tuple(quick_matrix()),
        ks=(2, 4),
        categories=("mt_bench", "translation", "summarization"),
    )


@dataclass(frozen=True)
class Measurement:
    """One generation to run and record. ``k = 0`` is plain decoding."""

    config: str
    mode: str
    prompt: Prompt
    repeat: int
    k: int
    seed: int

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        return (self.config, self.mode, self.prompt.id, self.repeat, self.k)


def prompt_seed(seed: int, prompt_id: str, repeat: int) -> int:
    """A stable 31-bit seed for one (prompt, repeat) of a bench run (independent of
    PYTHONHASHSEED; its values are those recorded runs used, so it keeps its own scheme beside
    the certificate's ``certify.seeds.derive_seed``)."""
    h = hashlib.blake2b(f"{seed}\x00{prompt_id}\x00{repeat}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF


def config_ks(plan: BenchPlan, config: BenchConfig) -> tuple[int, ...]:
    """The K sweep of one configuration: its own, else the plan's."""
    return config.ks if config.ks is not None else plan.ks


def k_order(
    plan: BenchPlan, prompt_id: str, repeat: int, mode: str, ks: Sequence[int] | None = None
) -> list[int]:
    """[0, then the sweep shuffled with a seed of its own]."""
    ks = list(plan.ks if ks is None else ks)
    random.Random(f"order:{plan.seed}:{prompt_id}:{repeat}:{mode}").shuffle(ks)
    return [0, *ks]


def measurements(
    plan: BenchPlan, config: BenchConfig, prompts: Sequence[Prompt]
) -> list[Measurement]:
    """All measurements of one configuration, in run order (repeat, prompt, mode, K); a plan
    larger than MAX_GENERATIONS is refused before anything is listed."""
    n = plan.repeats * len(prompts) * len(plan.modes) * (len(config_ks(plan, config)) + 1)
    if n > MAX_GENERATIONS:
        raise ConfigError(
            f"{config.label}: the plan asks for {n:,} generations (limit {MAX_GENERATIONS:,}): "
            "lower --repeats, the K sweep or the prompts"
        )
    out = []
    for repeat in range(plan.repeats):
        for prompt in prompts:
            seed = prompt_seed(plan.seed, prompt.id, repeat)
            for mode in plan.modes:
                for k in k_order(plan, prompt.id, repeat, mode, config_ks(plan, config)):
                    out.append(Measurement(config.label, mode, prompt, repeat, k, seed))
    return out
