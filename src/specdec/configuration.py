"""What a generation runs, decided in one place: the target and how to run it, the drafter,
the numerics, and why (``specdec.load``, ``specdec generate``, ``specdec serve`` and
``specdec certify`` all resolve their models here).

``resolve`` turns what a user said (model references, backends, ``auto``, the machine
default, a draft window, exact numerics) into a frozen ``Configuration``; ``specdec.load``
loads it. The choice between drafters is the profiler's (``profiler.auto``): ``auto`` runs
the cached profile's recommendation (profiling first when there is none), and the machine
default (``draft="default"``) runs that recommendation when one is cached, else the
cost-aware suffix drafter on the target's own backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig
from specdec.pairs import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    CostProvider,
    DraftRef,
    ModelOptions,
    draft_label,
    model_refs,
)

if TYPE_CHECKING:
    from specdec.core.model import CausalLM
    from specdec.profiler.auto import AutoChoice
    from specdec.theory import Costs

MACHINE_DEFAULT = "default"  # the draft reference that lets this machine's profile choose
Log = Callable[[str], None]


@dataclass(frozen=True)
class Configuration:
    """A resolved configuration: ``target`` and ``draft`` as ``pairs.load_pair`` takes them
    ("none" for plain decoding), the profile's choice when the profile or the machine
    default decided (its K policy and measured costs), and the words that say what and why."""

    target: ModelConfig
    draft: DraftRef
    draft_window: int | None = None
    choice: AutoChoice | None = None
    how: str = ""  # "auto", "default" (the machine default), or "" (named by the user)
    # where a planned drafter gets the target's costs (None for any other drafter)
    costs: CostProvider | None = field(default=None, compare=False, repr=False)
    # why the target's numerics are not the ones decided (a default exact load refused)
    numerics_note: str = ""

    @property
    def label(self) -> str:
        if self.choice is not None:
            return self.choice.label
        return f"{draft_label(self.draft)} -> {self.target.label()}"

    @property
    def k(self) -> int | None:
        """The K the profile's choice starts with (its cap for a planned drafter; 0 for plain
        decoding); None when the user named the drafter (their -k, or the default K)."""
        if self.choice is None:
            return None
        return self.choice.policy().next_k() if self.choice.speculative else 0

    @property
    def reason(self) -> str:
        return self.choice.reason if self.choice is not None else "as given"


def measured_costs(cfg: ModelConfig, target: CausalLM, log: Log = lambda _: None) -> Costs:
    """The target's costs for a planned drafter: measured once per machine and cached."""
    from specdec.profiler.target_costs import cached_target_costs

    return cached_target_costs(cfg, target, log=log)


def resolve(
    target: str = DEFAULT_TARGET,
    draft: str | None = MACHINE_DEFAULT,
    options: ModelOptions = ModelOptions(),  # noqa: B008 (frozen)
    *,
    auto: bool = False,
    draft_window: int | None = None,
    prompt_tokens: int | None = None,
    new_tokens: int = 128,
    log: Log = lambda _: None,
) -> Configuration:
    """The configuration to load (see ``specdec.load`` for the arguments). ``prompt_tokens``
    and ``new_tokens`` size the request when the profile chooses (a prompt much longer than
    the probe's re-ranks its choices); ``log`` hears about a profile run by ``auto``. What the
    profile decides (the drafter, the target's backend, ``options.exact`` None) is decided
    here and nowhere else."""
    target_backend, exact = options.target_backend, options.exact
    draft_backend, n_ctx, n_threads = options.draft_backend, options.n_ctx, options.n_threads
    if draft_window is not None and (auto or draft == MACHINE_DEFAULT):
        raise ConfigError(
            "a draft window needs a named draft model; the machine default and auto choose "
            "the drafter themselves"
        )
    choice: AutoChoice | None = None
    how = ""
    if auto:
        from specdec.profiler.auto import auto_profile, choose

        result = auto_profile(
            target,
            draft=DEFAULT_DRAFT if draft == MACHINE_DEFAULT else draft,
            target_backend=target_backend,
            draft_backend=draft_backend,
            n_ctx=n_ctx,
            n_threads=n_threads,
            log=log,
        )
        assert result is not None  # only cached_only gives None
        choice = choose(result, prompt_tokens, new_tokens)
        how = "auto"
    elif draft == MACHINE_DEFAULT:
        from specdec.profiler.auto import machine_default

        choice = machine_default(
            target,
            target_backend=target_backend,
            draft_backend=draft_backend,
            n_ctx=n_ctx,
            n_threads=n_threads,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
        )
        how = "default"
    if choice is not None:
        target_backend = choice.target_backend
        draft = choice.draft_ref if choice.speculative else "none"
    if exact is None:  # a full profile's decision for this machine, else decided once here
        if choice is not None and choice.exact is not None:
            exact = choice.exact
        else:
            exact = default_numerics(target, replace(options, target_backend=target_backend), log)
    from specdec.profiler.target_costs import cost_provider

    costs = cost_provider(draft, choice.costs if choice else None, exact=exact, log=log)
    decided = replace(options, target_backend=target_backend, exact=exact)
    draft_ref, target_cfg = model_refs(target, draft, decided)
    return Configuration(target_cfg, draft_ref, draft_window, choice, how, costs)


def default_numerics(target: str, options: ModelOptions, log: Log = lambda _: None) -> bool:
    """Whether a llama.cpp ``target`` runs exact numerics when the user did not say: where
    they cost at most 3 % on this machine, build and model (``profiler.exact_default``:
    measured once, in seconds, and cached; ``log`` hears the decision once). Other backends:
    no (transformers has no such mode; a mock model is exact by construction anyway)."""
    cfg = ModelConfig(target, options.target_backend, n_threads=options.n_threads)
    if cfg.resolved_backend() != "llamacpp":
        return False
    from specdec.hub import resolve as resolve_file
    from specdec.hub.gguf import check_gguf_header, check_metadata
    from specdec.models.llamacpp import check_context
    from specdec.profiler.exact_default import exact_default

    try:
        path = resolve_file(target, fetch=False)
        # a file or a window the load will refuse is refused in its one line, not measured
        header = check_gguf_header(path)
        check_metadata(path, header)
        check_context(path, header, options.n_ctx)
    except (ValueError, OSError):  # a missing or bad file is reported (or fetched) by the load
        return False
    return exact_default(target, str(path), options.n_threads, log=log).exact
