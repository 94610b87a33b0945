"""How big each level is: ``--quick`` (minutes, a smoke test with low power) or full (the
certificate). Every size is recorded in certificate.json."""

from __future__ import annotations

from dataclasses import dataclass, replace

from specdec.errors import ConfigError
from specdec.util.bounds import check_scale

from .constrained import GRAMMAR_NAMES, ConstrainedConfig
from .mock_level import Level2Config
from .real import Level3Config
from .synthetic import Level1Config

LEVELS = ("1", "2", "3", "probe", "constrained")


@dataclass(frozen=True)
class Plan:
    level1: Level1Config
    level2: Level2Config
    level3: Level3Config
    prompts: int  # prompt texts to load for Level 3 (greedy, probe and sampled use prefixes)
    constrained: ConstrainedConfig  # the constrained level (`--levels constrained`)


def quick_plan() -> Plan:
    """Under 10 minutes on a 2-core CPU: a smoke test (low power; up to 384 PIT values)."""
    return Plan(
        level1=Level1Config(),
        level2=Level2Config(greedy_prompts=4, greedy_ks=(0, 1, 2, 4, 6), sequences=1500),
        level3=Level3Config(
            greedy_prompts=1,
            greedy_max_new_tokens=16,
            probe_prompts=1,
            sampled_prompts=3,
            seeds=4,
            sample_tokens=32,
            plain_seeds=1,
        ),
        prompts=3,  # 1 greedy + 1 probe (disjoint); the per-token test uses the first 3
        constrained=ConstrainedConfig(greedy_prompts=4, sequences=1500),
    )


def full_plan() -> Plan:
    """Hours on a 2-core CPU: per-token test on up to 11,520 PIT values (docs/certify.md;
    the committed certificate uses a one-hour subset of this, stated there)."""
    return Plan(
        level1=Level1Config(
            exact_cases_per_cell=3, mc_vocabs=(32, 256, 2048), mc_trials=40_000, mc_min_count=200
        ),
        level2=Level2Config(greedy_prompts=12, sequences=20_000),
        level3=Level3Config(
            greedy_prompts=48,
            greedy_max_new_tokens=128,
            probe_prompts=8,
            sampled_prompts=20,
            seeds=9,
            sample_tokens=64,
            plain_seeds=4,
            power_trials=300,
        ),
        prompts=56,  # 48 greedy + 8 probe (disjoint); the per-token test uses the first 20
        constrained=ConstrainedConfig(greedy_prompts=8, sequences=20_000),
    )


def make_plan(
    *,
    quick: bool,
    seed: int,
    alpha: float,
    k: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seeds: int | None = None,
    n_prompts: int | None = None,
    max_new_tokens: int | None = None,
    sample_tokens: int | None = None,
    plain_seeds: int | None = None,
    plain_tv_threshold: float | None = None,
    greedy_prompts: int | None = None,
    sampled_prompts: int | None = None,
    scale: float = 1.0,
    grammars: tuple[str, ...] | None = None,
) -> Plan:
    """The quick or full plan with the user's overrides (None keeps the plan's value).
    ``grammars``: the built-in grammars of the constrained level (``--constraint``).

    ``scale`` multiplies every sample size (trials, sequences, seeds); below 1 it is for smoke
    tests only and lowers the power accordingly.
    """
    if not 0.0 < alpha < 0.5:
        raise ConfigError(f"--alpha must be in (0, 0.5), got {alpha}")
    check_scale(scale)  # finite: inf or 1e300 would overflow the sample sizes
    for name, v in (("-k", k), ("--seeds", seeds), ("--n-prompts", n_prompts)):
        if v is not None and v < (0 if name == "-k" else 1):
            raise ConfigError(f"{name} must be >= {0 if name == '-k' else 1}, got {v}")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if sample_tokens is not None and sample_tokens < 1:
        raise ConfigError(f"--sample-tokens must be >= 1, got {sample_tokens}")
    if plain_seeds is not None and plain_seeds < 0:
        raise ConfigError(f"--plain-seeds must be >= 0, got {plain_seeds}")
    if greedy_prompts is not None and greedy_prompts < 0:
        raise ConfigError(f"--greedy-prompts must be >= 0, got {greedy_prompts}")
    if plain_tv_threshold is not None and not 0.0 < plain_tv_threshold < 1.0:
        raise ConfigError(f"--plain-tv-threshold must be in (0, 1), got {plain_tv_threshold}")
    if temperature is not None and temperature <= 0:
        raise ConfigError(
            f"--temperature must be > 0 for the sampled tests (greedy is always run), "
            f"got {temperature}"
        )
    p = quick_plan() if quick else full_plan()

    def sc(n: int, lo: int) -> int:
        return max(lo, round(n * scale))

    l1 = replace(
        p.level1,
        seed=seed,
        alpha=alpha,
        mc_trials=sc(p.level1.mc_trials, 200),
        mc_min_count=min(p.level1.mc_min_count, sc(p.level1.mc_trials, 200) // 4),
    )
    l2 = replace(p.level2, seed=seed, alpha=alpha, sequences=sc(p.level2.sequences, 50))
    lc = replace(
        p.constrained,
        grammars=p.constrained.grammars if grammars is None else check_grammars(grammars),
        seed=seed,
        alpha=alpha,
        sequences=sc(p.constrained.sequences, 50),
    )
    l3 = p.level3
    n_total = p.prompts
    if greedy_prompts is not None:
        l3 = replace(l3, greedy_prompts=greedy_prompts)
        n_total = greedy_prompts + l3.probe_prompts
    if sampled_prompts is not None:
        if sampled_prompts < 1:
            raise ConfigError(f"--sampled-prompts must be >= 1, got {sampled_prompts}")
        l3 = replace(l3, sampled_prompts=sampled_prompts)
        n_total = max(n_total, sampled_prompts)
    if n_prompts is not None:
        # n_prompts prompts in all: the probe takes the last ones when there is room for it
        # apart from the greedy prompts, the per-token test the first ones
        n_total = n_prompts
        l3 = replace(
            l3,
            greedy_prompts=min(l3.greedy_prompts, n_prompts),
            probe_prompts=min(l3.probe_prompts, n_prompts),
            sampled_prompts=min(l3.sampled_prompts, n_prompts),
        )
    l3 = replace(
        l3,
        seed=seed,
        alpha=alpha,
        k=l3.k if k is None else k,
        temperature=l3.temperature if temperature is None else temperature,
        top_k=l3.top_k if top_k is None else top_k,
        top_p=l3.top_p if top_p is None else top_p,
        seeds=seeds if seeds is not None else sc(l3.seeds, 2),
        greedy_max_new_tokens=max_new_tokens or l3.greedy_max_new_tokens,
        sample_tokens=sample_tokens or l3.sample_tokens,
        plain_seeds=l3.plain_seeds if plain_seeds is None else plain_seeds,
        plain_tv_threshold=(
            l3.plain_tv_threshold if plain_tv_threshold is None else plain_tv_threshold
        ),
    )
    l3.sampling  # noqa: B018 - validates temperature / top-k / top-p (ConfigError)
    return Plan(l1, l2, l3, n_total, lc)


def check_grammars(names: tuple[str, ...]) -> tuple[str, ...]:
    """The grammars named (each once, in order), or ConfigError for none or an unknown one."""
    items = tuple(dict.fromkeys(names))
    bad = [x for x in items if x not in GRAMMAR_NAMES]
    if not items or bad:
        raise ConfigError(
            f"--constraint takes a comma-separated subset of {', '.join(GRAMMAR_NAMES)}, got "
            f"{','.join(names)!r}"
        )
    return items


def parse_levels(text: str) -> tuple[str, ...]:
    """'1,2,3' -> ('1', '2', '3'); 'probe' runs only the batch-invariance probe;
    'constrained' the decoding loop under a grammar on mock models."""
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in items if x not in LEVELS]
    if not items or bad:
        raise ConfigError(
            f"--levels takes a comma-separated subset of {', '.join(LEVELS)}, got {text!r}"
        )
    return items
